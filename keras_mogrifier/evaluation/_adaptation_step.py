"""The compiled steps of dynamic evaluation, and the inputs of its update.

`CompiledSteps` builds (once per model, settings and adapted variables) and
caches the backend-compiled functions that `DynamicEvaluator` runs: the
static forward loop, the gradients and squared-gradient accumulation of the
statistics, and the adaptation loop that scores a run of segments and
updates the adapted variables after each inside one call. `update_inputs`
turns the gradient statistics and the settings into what the update rule
reads (the RMS of every variable and `[η, ε, λ, mean(RMS)]`). This module
is the seam where the speed of the step is changed: the evaluator reaches
it only through `DynamicEvaluator._step` and `_update_inputs`.
"""

import numpy as np
from keras import ops

from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.backend import sparse_crossentropy
from keras_mogrifier.evaluation import update_rules


class CompiledSteps:
    """The compiled functions of one evaluator, built once per model."""

    def __init__(self):
        self._backend = get_backend_module()
        self._built = {}
        self._model = None

    def get(self, model, kind, variables, jit_compile, update_rule, per_stream=None):
        """The compiled function `kind` for `variables`, built once per model.

        - `"forward"`: `(x, y) -> token losses` for one window `(batch,
          time)`, the model in inference mode (its carried state updated);
        - `"forward_loop"`: `((), (), x, y) -> ((), token losses)` for
          `K` segments `(K, batch, n)` in order, the model in inference mode
          (its carried state is updated from segment to segment);
        - `"gradients"`: `(x, y, v) -> (token losses, gradients)`, the
          gradients of `Σ v ⊙ token losses` with respect to `variables`;
        - `"adaptation_loop"`: `((θ_g, RMS, hyperparameters), x, y, v) ->
          token losses` for `K` segments in order: each scored, then
          `variables` updated by the update rule from the gradient of
          `Σ v ⊙ token losses`, inside one compiled call;
        - `"accumulate"`: adds the squared gradients to the accumulators
          (summed over the stream axis of per-stream variables first).
        """
        if self._model is not model:
            self._built = {}
            self._model = model
        backend = self._backend
        jit = jit_compile
        if jit == "auto":
            jit = backend.default_jit_compile(model)
        key = (kind, tuple(id(v) for v in variables), jit, update_rule)
        if key in self._built:
            return self._built[key]
        if kind == "forward":
            overwrite = _returns_fresh_logits(model)
            built = backend.model_function(
                model, lambda x, y: token_losses(model, x, y, overwrite), jit
            )
        elif kind == "forward_loop":

            def forward(carry, constants, x, y):
                return carry, token_losses(model, x, y)

            built = backend.model_loop(model, forward, jit)
        elif kind == "gradients":

            def objective(x, y, v):
                losses = token_losses(model, x, y)
                return ops.sum(losses * v), losses

            built = backend.model_gradients(model, variables, objective, jit)
        elif kind == "adaptation_loop":
            rule = update_rules.get(update_rule)

            def objective(x, y, v):
                losses = token_losses(model, x, y)
                return ops.sum(losses * v), losses

            def update(thetas, gradients, theta_g, rms, hyperparameters):
                return [
                    rule(t, g, tg, r, hyperparameters)
                    for t, g, tg, r in zip(thetas, gradients, theta_g, rms)
                ]

            built = backend.model_adaptation_loop(
                model, variables, objective, update, jit, update_rule=update_rule,
                token_losses_objective=True,
            )
        else:
            flags = tuple(per_stream)

            def accumulate(accumulators, gradients):
                out = []
                for acc, g, ps in zip(accumulators, gradients, flags):
                    g = ops.cast(g, "float32")
                    if ps:
                        g = ops.sum(g, axis=0)
                    out.append(acc + ops.square(g))
                return out

            built = backend.function(accumulate, jit_compile=True)
        self._built[key] = built
        return built


def token_losses(model, x, y, overwrite_logits=False):
    """Sparse cross-entropy of every token, float32, dropout off.

    With `overwrite_logits` (for a model whose call returns a tensor of its
    own: `_returns_fresh_logits`) the backend may write over the logits.
    """
    logits = ops.cast(model(x, training=False), "float32")
    return sparse_crossentropy(y, logits, overwrite_logits=overwrite_logits)


def _returns_fresh_logits(model):
    """Whether `model`'s call returns logits held by nothing else.

    True for the package's `LanguageModel` (its head computes them anew on
    every call); another model's output might be a tensor it keeps, or a
    view of one (its own weight, reshaped), which must not be written over.
    """
    from keras_mogrifier.models.language_model import LanguageModel

    return isinstance(model, LanguageModel)


def update_inputs(variables, statistics, settings):
    """`(rms, hyperparameters)` for the update of `variables`, or a ValueError.

    Args:
        variables: the adapted variables.
        statistics: `(variables, [MS_g])` as the evaluator holds them, or
            `None`.
        settings: the evaluator's `settings()`.
    """
    if update_rules.NEEDS_STATISTICS[settings["update_rule"]]:
        if statistics is None or [
            id(v) for v in statistics[0]
        ] != [id(v) for v in variables]:
            raise ValueError(
                "Expected gradient statistics of the adapted variables "
                f"(update_rule={settings['update_rule']!r} divides by their "
                "RMS): call `collect_gradient_statistics(training_data)` "
                "(or set `gradient_statistics`) before `evaluate`. "
                "Received none."
            )
        return update_terms(statistics[1], settings)
    # The rule reads no statistics: placeholders of the right shapes.
    rms = [ops.zeros(v.shape, "float32") for v in variables]
    hyperparameters = ops.convert_to_tensor(
        [settings["learning_rate"], settings["epsilon"], settings["decay_rate"], 1.0],
        "float32",
    )
    return rms, hyperparameters


def update_terms(mean_squares, settings):
    """The RMS each variable is updated with, and `[η, ε, λ, mean(RMS)]`.

    `mean(RMS)`, the normaliser of the decay, is taken over the gathered
    statistics as they are, leaving out only a tensor whose statistics are
    all zero: no gradient reached it at θ_g, e.g. LoRA's `A` factors while
    their `B` is still zero (counted in, they would shrink the mean, and so
    scale up every tensor's decay, by the share of the variables they hold).
    An element whose statistics are zero — it
    had no gradient in any statistics batch, such as the embedding row of
    a word absent from that data — would otherwise get an unbounded step
    `η · g / ε` and no decay at all: it takes the mean RMS of the
    elements of its tensor that have statistics instead (the normaliser
    itself when no element of the tensor has any), for both the step and
    the decay. Every other element keeps its own RMS, so where statistics
    exist the rule is exactly SPEC §5.
    """
    raw = [np.sqrt(np.asarray(ops.convert_to_numpy(ms), "float64")) for ms in mean_squares]
    live = [r for r in raw if np.any(r > 0)]
    if not live:
        mean_rms = 0.0
    elif settings["normalizer"] == "tensor_mean":
        mean_rms = float(np.mean([r.mean() for r in live]))
    else:
        mean_rms = float(sum(r.sum() for r in live) / sum(r.size for r in live))
    if not mean_rms > 0:
        raise ValueError(
            "Expected gradient statistics with a non-zero mean RMS. "
            "Received all-zero statistics (do the adapted variables "
            "affect the loss?)"
        )
    rms = []
    for r in raw:
        seen = r > 0
        fill = r[seen].mean() if seen.any() else mean_rms
        rms.append(ops.convert_to_tensor(np.where(seen, r, fill).astype("float32")))
    hyperparameters = ops.convert_to_tensor(
        [settings["learning_rate"], settings["epsilon"], settings["decay_rate"], mean_rms],
        "float32",
    )
    return rms, hyperparameters
