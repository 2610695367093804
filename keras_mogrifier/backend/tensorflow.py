"""TensorFlow implementation of the backend seam (see `__init__.py`).

The only module of keras_mogrifier that imports TensorFlow. Functions are
traced with `tf.function` (XLA when `jit_compile`); the model reads and
assigns its variables inside the trace as it does in eager mode, and a
`GradientTape` watching the chosen variables gives the gradients.
"""

import contextlib
import os

import keras
import numpy as np
import tensorflow as tf

from keras_mogrifier.backend._shared import HostPadding
from keras_mogrifier.backend._shared import all_finite
from keras_mogrifier.backend._shared import check_dataset_on_host  # noqa: F401
from keras_mogrifier.backend._shared import patched


def apply_thread_policy():
    return thread_settings()  # TensorFlow's own pools (docs/scaling.md)


def thread_settings():
    # 0: TensorFlow's default, or what TF_NUM_INTRAOP_THREADS /
    # TF_NUM_INTEROP_THREADS in the environment say (read at its start).
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    intra = intra or os.environ.get("TF_NUM_INTRAOP_THREADS") or "default"
    inter = inter or os.environ.get("TF_NUM_INTEROP_THREADS") or "default"
    return {
        "backend": "tensorflow", "intra_op_threads": intra, "inter_op_threads": inter,
        "description": f"intra-op {intra}, inter-op {inter}",
    }


def compiles_per_shape():
    """`tf.function` traces once per input shape."""
    return True


def default_jit_compile(model, many_steps=True):
    """XLA when every layer allows it, and on CPU only for calls of many steps.

    A call that runs many time steps or segments at a small batch (static
    and dynamic evaluation, the neural cache) is faster with XLA on CPU too:
    graph mode without it pays a fixed cost per small operation, which XLA
    fuses away (2 x 256 RLSTM, batch 1, one core: static scoring 0.33 ->
    0.22 ms/token, dynamic evaluation 6.6 -> 1.9, the neural cache 0.45 ->
    0.19; see docs/results/evaluation-speed.md). Temperature fitting (batched windows) takes
    the same time either way. A call of one step (generation's per-token step) is
    slower with it on CPU (2.4 -> 5.0 ms/token: XLA's fixed cost per call), so
    there XLA is used only with a GPU. Keras's cuDNN LSTM declares itself not
    XLA-compatible (`supports_jit`): then no XLA.
    """
    if not many_steps and not tf.config.list_physical_devices("GPU"):
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


def _loop(body, jit_compile, output=None):
    """`run(carry, constants, *sequences) -> (carry, outputs)` in one trace.

    `body(carry, constants, slices) -> (carry, output)` runs for every
    index of the leading axis of `sequences`, in order, inside one
    `tf.while_loop`; the model's variables are read and
    assigned inside the trace as in eager mode, so each iteration sees what
    the previous one assigned.

    One trace and one input shape for calls of any length: the trace takes
    sequences of any length (the leading axis unknown from the first
    trace on), and the sequences are padded on the host to a capacity (the
    next power of two of the longest call so far) while the loop runs for
    the call's own number of segments, read from a mask (`active`). XLA
    (TensorFlow's CPU compiles the adaptation loop with it) compiles for
    every distinct size it must know: the outputs' buffers therefore have
    the capacity's size, their entries after the call's length are never
    written (stacked as zeros) and are cut off on the host. Before, a
    call of 44 segments after calls of 64 compiled again: 1.8 s for a
    2 × 256 RLSTM's adaptation loop (measured), with no new trace.

    The loop's program holds `body` once: the outputs' dtypes and shapes
    come from a trace that is never run (`output_structure`) of `output`
    (`output(carry, constants, slices) -> output`, as `body`'s; defaults to
    `body`'s second value: a cheaper function that returns the same may be
    given), not from a first iteration peeled off before the loop, which
    XLA compiled as a second copy of the body (TensorFlow's first dynamic
    evaluation of a 2 × 256 Mogrifier RLSTM, 1,500 tokens: 6.0 s then,
    4.5–4.9 s with `body`'s trace, measured).
    """

    def probe(carry, constants, *slices):
        if output is not None:
            return output(carry, constants, list(slices))
        return body(carry, constants, list(slices))[1]

    probe = tf.function(probe, autograph=False)

    def output_structure(carry, constants, sequences):
        """Body's output as symbolic tensors of a trace that never runs."""
        slices = [tf.TensorSpec(s.shape[1:], s.dtype) for s in sequences]
        specs = _specs(carry, False), _specs(constants, False)
        with tf.init_scope():  # traced apart, outside the loop's graph
            concrete = probe.get_concrete_function(*specs, *slices)
        return concrete.structured_outputs

    def run(carry, constants, active, *sequences):
        length = tf.reduce_sum(tf.cast(active, tf.int32))
        structure = output_structure(carry, constants, sequences)
        # As many entries as the padded sequences, a size XLA knows when it
        # compiles (`length` is a value: XLA would compile for each); those
        # after `length` are never written, stacked as zeros, cut off on the host.
        capacity = tf.shape(sequences[0])[0]
        arrays = [
            tf.TensorArray(o.dtype, size=capacity, element_shape=o.shape)
            for o in tf.nest.flatten(structure)
        ]

        def step(k, carry, arrays):
            carry, output = body(carry, constants, [s[k] for s in sequences])
            arrays = [a.write(k, o) for a, o in zip(arrays, tf.nest.flatten(output))]
            return k + 1, carry, arrays

        _, carry, arrays = tf.while_loop(
            lambda k, carry, arrays: k < length, step, (tf.constant(0), carry, arrays)
        )
        return carry, tf.nest.pack_sequence_as(
            structure, [a.stack() for a in arrays]
        )

    function = tf.function(run, jit_compile=bool(jit_compile), reduce_retracing=True)
    padding = HostPadding()

    def call(carry, constants, *sequences):
        length, sequences = padding.pad(sequences)
        if function.experimental_get_tracing_count() == 0:
            # The first trace is for any number of iterations (reduce_retracing
            # would relax the leading axis only at the second length seen).
            function.get_concrete_function(
                _specs(carry, False), _specs(constants, False),
                tf.TensorSpec((None,), tf.bool), *[_specs(s, True) for s in sequences],
            )
        active = np.arange(padding.capacity) < length
        carry, outputs = function(carry, constants, active, *sequences)
        outputs = padding.cut(outputs, length)
        return carry, outputs

    return call


def _specs(structure, any_length):
    """`tf.TensorSpec`s of a structure's tensors (others kept), the leading
    axis unknown with `any_length`."""

    def spec(value):
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            return value
        shape = tf.TensorShape(value.shape)
        if any_length and shape.rank:
            shape = tf.TensorShape([None]).concatenate(shape[1:])
        return tf.TensorSpec(shape, tf.as_dtype(value.dtype))

    return tf.nest.map_structure(spec, structure)


def model_loop(model, fn, jit_compile):
    del model  # variables are read and assigned inside the trace

    def body(carry, constants, slices):
        return fn(carry, constants, *slices)

    return _loop(body, jit_compile)


def model_adaptation_loop(
    model, variables, objective, update, jit_compile, update_rule=None,
    token_losses_objective=False,
):
    del update_rule  # XLA fuses `update` itself
    del token_losses_objective  # XLA differentiates the compiled loop itself
    del model
    raw = [_raw(v) for v in variables]
    # Memory-bound elementwise work over every adapted weight: one XLA
    # cluster, also inside a loop that is not compiled with XLA.
    update = tf.function(update, jit_compile=True)

    def body(carry, constants, slices):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(raw)
            value, aux = objective(*slices)
        gradients = tape.gradient(value, raw)
        gradients = [
            tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for v, g in zip(raw, gradients)
        ]
        new = update([tf.convert_to_tensor(v) for v in raw], gradients, *constants)
        for variable, value in zip(raw, new):
            variable.assign(tf.cast(value, variable.dtype))
        return carry, aux

    def output(carry, constants, slices):
        return objective(*slices)[1]  # the outputs' structure: a forward pass

    run = _loop(body, jit_compile, output=output)

    def adapt(constants, *sequences):
        return run((), constants, *sequences)[1]

    return adapt


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


def optimize_compiled_code(enabled):
    del enabled  # no such setting
    return False


def run_functions_eagerly(enabled):
    tf.config.run_functions_eagerly(enabled)
    return True


def is_concrete(x):
    del x
    return tf.executing_eagerly()

