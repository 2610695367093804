"""TensorFlow implementation of the backend seam (see `__init__.py`).

The only module of keras_mogrifier that imports TensorFlow. Functions are
traced with `tf.function` (XLA when `jit_compile`); the model reads and
assigns its variables inside the trace as it does in eager mode, and a
`GradientTape` watching the chosen variables gives the gradients.
"""

import contextlib

import keras
import tensorflow as tf


def default_jit_compile(model):
    """XLA when a GPU is visible and every layer allows it.

    On CPU, XLA did not make recurrent models faster on this project's
    machines, and Keras's cuDNN LSTM path declares itself not XLA-compatible.
    """
    if not tf.config.list_physical_devices("GPU"):
        return False
    return all(
        getattr(layer, "supports_jit", True) for layer in model._flatten_layers()
    )


def _raw(variable):
    """The `tf.Variable` behind a Keras variable (what a tape can watch)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def function(fn, jit_compile):
    return tf.function(fn, jit_compile=bool(jit_compile))


def model_function(model, fn, jit_compile):
    del model  # variables are read and assigned inside the trace
    return tf.function(fn, jit_compile=bool(jit_compile))


def model_gradients(model, variables, fn, jit_compile):
    del model
    raw = [_raw(v) for v in variables]

    def step(*args):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(raw)
            objective, aux = fn(*args)
        gradients = tape.gradient(objective, raw)
        return aux, [
            tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for v, g in zip(raw, gradients)
        ]

    return tf.function(step, jit_compile=bool(jit_compile))


def sync_training_state(model):
    del model  # `fit` updates the variables themselves


@contextlib.contextmanager
def data_parallel(devices=None):
    """`tf.distribute.MirroredStrategy` over `devices` (default: all visible).

    Build, compile and fit the model inside. Each replica holds its own copy
    of a non-trainable variable that the model assigns in replica context:
    the carried recurrent state of the streams that replica trains.
    """
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        yield strategy.num_replicas_in_sync
