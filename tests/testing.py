"""Shared test helpers: layer checks (a small `run_layer_test`) and callbacks."""

import numpy as np
import keras


def assert_config_round_trip(layer):
    """from_config(get_config()) rebuilds an equivalent layer."""
    config = layer.get_config()
    revived = layer.__class__.from_config(config)
    assert revived.get_config() == config
    assert set(dir(revived)) == set(dir(layer.__class__.from_config(config)))
    fresh = layer.__class__.from_config(config)
    assert set(dir(fresh)) == set(dir(revived))
    return revived


def assert_saved_model_round_trip(model, inputs, tmp_path, atol=1e-6):
    """Saves to `.keras`, loads without custom_objects, compares outputs."""
    path = str(tmp_path / "model.keras")
    expected = keras.ops.convert_to_numpy(model(inputs))
    model.save(path)
    loaded = keras.saving.load_model(path)
    actual = keras.ops.convert_to_numpy(loaded(inputs))
    np.testing.assert_allclose(actual, expected, atol=atol)
    assert len(loaded.weights) == len(model.weights)
    return loaded


def sequence_model(layer, input_shape, output_units=None):
    """A small functional model around a full-sequence layer."""
    inputs = keras.Input(shape=input_shape)
    outputs = layer(inputs)
    if output_units is not None:
        outputs = keras.layers.Dense(output_units)(outputs)
    return keras.Model(inputs, outputs)


def assert_fits(layer, x, y, jit_compile=None):
    """One short `fit` (XLA by default, see `JIT_COMPILE`): finite loss, weights move."""
    if jit_compile is None:
        jit_compile = JIT_COMPILE
    model = sequence_model(layer, x.shape[1:], y.shape[-1])
    model.compile(optimizer="adam", loss="mse", jit_compile=jit_compile)
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(x, y, epochs=2, batch_size=len(x), verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    after = model.get_weights()
    assert any(not np.allclose(a, b) for a, b in zip(after, before))
    return losses


class RecordWeights(keras.callbacks.Callback):
    """Keeps a NumPy copy of the trainable weights after every batch."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(
            [keras.ops.convert_to_numpy(v) for v in self.model.trainable_variables]
        )


class CaptureVariables(keras.callbacks.Callback):
    """Copies `variables` after every test batch (a dynamic-evaluation segment)."""

    def __init__(self, variables):
        super().__init__()
        self.variables = variables
        self.after_segment = []

    def on_test_batch_end(self, batch, logs=None):
        self.after_segment.append(
            [keras.ops.convert_to_numpy(v).copy() for v in self.variables]
        )


# === Backend-neutral helpers ===
#
# Tests compute their own reference gradients with each backend's autodiff,
# independently of the library's `keras_mogrifier.backend` seam.

BACKEND = keras.backend.backend()


def to_numpy(x):
    """NumPy value of a tensor, variable or array (detached on PyTorch)."""
    if isinstance(x, np.ndarray):
        return x
    return np.asarray(keras.ops.convert_to_numpy(x))


def value_and_gradients(fn, sources, model=None, has_aux=False):
    """`(fn(), [∂fn/∂s for s in sources])`, eagerly, on the active backend.

    `sources` are Keras variables or tensors; `fn` returns a scalar computed
    from them (variables are read inside `fn`; tensors among the sources are
    replaced by differentiable copies, which `fn` receives as its arguments:
    `fn(*tensors)`). With `has_aux`, `fn` returns `(scalar, aux)` and the
    first result is `(value, aux)`, both as NumPy. A source that `fn` does
    not use gets a zero gradient. Pass `model` when `fn` calls a model that
    assigns its own variables (a carried recurrent state): on JAX, where the
    computation is traced as a pure function, those assignments are then
    written back as they would be eagerly.
    """
    variables = [s for s in sources if isinstance(s, keras.Variable)]
    tensors = [s for s in sources if not isinstance(s, keras.Variable)]

    def split(out):
        return out if has_aux else (out, None)

    def result(value, aux, grads):
        value = to_numpy(value)
        if has_aux:
            aux = keras.tree.map_structure(to_numpy, aux)
            return (value, aux), grads
        return value, grads

    if BACKEND == "tensorflow":
        import tensorflow as tf

        tensors = [tf.convert_to_tensor(t) for t in tensors]
        targets = [v.value for v in variables]
        with tf.GradientTape(persistent=True) as tape:
            # Non-trainable variables are not watched automatically.
            for t in tensors + targets:
                tape.watch(t)
            value, aux = split(fn(*tensors))
        grads_v = tape.gradient(value, targets)
        grads_t = tape.gradient(value, tensors) if tensors else []
        grads = _merge(sources, grads_v, grads_t)
        grads = [
            np.zeros(s.shape, "float32") if g is None else to_numpy(tf.convert_to_tensor(g))
            for s, g in zip(sources, grads)
        ]
        return result(value, aux, grads)
    if BACKEND == "jax":
        import jax

        everything = _model_state(model) if model is not None else []
        known = {id(v) for v in everything}
        everything += [v for v in variables if id(v) not in known]
        position = {id(v): i for i, v in enumerate(everything)}

        def pure(var_values, tensor_values, all_values):
            all_values = list(all_values)
            for v, value in zip(variables, var_values):
                all_values[position[id(v)]] = value
            mapping = list(zip(everything, all_values))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                value, aux = split(fn(*tensor_values) if tensor_values else fn())
            new = [scope.get_current_value(v) for v in everything]
            return value, (aux, new)

        tensors = [jax.numpy.asarray(t) for t in tensors]
        values = [v.value for v in variables]
        all_values = [v.value for v in everything]
        (value, (aux, new)), (grads_v, grads_t) = jax.value_and_grad(
            pure, argnums=(0, 1), has_aux=True
        )(values, tensors, all_values)
        if model is not None:
            for v, old, value_new in zip(everything, all_values, new):
                if value_new is not None and value_new is not old and id(v) not in {
                    id(s) for s in variables
                }:
                    v.assign(value_new)
        grads = _merge(sources, grads_v, grads_t)
        return result(value, aux, [to_numpy(g) for g in grads])
    if BACKEND == "torch":
        import torch

        tensors = [
            torch.tensor(to_numpy(t), requires_grad=True) for t in tensors
        ]
        params = [v.value for v in variables]
        flags = [p.requires_grad for p in params]
        for p in params:
            p.requires_grad_(True)
        # With a model, its own assignments wait until the backward pass is
        # done (Keras's stateful LSTM writes its state in place on PyTorch).
        # The scope maps every variable to its current value: an unmapped
        # variable reads as None there (weight regularizers fail on it).
        scope = (
            keras.StatelessScope(
                state_mapping=[(v, v.value) for v in _model_state(model)]
            )
            if model is not None
            else None
        )
        try:
            if scope is not None:
                with scope:
                    value, aux = split(fn(*tensors) if tensors else fn())
            else:
                value, aux = split(fn(*tensors) if tensors else fn())
            grads = torch.autograd.grad(value, params + tensors, allow_unused=True)
        finally:
            for p, flag in zip(params, flags):
                p.requires_grad_(flag)
        if scope is not None:
            for v in _model_state(model):
                new = scope.get_current_value(v)
                if new is not None:
                    v.assign(new.detach())
        grads = _merge(sources, grads[: len(params)], grads[len(params) :])
        grads = [
            np.zeros(tuple(s.shape), "float32") if g is None else to_numpy(g.detach())
            for s, g in zip(sources, grads)
        ]
        return result(value.detach(), aux, grads)
    raise NotImplementedError(BACKEND)


def _model_state(model):
    """The model's variables and its stateful RNNs' (untracked) state variables."""
    everything = list(model.variables)
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.RNN) and layer.stateful and layer.states:
            everything += list(keras.tree.flatten(layer.states))
    return everything


def _merge(sources, grads_v, grads_t):
    grads_v, grads_t = list(grads_v), list(grads_t)
    return [
        grads_v.pop(0) if isinstance(s, keras.Variable) else grads_t.pop(0)
        for s in sources
    ]


def backend_specific(*backends, reason):
    """Marks a test that only means something on `backends`, saying why.

    On another backend the test is skipped with `reason` in the report, so
    nothing is skipped silently.
    """
    import pytest

    return pytest.mark.skipif(
        BACKEND not in backends,
        reason=f"{'/'.join(backends)} only: {reason}",
    )


# === Compiled calls (the analogue of `tf.function`) ===

# `model.compile(jit_compile=JIT_COMPILE)` in tests of the compiled train
# step: XLA on TensorFlow and JAX. On PyTorch `jit_compile=True` means
# `torch.compile`, which takes 10 to 45 s per small recurrent model on CPU
# (it unrolls the time loop), too slow for the unit tests; "auto" runs the
# step eagerly there.
JIT_COMPILE = "auto" if BACKEND == "torch" else True


def jit(fn):
    """`fn`, a pure function of tensors, compiled as `jit_compile=True` would.

    TensorFlow: `tf.function(jit_compile=True)` (XLA); JAX: `jax.jit`. On
    PyTorch `fn` runs eagerly: there Keras only traces when a model is
    compiled with `jit_compile=True` (`torch.compile`), which takes many
    seconds per function (too slow for unit tests) and graph-breaks around
    what it cannot trace, running that part eagerly anyway. Tests of
    `torch.compile` itself go through `model.compile(jit_compile=True)`.
    Calls of layers that hold random state (dropout) use `jit_layer_call`.
    """
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def jit_layer_call(layer):
    """`run(x, training) -> layer(x, training=training)`, compiled like `jit`.

    The layer may hold random state (a `SeedGenerator` for dropout) that
    advances at every call. On JAX the call is a jitted `stateless_call`
    (`training` static) whose new non-trainable state, the seeds included,
    is written back after each call, as Keras's trainers do.
    """
    if BACKEND == "jax":
        import jax

        def stateless(trainable, non_trainable, x, training):
            return layer.stateless_call(
                trainable, non_trainable, x, training=training
            )

        compiled = jax.jit(stateless, static_argnums=3)

        def run(x, training):
            outputs, non_trainable = compiled(
                [v.value for v in layer.trainable_variables],
                [v.value for v in layer.non_trainable_variables],
                x,
                bool(training),
            )
            for variable, value in zip(layer.non_trainable_variables, non_trainable):
                variable.assign(value)
            return outputs

        return run
    return jit(lambda x, training: layer(x, training=training))


def value_and_grad_fn(fn, has_aux=False):
    """`g(*args) -> (fn(*args), [∂fn/∂arg])`, traceable: usable inside `jit`.

    Unlike `value_and_gradients`, `g` returns tensors, not NumPy, and
    differentiates with respect to all of its (tensor) arguments. With
    `has_aux`, `fn` returns `(scalar, aux)` and so does `g`'s first result.
    """
    def split(out):
        return out[0] if has_aux else out

    if BACKEND == "tensorflow":
        import tensorflow as tf

        def g(*args):
            args = [tf.convert_to_tensor(a) for a in args]
            with tf.GradientTape() as tape:
                for a in args:
                    tape.watch(a)
                out = fn(*args)
            return out, tape.gradient(split(out), args)

        return g
    if BACKEND == "jax":
        import jax

        def g(*args):
            argnums = tuple(range(len(args)))
            out, grads = jax.value_and_grad(fn, argnums, has_aux=has_aux)(*args)
            return out, list(grads)

        return g
    if BACKEND == "torch":
        import torch

        def g(*args):
            args = [
                keras.ops.convert_to_tensor(a).detach().clone().requires_grad_(True)
                for a in args
            ]
            out = fn(*args)
            grads = torch.autograd.grad(split(out), args, allow_unused=True)
            return out, list(grads)

        return g
    raise NotImplementedError(BACKEND)


# === A bad batch, for the divergence tests ===


class Poison(keras.layers.Layer):
    """Multiplies its output by `factor` in training (set by `PoisonCalls`)."""

    def build(self, input_shape):
        # A variable of the model, so that every backend's compiled train
        # step reads its current value (JAX passes the model's state in).
        self.factor = self.add_weight(
            shape=(), initializer="ones", trainable=False, name="factor"
        )

    def call(self, x, training=False):
        if not training:
            return x
        return x * keras.ops.cast(self.factor, x.dtype)


class PoisonCalls(keras.callbacks.Callback):
    """Sets the poison's factor to `value` before the given training calls.

    The call counter lives in this callback, outside the model and the
    optimizer, so restoring a checkpoint does not replay the poison: it
    models a bad batch.
    """

    def __init__(self, layer, calls, value):
        super().__init__()
        self.layer, self.calls, self.value = layer, set(calls), value
        self.count = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.count += 1
        self.model  # on JAX, puts the training state back into the variables
        self.layer.factor.assign(self.value if self.count in self.calls else 1.0)


def load_module(path, name):
    """The Python file at `path` imported as module `name` (registered in
    `sys.modules`, so its dataclasses and pickles resolve): scripts under
    benchmarks/ and scripts/, which are not a package."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class CausalMean(keras.layers.Layer):
    """`h_t` = the mean of the inputs up to `t` of the window: a causal
    layer without carried state (a model of it is scored in windows)."""

    def call(self, x):
        counts = keras.ops.cast(keras.ops.arange(1, keras.ops.shape(x)[1] + 1), x.dtype)
        return keras.ops.cumsum(x, axis=1) / counts[None, :, None]
