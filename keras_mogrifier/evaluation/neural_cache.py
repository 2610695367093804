"""The neural cache (Grave et al., 2017): test-time adaptation without updates."""

import math

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.backend import sparse_crossentropy
from keras_mogrifier.evaluation import _dynamic_checks
from keras_mogrifier.evaluation import _recurrent_state
from keras_mogrifier.evaluation._stream_scoring import safe_exp
from keras_mogrifier.evaluation._stream_scoring import progress_verbosity
from keras_mogrifier.evaluation._stream_scoring import SEGMENTS_PER_CALL
from keras_mogrifier.evaluation._stream_scoring import score_stream

DEFAULT_INTERPOLATIONS = (0.05, 0.1, 0.15, 0.2, 0.3)
DEFAULT_FLATNESSES = (0.01, 0.03, 0.1, 0.3, 1.0)


class NeuralCache:
    """Scores a token stream with a continuous cache of its recent hidden states.

    Grave, Joulin and Usunier's neural cache, as Krause et al. (2018, eq. 3)
    write it: the model's next-token distribution is interpolated with a
    distribution over the words that followed the most similar recent
    positions of the stream,

    ```
    p(w | h_t) = (1 − λ) p_model(w | h_t) + λ p_cache(w | h_t)
    p_cache(w | h_t) ∝ Σ_{i < t} 1[x_{i+1} = w] exp(θ h_tᵀ h_i)
    ```

    over the last `cache_size` positions before t, with `h` the vector the
    softmax reads (the last layer's output after any Dual head or projection,
    `LanguageModel.features_and_logits`). Where the cache is still empty,
    `p = p_model`. No weight changes: it is the cheap alternative to dynamic
    evaluation that Krause et al. compare with (their Table 1).

    `evaluate` reads a stream exactly as `DynamicEvaluator.evaluate` does —
    segments of `segment_length` tokens, the recurrent state carried from
    segment to segment and restored afterwards, the same report — with one
    forward pass per segment and the cache term of the whole segment computed
    at once (no Python loop per token); memory holds `cache_size` vectors per
    stream.

    Args:
        model: a built `LanguageModel` (or any model with a
            `features_and_logits(ids)` method returning the softmax's input
            vectors and the logits).
        cache_size: int. Positions the cache remembers (Krause et al. §7.2,
            on text8: 3000, having found that sizes of 2000–4000 made a
            negligible difference). Defaults to `2000`.
        interpolation: float in `[0, 1)`. λ. `0` is static evaluation exactly.
            Defaults to `0.1`.
        flatness: float > 0. θ. Defaults to `0.3`.
        segment_length: int. Tokens scored per forward pass. Defaults to
            `35`.
        jit_compile: bool or `"auto"`. Defaults to `"auto"`.

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.models import LanguageModel
    >>> model = LanguageModel(30, units=8, num_layers=1, batch_size=1)
    >>> model.build((1, None))
    >>> cache = NeuralCache(model, cache_size=50, interpolation=0.2, flatness=0.5)
    >>> text = np.tile(np.arange(12), 10)
    >>> cached = cache.evaluate(text, verbose=0)
    >>> static = NeuralCache(model, interpolation=0.0).evaluate(text, verbose=0)
    >>> cached["loss"] < static["loss"]
    True

    Reference:
        - Grave, Joulin, Usunier, "Improving Neural Language Models with a
          Continuous Cache", ICLR 2017, https://arxiv.org/abs/1612.04426
        - Krause et al., "Dynamic Evaluation of Neural Sequence Models",
          ICML 2018, eq. 3 and Table 1.
    """

    def __init__(
        self,
        model,
        cache_size=2000,
        interpolation=0.1,
        flatness=0.3,
        segment_length=35,
        jit_compile="auto",
    ):
        if not hasattr(model, "features_and_logits"):
            raise ValueError(
                "Expected a `LanguageModel` (a model with a "
                "`features_and_logits` method: the cache stores the vectors "
                f"the softmax reads). Received: {type(model).__name__}"
            )
        if not getattr(model, "built", False):
            raise ValueError(
                "Expected a built (trained) model. Received an unbuilt model: "
                f"{model.name}"
            )
        if jit_compile not in ("auto", True, False):
            raise ValueError(
                "Expected `jit_compile` to be True, False or 'auto'. "
                f"Received: jit_compile={jit_compile!r}"
            )
        self.model = model
        self.cache_size = cache_size
        self.interpolation = interpolation
        self.flatness = flatness
        self.segment_length = segment_length
        self.jit_compile = jit_compile
        self._backend = get_backend_module()
        self._steps = {}

    # === Hyperparameters (validated whenever set) ===

    @property
    def cache_size(self):
        return self._cache_size

    @cache_size.setter
    def cache_size(self, value):
        self._cache_size = _validation.positive_int("cache_size", value)

    @property
    def interpolation(self):
        return self._interpolation

    @interpolation.setter
    def interpolation(self, value):
        self._interpolation = _interpolation(value)

    @property
    def flatness(self):
        return self._flatness

    @flatness.setter
    def flatness(self, value):
        self._flatness = _validation.positive_float("flatness", value)

    @property
    def segment_length(self):
        return self._segment_length

    @segment_length.setter
    def segment_length(self, value):
        self._segment_length = _validation.positive_int("segment_length", value)

    def settings(self):
        return {
            "cache_size": self.cache_size,
            "interpolation": self.interpolation,
            "flatness": self.flatness,
            "segment_length": self.segment_length,
        }

    # === Scoring ===

    def evaluate(
        self,
        x,
        batch_size=None,
        callbacks=None,
        verbose="auto",
        return_token_losses=False,
    ):
        """Scores `x` with the cache; returns the metrics.

        Args:
            x: token ids, a 1-D stream or `(streams, time)` independent
                streams, each with its own cache (the first token of a stream
                is context only).
            batch_size: int or None. Streams scored at once (at most the
                model's state capacity). Defaults to `None` (1).
            callbacks: list of `keras.callbacks.Callback` or None, called as
                in `DynamicEvaluator.evaluate`. Defaults to `None`.
            verbose: `"auto"`, 0, 1 or 2. Progress bar. Defaults to `"auto"`
                (a bar on a terminal, none in a log or a pipe).
            return_token_losses: bool. Also return `token_losses`,
                `(streams, time - 1)`. Defaults to `False`.

        Returns:
            A dict with `loss` (mean nats per token), `perplexity`,
            `bits_per_token` and `num_tokens`, and `token_losses` if asked.
        """
        streams, batch_size, verbose, callbacks = self._check(x, batch_size, verbose, callbacks)
        loop = self._step("cache_loop")
        hyper = ops.convert_to_tensor([self.interpolation, self.flatness], "float32")
        caches = {}

        def start_group(group):
            caches["state"] = self._empty_cache(batch_size)

        def score_segments(x, y, w, group, first):
            caches["state"], losses = loop(
                caches["state"], hyper, ops.convert_to_tensor(x), ops.convert_to_tensor(y),
                ops.convert_to_tensor(w),
            )
            return np.asarray(ops.convert_to_numpy(losses))

        results, token_losses = score_stream(
            self.model, streams, batch_size, self.segment_length, score_segments,
            start_group=start_group, callbacks=callbacks, verbose=verbose,
            settings=self.settings(),
            segments_per_call=1 if callbacks else SEGMENTS_PER_CALL, any_count=True,
        )
        if return_token_losses:
            results["token_losses"] = token_losses
        return results

    def search(
        self,
        x,
        interpolations=DEFAULT_INTERPOLATIONS,
        flatnesses=DEFAULT_FLATNESSES,
        apply=True,
    ):
        """Tunes λ and θ on `x` (a validation slice); returns the best pair.

        The model runs over `x` once; every `(λ, θ)` pair is then scored from
        the stored vectors and model probabilities (the cache term depends on
        θ only, so each θ costs one pass over the stored vectors and every λ
        is free). The best pair is set on the cache when `apply`.

        Args:
            x: 1-D token ids.
            interpolations: sequence of λ in `[0, 1)`.
            flatnesses: sequence of θ > 0.
            apply: bool. Set the best pair. Defaults to `True`.

        Returns:
            A dict with the best `interpolation`, `flatness`, `loss`,
            `perplexity`, the `static_loss` (λ = 0) and `losses`,
            `{(λ, θ): loss}`.
        """
        interpolations = [_interpolation(v) for v in _non_empty("interpolations", interpolations)]
        flatnesses = [
            _validation.positive_float("flatnesses", v) for v in _non_empty("flatnesses", flatnesses)
        ]
        streams, batch_size, _, _ = self._check(x, None, 0, None)
        if streams.shape[0] != 1:
            raise ValueError(
                "Expected `x` to be one stream (1-D) for the search. Received "
                f"{streams.shape[0]} streams"
            )
        forward = self._step("forward_loop")
        stored = []

        def record(x, y, w, group, first):
            _, (features, log_p) = forward(
                (), (), ops.convert_to_tensor(x), ops.convert_to_tensor(y)
            )
            for k in range(x.shape[0]):
                stored.append((features[k], log_p[k], y[k], w[k]))
            return -np.asarray(ops.convert_to_numpy(log_p))

        static, _ = score_stream(
            self.model, streams, batch_size, self.segment_length, record,
            settings=self.settings(), segments_per_call=SEGMENTS_PER_CALL, any_count=True,
        )
        cache_term = self._step("cache_term")
        losses = {}
        for theta in flatnesses:
            state = self._empty_cache(batch_size)
            model_terms, cache_terms, counts = [], [], []
            for features, log_p, y, w in stored:
                log_p_cache, has_cache, state = cache_term(
                    state, features, ops.convert_to_tensor(y), ops.convert_to_tensor(w),
                    ops.convert_to_tensor(theta, "float32"),
                )
                model_terms.append(np.asarray(ops.convert_to_numpy(log_p), "float64"))
                cache_terms.append(
                    np.where(
                        np.asarray(ops.convert_to_numpy(has_cache)),
                        np.asarray(ops.convert_to_numpy(log_p_cache), "float64"),
                        np.nan,
                    )
                )
                counts.append(w)
            log_p_model = np.concatenate(model_terms, axis=1)
            log_p_cache = np.concatenate(cache_terms, axis=1)
            weight = np.concatenate(counts, axis=1)
            for lam in interpolations:
                mixed = np.where(
                    np.isnan(log_p_cache),
                    log_p_model,
                    np.logaddexp(
                        np.log1p(-lam) + log_p_model,
                        (np.log(lam) if lam > 0 else -np.inf)
                        + np.nan_to_num(log_p_cache, nan=-np.inf),
                    ),
                )
                losses[(lam, theta)] = float(-np.sum(mixed * weight) / np.sum(weight))
        best = min(losses, key=losses.get)
        if apply:
            self.interpolation, self.flatness = best
        return {
            "interpolation": best[0],
            "flatness": best[1],
            "loss": losses[best],
            "perplexity": safe_exp(losses[best]),
            "static_loss": static["loss"],
            "losses": losses,
        }

    # === Internals ===

    def _check(self, x, batch_size, verbose, callbacks):
        _dynamic_checks.check_verbose(verbose)
        verbose = progress_verbosity(verbose)
        callbacks = _dynamic_checks.check_callbacks(callbacks)
        batch_size = _validation.optional_positive_int("batch_size", batch_size) or 1
        limit = getattr(self.model, "vocabulary_size", None)
        streams = _dynamic_checks.as_streams(x, "x", limit)
        message = _recurrent_state.batch_size_error(self.model, batch_size, "`batch_size`")
        if message:
            raise ValueError(message)
        return streams, batch_size, verbose, callbacks

    def _empty_cache(self, batch_size):
        width = int(self.model.softmax_width)
        return (
            ops.zeros((batch_size, self.cache_size, width), "float32"),
            ops.zeros((batch_size, self.cache_size), "int32"),
            ops.zeros((batch_size, self.cache_size), "float32"),
        )

    def _step(self, kind):
        jit = self.jit_compile
        if jit == "auto":
            jit = self._backend.default_jit_compile(self.model)
        key = (kind, jit)
        if key in self._steps:
            return self._steps[key]
        model = self.model

        def forward(x, y):
            features, logits = model.features_and_logits(x)
            return ops.cast(features, "float32"), -sparse_crossentropy(y, logits)

        if kind == "forward_loop":
            # `K` segments `(K, batch, n)` in order, the state carried.
            built = self._backend.model_loop(
                model, lambda carry, constants, x, y: (carry, forward(x, y)), jit
            )
        elif kind == "cache_term":
            built = self._backend.function(_cache_term, True)
        else:
            # `K` segments in order: the model's features and probabilities,
            # then the cache's, the cache carried from segment to segment.
            def cache_loop(state, hyper, x, y, w):
                features, log_p = forward(x, y)
                log_p_cache, has_cache, state = _cache_term(state, features, y, w, hyper[1])
                return state, -_mix(log_p, log_p_cache, has_cache, hyper[0])

            built = self._backend.model_loop(model, cache_loop, jit)
        self._steps[key] = built
        return built


def _cache_term(state, features, targets, weights, theta):
    """`log p_cache(target_t)` for every position t of a segment, at once.

    `state = (keys, ids, valid)` holds the last C positions before the
    segment: their vectors `(B, C, d)`, the token that followed each `(B, C)`
    and whether the slot is filled `(B, C)`. Position t of the segment sees
    the C positions before it: the cache slots from t on and the segment's
    own positions before t. Returns `(log p_cache, has_cache, new_state)`,
    `has_cache` False where no position precedes t (then the log is
    meaningless and `p = p_model`).
    """
    keys, ids, valid = state
    cache_size = ops.shape(keys)[1]
    n = ops.shape(features)[1]
    all_keys = ops.concatenate([keys, features], axis=1)  # (B, C + n, d)
    all_ids = ops.concatenate([ids, ops.cast(targets, "int32")], axis=1)
    all_valid = ops.concatenate([valid, ops.cast(weights > 0, "float32")], axis=1)
    scores = theta * ops.einsum("btd,bkd->btk", features, all_keys)  # (B, n, C + n)
    k = ops.arange(cache_size + n)[None, :]
    t = ops.arange(n)[:, None]
    window = ops.logical_and(k >= t, k < t + cache_size)  # the C positions before t
    allowed = ops.logical_and(window[None], all_valid[:, None, :] > 0)
    has_cache = ops.any(allowed, axis=-1)
    masked = ops.where(allowed, scores, ops.full_like(scores, -1e30))
    top = ops.max(masked, axis=-1, keepdims=True)
    exp = ops.where(allowed, ops.exp(masked - top), ops.zeros_like(scores))
    hit = ops.equal(all_ids[:, None, :], ops.cast(targets, "int32")[:, :, None])
    total = ops.sum(exp, axis=-1)
    hits = ops.sum(ops.where(hit, exp, ops.zeros_like(exp)), axis=-1)
    safe_total = ops.where(has_cache, total, ops.ones_like(total))
    log_p_cache = ops.where(
        hits > 0, ops.log(ops.maximum(hits, 1e-38) / safe_total), ops.full_like(hits, -math.inf)
    )
    new_state = (all_keys[:, n:], all_ids[:, n:], all_valid[:, n:])
    return log_p_cache, has_cache, new_state


def _mix(log_p_model, log_p_cache, has_cache, interpolation):
    """`log((1 − λ) p_model + λ p_cache)`, and `log p_model` with no cache."""
    lam = ops.cast(interpolation, "float32")
    log_lam = ops.where(lam > 0, ops.log(ops.maximum(lam, 1e-38)), -math.inf)
    mixed = ops.logaddexp(ops.log1p(-lam) + log_p_model, log_lam + log_p_cache)
    return ops.where(ops.logical_and(has_cache, lam > 0), mixed, log_p_model)


def _interpolation(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(
            f"Expected `interpolation` to be a number in [0, 1). Received: {value!r}"
        )
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(
            "Expected `interpolation` (λ) in [0, 1): λ = 1 would ignore the "
            f"model. Received: interpolation={value}"
        )
    return value


def _non_empty(name, values):
    values = list(values) if isinstance(values, (list, tuple)) else None
    if not values:
        raise ValueError(f"Expected `{name}` to be a non-empty list. Received: {values!r}")
    return values

