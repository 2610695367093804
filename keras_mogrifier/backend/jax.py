"""JAX implementation of the backend seam (see `__init__.py`).

The only module of keras_mogrifier that imports JAX. JAX compiles pure
functions, so a function that calls a model is traced with the values of
all of the model's variables as explicit inputs, inside a
`keras.StatelessScope` (the mechanism of `Layer.stateless_call`): the model
reads the traced values, its assignments (the carried recurrent state, seed
generators) are collected and returned, and the host side writes them back
into the variables after each call. Gradients come from `jax.value_and_grad`
with respect to the values of the chosen variables. Everything runs under
`jax.jit`: op-by-op JAX is far slower, so `jit_compile` is always on.
"""

import contextlib
import os

import jax
import keras
import numpy as np

from keras_mogrifier.backend._shared import HostPadding
from keras_mogrifier.backend._shared import all_finite
from keras_mogrifier.backend._shared import check_dataset_on_host  # noqa: F401
from keras_mogrifier.backend._shared import patched
from keras_mogrifier.backend._shared import trainer_variables
from keras_mogrifier.backend._variables import model_state


def apply_thread_policy():
    return thread_settings()  # XLA's own pools (docs/scaling.md)


def usable_cores():
    """The CPU cores this process may run on (its affinity), else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def thread_settings():
    # XLA sizes its CPU thread pool to the cores the process may use; its
    # thread flags (`--xla_cpu_multi_thread_eigen=false`,
    # `intra_op_parallelism_threads=1`) leave that pool as it is (JAX 0.10.2,
    # 2026-12-02: tests/benchmarks/harness_test.py), so the cores are what
    # says how many threads work.
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if "thread" in f or "eigen" in f]
    cores = usable_cores()
    description = f"XLA's default threads, {cores} usable core{'s' if cores != 1 else ''}"
    return {
        "backend": "jax", "xla_thread_flags": flags, "usable_cores": cores,
        "description": description + (f" ({' '.join(flags)})" if flags else ""),
    }


def compiles_per_shape():
    """`jax.jit` compiles once per input shape."""
    return True


def default_jit_compile(model, many_steps=True):
    del model, many_steps
    return True


def function(fn, jit_compile):
    del jit_compile
    return jax.jit(fn)


def _stateful(model, traced):
    """Runs `traced(scope_values, *args)` against the model's current values.

    `traced(values, *args) -> (result, new_values)` is a jitted function of
    the values of `model.variables`, with `None` in `new_values` for every
    variable it left alone; afterwards the others are assigned their new
    values.
    """
    variables = model_state(model)

    def run(*args):
        values = [v.value for v in variables]
        result, new_values = traced(values, *args)
        for variable, new in zip(variables, new_values):
            if new is not None:
                variable.assign(new)
        return result

    return run


def _in_scope(variables, values, fn, args):
    """`fn(*args)` with `variables` reading `values`.

    Returns `(result, new_values)`, `new_values[i]` the value `fn` assigned to
    `variables[i]`, or `None` where it assigned none.
    """
    with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
        result = fn(*args)
    new_values = [scope.get_current_value(v) for v in variables]
    return result, [
        None if new is None or new is old else new
        for old, new in zip(values, new_values)
    ]


def model_function(model, fn, jit_compile):
    del jit_compile
    variables = model_state(model)

    @jax.jit
    def traced(values, *args):
        return _in_scope(variables, values, fn, args)

    return _stateful(model, traced)


def model_gradients(model, variables, fn, jit_compile):
    del jit_compile
    all_variables = model_state(model)
    index = {id(v): i for i, v in enumerate(all_variables)}
    missing = [v.path for v in variables if id(v) not in index]
    if missing:
        raise ValueError(
            "Expected the variables to differentiate to belong to the model. "
            f"Received variables outside it: {missing}"
        )
    positions = [index[id(v)] for v in variables]

    def objective(chosen, values, args):
        values = list(values)
        for position, value in zip(positions, chosen):
            values[position] = value
        (value, aux), new_values = _in_scope(all_variables, values, fn, args)
        return value, (aux, new_values)

    @jax.jit
    def traced(values, *args):
        chosen = [values[p] for p in positions]
        (_, (aux, new_values)), gradients = jax.value_and_grad(
            objective, has_aux=True
        )(chosen, values, args)
        # The chosen variables keep their values (the caller updates them).
        for p in positions:
            new_values[p] = None
        return (aux, gradients), new_values

    return _stateful(model, traced)


def _loop(model, body):
    """Runs `body(values, carry, constants, slices) -> (new_values, carry, output)`.

    Returns `run(carry, constants, *sequences) -> (carry, outputs)`: one
    jitted loop over the leading axis of `sequences`. `new_values[i]` is
    the value the step assigned to the model's variable `i`, or `None`; only
    the variables a step assigns (the carried state, adapted weights)
    travel in the loop's carry — found by tracing one step abstractly — and
    the others are read as constants, so no iteration copies them. The
    assigned values are written back into the variables afterwards.

    Compiled once for calls of any length: the sequences are padded along
    the leading axis to a capacity (the next power of two of the longest
    call so far) and the loop runs for the call's own length, a traced
    number — a stream's calls of 64 segments and the one-segment calls of
    its rest run one program, and the padding is never computed on (the
    outputs of padded iterations are zeros, cut off on the host).
    """
    variables = model_state(model)

    @jax.jit
    def traced(values, carry, constants, length, *sequences):
        first = [s[0] for s in sequences]
        probe, _, probe_output = jax.eval_shape(
            lambda v, c: body(v, c, constants, first), values, carry
        )
        assigned = [i for i, new in enumerate(probe) if new is not None]
        capacity = sequences[0].shape[0]

        def step(k, state):
            changing, carry, outputs = state
            current = list(values)
            for i, value in zip(assigned, changing):
                current[i] = value
            slices = [jax.lax.dynamic_index_in_dim(s, k, keepdims=False) for s in sequences]
            new_values, carry, output = body(current, carry, constants, slices)
            outputs = jax.tree.map(
                lambda buffer, o: jax.lax.dynamic_update_index_in_dim(buffer, o, k, 0),
                outputs, output,
            )
            return [new_values[i] for i in assigned], carry, outputs

        outputs = jax.tree.map(
            lambda o: jax.numpy.zeros((capacity,) + tuple(o.shape), o.dtype), probe_output
        )
        initial = [values[i] for i in assigned]
        changing, carry, outputs = jax.lax.fori_loop(
            0, length, step, (initial, carry, outputs)
        )
        new_values = [None] * len(values)
        for i, value in zip(assigned, changing):
            new_values[i] = value
        return (carry, outputs), new_values

    padding = HostPadding()

    def run(carry, constants, *sequences):
        length, sequences = padding.pad(sequences)
        values = [v.value for v in variables]
        (carry, outputs), new_values = traced(
            values, carry, constants, np.int32(length), *sequences
        )
        for variable, new in zip(variables, new_values):
            if new is not None:
                variable.assign(new)
        outputs = padding.cut(outputs, length)
        return carry, outputs

    return variables, run


def model_loop(model, fn, jit_compile):
    del jit_compile
    variables = []

    def body(values, carry, constants, slices):
        (carry, output), new_values = _in_scope(
            variables, values, fn, (carry, constants) + tuple(slices)
        )
        return new_values, carry, output

    loop_variables, run = _loop(model, body)
    variables.extend(loop_variables)
    return run


def model_adaptation_loop(
    model, variables, objective, update, jit_compile, update_rule=None,
    token_losses_objective=False,
):
    del update_rule  # XLA fuses `update` itself
    del token_losses_objective  # XLA differentiates the compiled loop itself
    del jit_compile
    all_variables = []
    positions = []

    def body(values, carry, constants, slices):
        chosen = [values[p] for p in positions]

        def value_of(chosen):
            current = list(values)
            for position, value in zip(positions, chosen):
                current[position] = value
            (value, aux), new_values = _in_scope(all_variables, current, objective, slices)
            return value, (aux, new_values)

        (_, (aux, new_values)), gradients = jax.value_and_grad(value_of, has_aux=True)(
            chosen
        )
        new_values = list(new_values)
        updated = update(chosen, gradients, *constants)
        for position, old, new in zip(positions, chosen, updated):
            new_values[position] = new.astype(old.dtype)
        return new_values, carry, aux

    loop_variables, run = _loop(model, body)
    all_variables.extend(loop_variables)
    index = {id(v): i for i, v in enumerate(all_variables)}
    missing = [v.path for v in variables if id(v) not in index]
    if missing:
        raise ValueError(
            "Expected the variables to adapt to belong to the model. "
            f"Received variables outside it: {missing}"
        )
    positions.extend(index[id(v)] for v in variables)

    def adapt(constants, *sequences):
        return run((), constants, *sequences)[1]

    return adapt


def sync_training_state(model):
    """Puts `fit`'s current state back into the variables (a no-op outside it).

    Between steps the JAX trainer keeps the weights, optimizer and metric
    state as arrays of its own and may have detached them from the
    variables; `jax_state_sync` writes them back and makes the next step
    read the variables again, so changes a callback makes are kept.
    """
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


@contextlib.contextmanager
def data_parallel(devices=None):
    """`keras.distribution.DataParallel` over `devices` (default: all).

    The model is one SPMD program over the global batch: every variable is
    replicated and each device computes its shard of the batch, so the
    carried state keeps the layout of the global batch.
    """
    distribution = keras.distribution.DataParallel(devices=devices or jax.devices())
    with distribution.scope():
        yield len(distribution.device_mesh.devices.flatten())


@contextlib.contextmanager
def skip_non_finite_updates(optimizer):
    """`optimizer.stateless_apply` (what the JAX trainer calls) skips non-finite steps.

    A `cond` between the update and the unchanged values, as
    `LossScaleOptimizer.stateless_apply` does: nothing is copied.
    """
    original = optimizer.stateless_apply

    def stateless_apply(optimizer_variables, grads, trainable_variables):
        return keras.ops.cond(
            all_finite(grads),
            lambda: original(optimizer_variables, grads, trainable_variables),
            lambda: (list(trainable_variables), list(optimizer_variables)),
        )

    with patched(optimizer, "stateless_apply", stateless_apply):
        yield


@contextlib.contextmanager
def keep_values_on_error(model):
    """Puts values back into variables the JAX trainer left empty on an error.

    Keras's JAX `fit`, `evaluate` and `predict` take the values out of the
    variables while they run (`_purge_model_variables`) and put the last
    state back at the end; `evaluate` and `predict` do not when they raise,
    and none does when the first step fails. Here the trainer's last state
    is written back if it has one, and a variable still empty gets its
    value from before the body (references, not copies: JAX arrays are
    immutable; one donated to a step that completed is deleted, but then
    the trainer has a later state).
    """
    variables = trainer_variables(model)
    saved = [getattr(v, "_value", None) for v in variables]
    try:
        yield
    except BaseException:
        sync_training_state(model)
        if getattr(model, "_jax_state", None) is not None:
            model._jax_state = None  # written back; not to be applied again
        for variable, value in zip(variables, saved):
            if getattr(variable, "_value", None) is None and value is not None:
                if not value.is_deleted():
                    variable.assign(value)
        raise


def optimize_compiled_code(enabled):
    jax.config.update("jax_disable_most_optimizations", not enabled)
    return True


def run_functions_eagerly(enabled):
    del enabled  # jax_disable_jit compiles each operation alone: slower
    return False


def is_concrete(x):
    return not isinstance(x, jax.core.Tracer)
