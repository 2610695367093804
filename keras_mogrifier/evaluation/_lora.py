"""LoRA factors that dynamic evaluation adapts, and removes afterwards.

`LoraAdapters` enables Keras 3's own LoRA (`layer.enable_lora(rank)`) on
every `Dense`, `EinsumDense` and `Embedding` layer of a model that can take
it, for the duration of an evaluator's call, and removes it afterwards: the
factors are untracked, `lora_enabled`, `lora_rank`, `lora_alpha` and the
base weights' `trainable` flags are put back, so the model's variables,
their order and their values are exactly what they were. The factors
themselves are kept by the adapters (not by the model) and attached again at
the next call, so the first factor `A` keeps its random initial value and
the gradient statistics stay attached to the same variables. The second
factor `B` starts at zero (Keras's default): with it, the model computes
exactly what it computed before LoRA was enabled.
"""

import contextlib

import keras

# layer class -> (the two factors' attribute names, the base weight's).
_FACTORS = (
    (keras.layers.Embedding, ("lora_embeddings_a", "lora_embeddings_b"), "_embeddings"),
    (keras.layers.Dense, ("lora_kernel_a", "lora_kernel_b"), "_kernel"),
    (keras.layers.EinsumDense, ("lora_kernel_a", "lora_kernel_b"), "_kernel"),
)


def _names(layer):
    for cls, factors, base in _FACTORS:
        if isinstance(layer, cls):
            return factors, base
    return None


def lora_layers(model):
    """The layers of `model` LoRA can be enabled on (built, not quantised,
    without a weight constraint, LoRA not already on), in model order."""
    chosen, seen = [], set()
    layers = model._flatten_layers(include_self=True, recursive=True)
    for layer in layers:
        names = _names(layer)
        if names is None or id(layer) in seen or not layer.built:
            continue
        seen.add(id(layer))
        constraint = getattr(layer, "kernel_constraint", None) or getattr(
            layer, "embeddings_constraint", None
        )
        if constraint or getattr(layer, "quantization_mode", None) or layer.lora_enabled:
            continue
        chosen.append(layer)
    return chosen


def check_lora(rank, alpha):
    """`rank` and `alpha` checked, or a ValueError."""
    for name, value in (("lora_rank", rank), ("lora_alpha", alpha)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(
                f"Expected `{name}` to be a positive integer or None. "
                f"Received: {name}={value!r}"
            )
    if alpha is not None and rank is None:
        raise ValueError(
            f"Expected `lora_rank` with `lora_alpha`. Received: lora_alpha={alpha} "
            "and lora_rank=None"
        )


class LoraAdapters:
    """The LoRA factors of one model, attached while an evaluator runs.

    Args:
        model: the model (its LoRA-capable layers are found when the
            adapters are made: a `ValueError` if it has none).
        rank: int. The factors' rank `r`.
        alpha: int or `None`. LoRA's scale `alpha / r`. Defaults to `r`.
        seed: int. Seed of the first factors' He-uniform initial values
            (layer `i` uses `seed + i`). Defaults to `0`.
    """

    def __init__(self, model, rank, alpha=None, seed=0):
        self.model = model
        self.rank = rank
        self.alpha = alpha
        self.seed = seed
        self.layers = lora_layers(model)
        if not self.layers:
            raise ValueError(
                "Expected a model with layers LoRA can be enabled on "
                "(`Dense`, `EinsumDense` or `Embedding`, built, without a "
                f"constraint or quantisation) for `lora_rank`. Received: "
                f"{type(model).__name__} {model.name!r} without any"
            )
        self._factors = None  # per layer: (A, B)
        self._depth = 0

    def variables(self):
        """The factors, `[A_0, B_0, A_1, B_1, …]` (made at the first attach)."""
        return [v for pair in (self._factors or []) for v in pair]

    @contextlib.contextmanager
    def attached(self):
        """Within the block the model computes with its LoRA factors."""
        saved = []
        try:
            if self._depth == 0:
                for i, layer in enumerate(self.layers):
                    saved.append((layer, self._attach(i, layer)))
                _forget_compiled(self.model)
            self._depth += 1
            yield self.variables()
        finally:
            if saved or self._depth == 0:
                # The outermost block (or a failed attach): detach what was attached.
                self._depth = 0
                for layer, state in saved:
                    self._detach(layer, state)
                _forget_compiled(self.model)
            else:
                self._depth -= 1

    def _attach(self, index, layer):
        factors, base = _names(layer)
        state = (layer.lora_rank, layer.lora_alpha, getattr(layer, base).trainable,
                 layer._tracker.locked)
        if self._factors is None or len(self._factors) <= index:
            layer.enable_lora(
                self.rank,
                lora_alpha=self.alpha,
                a_initializer=keras.initializers.HeUniform(seed=self.seed + index),
            )
            self._factors = (self._factors or []) + [
                tuple(getattr(layer, name) for name in factors)
            ]
        else:
            layer._tracker.unlock()
            for name, variable in zip(factors, self._factors[index]):
                setattr(layer, name, variable)
                layer._post_track_variable(variable)
            getattr(layer, base).trainable = False
            layer.lora_enabled = True
            layer.lora_rank = self.rank
            layer.lora_alpha = self.alpha if self.alpha is not None else self.rank
        if state[3]:
            layer._tracker.lock()
        return state

    def _detach(self, layer, state):
        factors, base = _names(layer)
        rank, alpha, trainable, locked = state
        for name in factors:
            variable = getattr(layer, name)
            layer._untrack_variable(variable)
            _remove_attribute(layer, name)
        getattr(layer, base).trainable = trainable
        layer.lora_enabled = False
        layer.lora_rank = rank
        layer.lora_alpha = alpha
        if locked:
            layer._tracker.lock()
        else:
            layer._tracker.unlock()


def _forget_compiled(model):
    """Drops the model's cached compiled functions (Keras's `predict_function`
    and the like, keras-hub's `generate_function`): traced with other
    variables, TensorFlow's would ignore the factors or miss them."""
    for owner in (model, getattr(model, "wrapped", None)):
        # Not `train_function` / `test_function`: `fit` (with the evaluator
        # as its callback) reads them at every step.
        for name in ("generate_function", "predict_function"):
            if getattr(owner, name, None) is not None:
                setattr(owner, name, None)


def _remove_attribute(layer, name):
    # `Layer.__delattr__` without its `gc.collect()` (the factor lives on
    # in the adapters): the next class's `__delattr__` in the layer's MRO.
    super(keras.Layer, layer).__delattr__(name)
