"""TensorFlow implementation of the backend seam (see `__init__.py`).

The only module of keras_mogrifier that imports TensorFlow. Functions are
traced with `tf.function` (XLA when `jit_compile`); the model reads and
assigns its variables inside the trace as it does in eager mode, and a
`GradientTape` watching the chosen variables gives the gradients.
"""

import contextlib

import keras
import tensorflow as tf

from keras_mogrifier.backend._shared import all_finite
from keras_mogrifier.backend._shared import check_dataset_on_host  # noqa: F401
from keras_mogrifier.backend._shared import patched


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


@contextlib.contextmanager
def skip_non_finite_updates(optimizer):
    """`optimizer.apply` (what `apply_gradients` calls) skips non-finite steps.

    As `LossScaleOptimizer._tf_apply`: under a strategy that needs
    `merge_call` (MirroredStrategy) the condition is taken in cross-replica
    context, where a `cond` may contain the update's own `merge_call`.
    """
    original = optimizer.apply

    def apply(grads, trainable_variables=None):
        grads = list(grads)
        if not optimizer.built and trainable_variables is not None:
            # Outside the `cond`: variables cannot be created in a branch.
            optimizer.build(list(trainable_variables))
        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            keras.ops.cond(
                all_finite(grads),
                lambda: original(grads, trainable_variables),
                lambda: None,
            )
            return

        def cross_replica(distribution, grads, trainable_variables):
            finite = distribution.experimental_local_results(
                distribution.extended.call_for_each_replica(
                    all_finite, args=(grads,)
                )
            )[0]

            def update():
                distribution.extended.call_for_each_replica(
                    original, args=(grads, trainable_variables)
                )

            keras.ops.cond(finite, update, lambda: None)

        tf.distribute.get_replica_context().merge_call(
            cross_replica, args=(grads, trainable_variables)
        )

    with patched(optimizer, "apply", apply):
        yield


@contextlib.contextmanager
def keep_values_on_error(model):
    del model  # the trainer updates the variables in place
    yield


def is_concrete(x):
    del x
    return tf.executing_eagerly()

