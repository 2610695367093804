"""The one seam between the library and a particular Keras backend.

Layers, losses, optimizers, the dynamic-evaluation update rules and the
decoding loop use only `keras.ops`. What cannot be written that way is
compiling a function that calls a model outside `fit` and taking gradients
outside `fit`: TensorFlow traces it with `tf.function` and a
`GradientTape`, JAX needs pure functions of the variables' values
(`jax.jit`, `jax.value_and_grad`), PyTorch runs eagerly with autograd.
Each backend module implements the same functions:

- `default_jit_compile(model, many_steps=True) -> bool`: what
  `jit_compile="auto"` means for a compiled call of many steps (a window,
  a loop of segments) or, with `many_steps=False`, of one step (a token).
- `function(fn, jit_compile)`: compiles `fn`, a pure function of (nested
  lists of) tensors with no model inside, e.g. an update rule.
- `model_function(model, fn, jit_compile)`: compiles `fn(*tensors)`, which
  may call `model` (without gradients); the values that `fn` assigns to the
  model's variables (a carried recurrent state) are kept.
- `model_gradients(model, variables, fn, jit_compile)`: compiles
  `fn(*tensors) -> (objective, aux)` and returns a function
  `(*tensors) -> (aux, gradients)`, the gradients of the scalar objective
  with respect to `variables` (dense, in their shapes, zeros where unused);
  variable assignments inside `fn` are kept, as above.
- `model_loop(model, fn, jit_compile)`: compiles a loop and returns
  `run(carry, constants, *sequences) -> (carry, outputs)`: `fn(carry,
  constants, *slices) -> (carry, output)` runs for every index of the
  sequences' leading axis, in order, in one call (no host round trip
  between iterations); each iteration sees the variable values the
  previous one assigned (the carried state), and `outputs` stacks the
  iterations' outputs. Many segments of a stream per call.
- `model_adaptation_loop(model, variables, objective, update,
  jit_compile, update_rule=None, token_losses_objective=False)`: returns `adapt(constants, *sequences)
  -> outputs`: for every index in order, `objective(*slices) -> (value,
  aux)` and the gradients of `value` with respect to `variables`, then
  `update(values, gradients, *constants) -> new values` assigned to
  `variables`, in one call; `outputs` stacks the `aux` of every index.
  Dynamic evaluation of many segments per call. `update_rule` names the
  rule `update` is, with `constants = (θ_g, RMS, hyperparameters)`: a
  backend may run its own fused form of it (PyTorch: in place,
  `in_place_update`; XLA fuses `update` as it is). With
  `token_losses_objective`, `objective(x, y, v)` is dynamic evaluation's
  own, `(Σ v ⊙ token_losses(model, x, y), token_losses)`: a backend may
  take its gradients its own way (PyTorch: by a hand-written backward
  pass, `adaptation_gradients`).
- `sync_training_state(model)`: makes the model's variables hold the
  current training state inside `fit` (JAX keeps it outside the variables
  between steps), so that a callback can read or change them; the next
  step then starts from the variables.
- `data_parallel(devices=None)`: a context manager under which models are
  built and trained data-parallel over `devices` (all visible devices by
  default) with the engine Keras already has for the backend; it yields the
  number of replicas.
- `skip_non_finite_updates(optimizer)`: a context manager under which a
  training step of `fit` does not apply `optimizer`'s update when a
  gradient is not finite (as `keras.optimizers.LossScaleOptimizer` does),
  inside the compiled step: the weights and every optimizer variable keep
  their values. It patches the method the backend's trainer calls
  (`apply`, or `stateless_apply` on JAX).
- `keep_values_on_error(model)`: a context manager; if its body (a
  Keras `fit`, `evaluate` or `predict`) raises, the variables of the
  model, its optimizer and its metrics hold values afterwards: the last
  state the trainer computed, or their values from before the body where
  it had computed none. (JAX's trainers take the values out of the
  variables while they run; TensorFlow and PyTorch update them in place.)
- `compiles_per_shape() -> bool`: whether a compiled function called with
  tensors of a shape it has not seen traces and compiles anew (TensorFlow,
  JAX) or just runs (PyTorch, eager). Where it compiles, the evaluator pads
  a text's last call to the shape of the others (one program per model);
  where it does not, padding would be work for nothing.
- `is_concrete(x)`: whether `x`, a tensor given to a model call, has a
  value now (eager), rather than being traced.
- `run_functions_eagerly(enabled)`: whether the functions this seam and
  Keras's trainers compile run op by op instead (for tests and debugging);
  returns whether the backend has such a mode. TensorFlow's
  `tf.config.run_functions_eagerly`; JAX and PyTorch return `False` and
  change nothing (PyTorch runs eagerly anyway; JAX's op-by-op mode compiles
  every operation on its own and ran the evaluation tests 1.4× slower than
  compiling them, measured).
- `optimize_compiled_code(enabled)`: whether the compiler optimises the
  programs it compiles from now on (the default) or compiles them quickly
  and runs them slower (for tests of tiny models); returns whether the
  backend has the setting. JAX's `jax_disable_most_optimizations`;
  TensorFlow and PyTorch return `False` and change nothing.
- `apply_thread_policy()`: sets the backend's CPU thread count by the
  library's policy (`apply_thread_policy` below), once, when
  `keras_mogrifier` is imported; returns `thread_settings()`.
- `thread_settings()`: the backend's CPU thread settings now, as a dict
  with a one-line `"description"`.
- `check_dataset_on_host(dataset, check)`: a `tf.data.Dataset` whose
  elements go through `check(index, numpy_element)` on the host before
  they are used (one implementation, `_shared.py`: tf.data is
  TensorFlow's on every backend).

A module may also offer leaner versions of two Keras functions, used when
present (`sparse_crossentropy` and `rnn` below), a leaner time step
for the package's cells (`recurrent_step` below), a leaner tied output
product (`tied_logits` below) and output layer's bias and temperature
(`output_logits` below): PyTorch's does.

`get_backend_module()` returns the module of the active backend; importing
this package imports no backend library.
"""

import importlib

import keras

BACKENDS = ("tensorflow", "jax", "torch")
_MODULES = {}


def get_backend_module():
    """Returns the seam's implementation for the active Keras backend.

    The module is imported on the first call and kept: later calls, which
    may come from inside a function being traced (a model's `__call__` in a
    compiled generation step), make no import, which AutoGraph would try to
    convert (and warn that it cannot).

    Raises:
        ValueError: if the active Keras backend is not one of TensorFlow, JAX
            or PyTorch (e.g. `"numpy"`, which cannot take gradients).
    """
    name = keras.backend.backend()
    module = _MODULES.get(name)
    if module is not None:
        return module
    if name not in BACKENDS:
        raise ValueError(
            "Expected the Keras backend to be one of "
            f"{list(BACKENDS)} (set KERAS_BACKEND before importing keras). "
            f"Received: {name!r}"
        )
    module = _MODULES[name] = importlib.import_module(f"keras_mogrifier.backend.{name}")
    return module


def run_functions_eagerly(enabled):
    """Runs compiled functions op by op (`True`) or compiled (`False`).

    For tests and debugging. On TensorFlow every `tf.function` — this
    package's compiled steps and loops and Keras's `fit`, `evaluate` and
    `predict` steps — then runs eagerly: what it computes is the same, its
    tracing and compiling are skipped (a tiny model's test runs ~3× faster,
    `docs/testing.md`) and Python code inside it runs on every call. JAX and
    PyTorch have no such mode worth having (see the module docstring); the
    call changes nothing there.

    Args:
        enabled: bool.

    Returns:
        Whether the active backend honours the setting.
    """
    return get_backend_module().run_functions_eagerly(bool(enabled))


def optimize_compiled_code(enabled):
    """Optimised compiled programs (`True`, the default) or quick compiles.

    For tests: a test of a tiny model compiles many programs and runs each
    a few times, so compiling dominates; with `False` JAX skips most of
    XLA's optimisation passes (`jax_disable_most_optimizations`) for the
    programs it compiles from now on — the same computation, compiled
    faster, run slower (`docs/testing.md`). TensorFlow and PyTorch have no
    such setting; the call changes nothing there.

    Args:
        enabled: bool.

    Returns:
        Whether the active backend honours the setting.
    """
    return get_backend_module().optimize_compiled_code(bool(enabled))


def apply_thread_policy():
    """Sets the active backend's CPU threads by the library's policy.

    Called once, when `keras_mogrifier` is imported. On a machine whose
    cores other processes also use, PyTorch's default pool (one thread per
    core) spins at every operation's barrier while it waits for a thread
    that another process holds: measured on 2 cores with two busy processes
    beside it, a training step took 3.0× and dynamic evaluation 4.4× its
    quiet time, where one thread took 1.5× and 1.2×
    (`benchmarks/thread_policy.py`, docs/scaling.md). So on PyTorch the
    library runs one intra-op thread unless told otherwise:

    - `KERAS_MOGRIFIER_TORCH_THREADS` unset or `"auto"`: one thread, unless
      `OMP_NUM_THREADS` is set (then PyTorch's reading of it stands);
    - `"torch"`: PyTorch's own default, untouched;
    - a positive integer `N`: `N` threads.

    `torch.set_num_threads(n)` after importing `keras_mogrifier` overrides it
    too: the policy runs once and never again. On a machine of your own with
    idle cores, more threads speed up a large model's training
    (docs/scaling.md gives the quiet cost of one thread). TensorFlow's and
    JAX's thread pools are left as they are: measured the same way, they
    stay within the share of the CPU they lose.

    Returns:
        `thread_settings()` after the policy, or `None` on a backend that
        is not one of TensorFlow, JAX and PyTorch.

    Raises:
        ValueError: `KERAS_MOGRIFIER_TORCH_THREADS` is set to something other
            than `"auto"`, `"torch"` or a positive integer.
    """
    if keras.backend.backend() not in BACKENDS:
        return None
    return get_backend_module().apply_thread_policy()


def thread_settings():
    """The active backend's CPU thread settings now.

    Returns:
        A dict: `"backend"`, the backend's own counts (PyTorch:
        `"intra_op_threads"`, `"interop_threads"`; TensorFlow: its
        configured intra- and inter-op threads, 0 meaning its default; JAX:
        `"usable_cores"`, the cores the process may run on, to which XLA
        sizes its pool, and any thread `XLA_FLAGS`) and a one-line
        `"description"`; `None` on another backend.
    """
    if keras.backend.backend() not in BACKENDS:
        return None
    return get_backend_module().thread_settings()


def _own(name):
    """The backend module's `name`, or `None` (Keras's is used then)."""
    if keras.backend.backend() not in BACKENDS:
        return None
    return getattr(get_backend_module(), name, None)


def compiles_per_shape():
    """Whether the active backend compiles a function anew for new shapes.

    `True` on TensorFlow and JAX (a traced function meets a new input shape
    by tracing and compiling again), `False` on PyTorch, which runs eagerly:
    there the evaluator scores a text's last window at its own length
    instead of padding it to the others' (padding exists only so that one
    compiled program serves every text).
    """
    return get_backend_module().compiles_per_shape()


def sparse_crossentropy(ids, logits, overwrite_logits=False):
    """`-log_softmax(logits)[ids]`, the cross-entropy of every token.

    `ids` int `(...)`, `logits` float `(..., vocab)`; returns a tensor of
    `ids`' shape. Keras's `sparse_categorical_crossentropy` (TensorFlow's
    fused, stable kernel), unless the backend module has its own: PyTorch's
    `cross_entropy` wants the classes on axis 1, so Keras moves a
    `(batch, time, vocab)` tensor to `(batch, vocab, time)` and copies it,
    forward and backward; the module's runs it on a `(tokens, vocab)`
    matrix instead. With `overwrite_logits=True` the caller gives up
    `logits` (a tensor of its own, not read afterwards): PyTorch's then
    writes the log-softmax over them while no gradient is taken (scoring).
    """
    own = _own("sparse_crossentropy")
    if own is not None:
        return own(ids, logits, overwrite_logits)
    return keras.ops.sparse_categorical_crossentropy(ids, logits, from_logits=True)


def tied_logits(features, table):
    """`features · tableᵀ`: the logits of an output layer tied to `table`.

    `features` `(..., width)`, `table` `(vocabulary, width)` of the same
    dtype; returns `(..., vocabulary)`. `keras.ops.matmul(features,
    keras.ops.transpose(table))`, unless the backend module has its own for
    the shape (PyTorch's, for a few rows: see `backend/torch.py`).
    """
    own = _own("tied_logits")
    if own is not None:
        logits = own(features, table)
        if logits is not None:
            return logits
    return keras.ops.matmul(features, keras.ops.transpose(table))


def output_logits(logits, bias, temperature):
    """`float32(logits + bias) · temperature`, an output layer's last steps.

    `logits` `(..., vocabulary)` in the compute dtype, `bias` `(vocabulary,)`
    or `None`, `temperature` a scalar (variable or tensor) or `None`. The
    same operations in the same order on every backend; the backend module's
    own version may write into `logits` (PyTorch's does while no gradient is
    taken: two fewer fresh `(rows, vocabulary)` tensors per scored window,
    see `backend/torch.py`), so pass a tensor of your own.
    """
    own = _own("output_logits")
    if own is not None:
        result = own(logits, bias, temperature)
        if result is not None:
            return result
    if bias is not None:
        logits = logits + keras.ops.cast(bias, logits.dtype)
    logits = keras.ops.cast(logits, "float32")
    if temperature is not None:
        logits = logits * temperature
    return logits


def decoding_step(model):
    """The backend module's own decoding step for `model`, or `None`.

    `generate` reads the known tokens of its prompts and then, at every
    position, one token per row and picks the next. Where the backend
    module offers `decoding_step(model)` and it returns a step
    `(tokens, uniform=None, sampler=None)` — reads `tokens` (int32 host
    array `(b,)`) into the leading `b` rows of the carried state and, given
    a sampler, returns the next ids (int32 `(b,)`) picked from the logits
    with `uniform` (float32 `(b,)`) — that step runs instead of the
    decoder's compiled calls, with the same numbers (PyTorch's, for the
    package's own `LanguageModel`: see `keras_mogrifier/backend/torch.py`).
    On TensorFlow and JAX the decoding step is traced once and compiled, so
    Keras's operations cost nothing per token: `None`.
    """
    own = _own("decoding_step")
    if own is None:
        return None
    return own(model)


def rnn(step_function, inputs, initial_states, **kwargs):
    """The time loop of `CellRNN`: Keras's own, or the backend module's.

    Keras's (`keras.src.backend.rnn`, the loop `keras.layers.RNN` runs) is
    `tf.while_loop` on TensorFlow, `jax.lax.scan` on JAX and a Python loop
    on PyTorch, with Keras's masking, `go_backwards`, `unroll` and
    `time_major` (see `keras.layers.RNN`). A backend module may offer a
    leaner loop as `rnn(step_function, inputs, initial_states, **kwargs)`,
    which returns `None` for the arguments it leaves to Keras's (PyTorch's
    runs the unmasked case). Keras's is not exported by Keras 3: the Keras
    range is pinned in pyproject.toml and the import is tested
    (tests/layers/cell_rnn_test.py).
    """
    from keras.src import backend

    own = _own("rnn")
    if own is not None:
        result = own(step_function, inputs, initial_states, **kwargs)
        if result is not None:
            return result
    return backend.rnn(step_function, inputs, initial_states, **kwargs)


def recurrent_step(cell, weights, training, projected):
    """The backend module's own time step for `cell`, or `None`.

    `CellRNN` runs `cell.recurrent_step` (the gate arithmetic in
    `keras.ops`) unless the backend module offers
    `recurrent_step(cell, weights, training, projected)` and it returns a
    step `(x_t, states) -> (h, [h, c])` that computes the same thing
    (PyTorch's, for the LSTM and RLSTM cells with or without mogrifier
    rounds and state dropout, without adaptation: see
    `keras_mogrifier/backend/torch.py`). On TensorFlow and JAX the step is
    traced once into a compiled loop, so `keras.ops` costs nothing per step.
    """
    own = _own("recurrent_step")
    if own is None:
        return None
    return own(cell, weights, training, projected)
