"""Monte-Carlo dropout evaluation: probabilities averaged over K dropout passes."""

import math

import keras
import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.losses.token_nll import token_nll
from keras_mogrifier.models.language_model import DEFAULT_CHUNK_SIZE


def mc_dropout_evaluate(
    model,
    data,
    passes=10,
    batch_size=None,
    sequence_length=35,
    max_tokens=None,
    temperature=1.0,
    chunk_size=DEFAULT_CHUNK_SIZE,
    seed=None,
    jit_compile=False,
):
    """Perplexity of the dropout ensemble: K passes with dropout on.

    Each token's probability is the mean over K passes with dropout active
    (Gal & Ghahramani's Monte-Carlo dropout; the "MC" rows of the Mogrifier
    LSTM paper), and the reported loss is the token-weighted mean of

    `nll_t = −log( (1/K) Σ_k p(w_t | w_<t, M^k) )`,

    the same log-mean-exp as `IWAEDropoutLoss`. Each pass is one dropout
    sample of a copy of the model with `samples=K`: the K copies of every
    stream have their own dropout masks and their own recurrent state,
    carried from window to window, so pass k is one consistent dropout
    network reading the whole stream (masks are drawn per time step, the
    state mask once per window). The trained model is not touched (its
    weights, state and temperature are unchanged).

    The copy has room for `batch_size × K` state rows, so memory and time
    grow linearly with K; the logits are never formed (the target's
    probability is computed `chunk_size` tokens at a time, see
    `chunked_target_log_softmax`). The model's own softmax temperature,
    tuned for deterministic evaluation, is not applied: pass `temperature`
    to scale the logits of every pass.

    Args:
        model: a `LanguageModel` (built, e.g. trained).
        data: 1-D int array (a token stream, cut into `batch_size` streams
            and windows of `sequence_length`, every token scored once) or a
            `StreamDataset`.
        passes: int. K, the number of dropout passes averaged. Defaults to
            `10`.
        batch_size: int or None. Streams scored at once (for a 1-D `data`);
            `None` uses the model's `batch_size` (or 1 when that is unset).
            Defaults to `None`.
        sequence_length: int. Window length for a 1-D `data`. Defaults to
            `35`.
        max_tokens: int or None. Score only the first windows holding at
            most this many tokens (for a 1-D `data`). Defaults to `None`.
        temperature: float. Logits of each pass are multiplied by it.
            Defaults to `1.0`.
        chunk_size: int. Tokens per block of logits. Defaults to `1024`.
        seed: int or None. Seed of the dropout masks of the passes; `None`
            keeps the model's `seed`. Defaults to `None`.
        jit_compile: bool. Compile the scoring step with XLA. Defaults to
            `False`.

    Returns:
        A dict with `loss` (mean nats per token), `perplexity`
        (`exp(loss)`), `num_tokens` and `passes`.

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.models import LanguageModel
    >>> model = LanguageModel(20, units=8, batch_size=2, output_dropout=0.3)
    >>> model.build((2, None))
    >>> result = mc_dropout_evaluate(model, np.arange(60) % 20, passes=3,
    ...                              batch_size=2, sequence_length=5)
    >>> result["num_tokens"], result["passes"]
    (58, 3)

    Reference:
        - Gal, Ghahramani. "Dropout as a Bayesian Approximation", ICML 2016.
        - [Melis et al., 2020](https://arxiv.org/abs/1909.01792), Mogrifier
          LSTM, Table 1 ("MC" rows).
    """
    passes = _validation.positive_int("passes", passes)
    temperature = _validation.positive_float("temperature", temperature)
    chunk_size = _validation.positive_int("chunk_size", chunk_size)
    if not getattr(model, "built", False) or not hasattr(model, "with_options"):
        raise ValueError(
            "Expected a built `LanguageModel` (train it or call "
            f"`model.build((batch, None))` first). Received: {model!r}"
        )
    if isinstance(data, StreamDataset):
        data.check_token_ids(model.vocabulary_size)
        dataset = data
    else:
        ids = _validation.token_ids("data", data, model.vocabulary_size)
        if ids.ndim != 1:
            raise ValueError(
                "Expected `data` to be a 1-D stream of token ids or a "
                f"StreamDataset. Received: an array of shape {ids.shape}"
            )
        dataset = StreamDataset(
            ids,
            batch_size=batch_size or model.batch_size or 1,
            sequence_length=sequence_length,
            drop_remainder=False,
            max_tokens=max_tokens,
        )
    options = {
        "samples": passes,
        "batch_size": dataset.batch_size,
        # Features out in training; where width == vocab they cannot be told
        # from logits, and logits that small are cheap anyway.
        "softmax_chunk_size": (
            None if model.softmax_width == model.vocabulary_size else chunk_size
        ),
    }
    if seed is not None:
        options["seed"] = seed
    ensemble = model.with_options(**options)
    scorer = _MonteCarloScorer(ensemble, temperature, chunk_size)
    scorer.compile(jit_compile=jit_compile)
    total, count = 0.0, 0.0
    with _validation.ids_checked():  # above, once
        for index in range(len(dataset)):
            batch = dataset[index]
            x, y = batch[0], batch[1]
            weight = batch[2] if len(batch) > 2 else np.ones(y.shape, "float32")
            nll = np.asarray(scorer.predict_on_batch({"ids": x, "targets": y}), "float64")
            weight = np.asarray(weight, "float64")
            total += float(np.sum(np.where(weight != 0, nll * weight, 0.0)))
            count += float(np.sum(weight))
    loss = total / count
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "num_tokens": int(round(count)),
        "passes": passes,
    }


class _MonteCarloScorer(keras.Model):
    """Per-token loss of the K-pass dropout ensemble (dropout always on)."""

    def __init__(self, ensemble, temperature, chunk_size):
        super().__init__(name="mc_dropout_scorer")
        self.ensemble = ensemble
        self.temperature = temperature
        self.chunk_size = chunk_size

    def call(self, inputs, training=False):
        ids, targets = inputs["ids"], ops.cast(inputs["targets"], "int32")
        if self.ensemble.softmax_chunk_size is None:
            if not getattr(self.ensemble, "mixture_of_softmaxes", 0):
                out = self.ensemble(ids, training=True)
                return token_nll(targets, out * self.temperature)
            # A mixture's τ acts inside each component: from the features.
            out, _ = self.ensemble(ids, training=True, return_features=True)
        else:
            out = self.ensemble(ids, training=True)
        log_prob = self.ensemble.target_log_probabilities(
            out, targets, self.chunk_size, temperature=self.temperature
        )
        if len(out.shape) == 4:
            passes = ops.cast(ops.shape(log_prob)[1], log_prob.dtype)
            log_prob = ops.logsumexp(log_prob, axis=1) - ops.log(passes)
        return ops.negative(log_prob)
