"""Monte-Carlo dropout evaluation: probabilities averaged over K dropout passes."""

import math

import keras
import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.evaluation.temperature import DEFAULT_TEMPERATURES
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
    dropout_scale=1.0,
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

    As in lamb (`lamb/evaluation.py` `evaluate_mc_with_arithmetic_mean`),
    only the dropout masks are on: the carried state is never zeroed
    between windows (`drop_state_probability` is a training device, lamb
    `training.py` lines 435-441), and every dropout rate can be scaled by
    `dropout_scale` (lamb's `eval_dropout_multiplier`, applied to every
    rate in `lm.py` `add_dropout_to_feed`, lines 527-549).

    The copy has room for `batch_size × K` state rows, so memory and time
    grow linearly with K; the logits are never formed (the target's
    probability is computed `chunk_size` tokens at a time, see
    `chunked_target_log_softmax`). The model's own softmax temperature,
    tuned for deterministic evaluation, is not applied: pass `temperature`
    (for instance the one `search_mc_dropout_temperature` finds, as lamb
    searches it with the MC method itself) to scale the logits of every
    pass.

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
        dropout_scale: float ≥ 0. Every dropout rate of the model (input,
            cell-output, state, output, Dual, mixture) is multiplied by it
            during the passes; each scaled rate must stay below 1. `0`
            turns dropout off (K identical passes). Defaults to `1.0`.

    Returns:
        A dict with `loss` (mean nats per token), `perplexity`
        (`exp(loss)`), `num_tokens`, `passes`, `temperature` and
        `dropout_scale`.

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
    temperature = _validation.positive_float("temperature", temperature)
    totals, count = _ensemble_losses(
        model, data, passes, batch_size, sequence_length, max_tokens,
        [temperature], chunk_size, seed, jit_compile, dropout_scale,
    )
    loss = float(totals[0]) / count
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "num_tokens": int(round(count)),
        "passes": int(passes),
        "temperature": temperature,
        "dropout_scale": float(dropout_scale),
    }


def search_mc_dropout_temperature(
    model,
    data,
    passes=10,
    batch_size=None,
    sequence_length=35,
    max_tokens=50_000,
    temperatures=DEFAULT_TEMPERATURES,
    chunk_size=DEFAULT_CHUNK_SIZE,
    seed=None,
    jit_compile=False,
    dropout_scale=1.0,
):
    """The softmax temperature that minimises the MC-dropout ensemble's loss.

    lamb tunes the temperature of MC-dropout evaluation with MC dropout
    itself (`lamb/evaluation.py` `evaluate_all`, lines 386-424: the same
    `eval_method`, `num_eval_samples` and `eval_dropout_multiplier` as the
    final evaluation, on about 50k validation tokens,
    `eval_softmax_temperature_estimation_num_tokens`), not with the
    deterministic model: averaging K dropout passes makes a flatter
    distribution than one deterministic pass, so its best τ differs. The
    candidates are lamb's (1.06 down in steps of 0.02 to 0.80; lamb stops
    after two candidates without improvement, here every candidate is
    scored, from one recurrent pass per window). Pass the result to
    `mc_dropout_evaluate(temperature=...)`; the model is not touched.

    Args:
        model, data, passes, batch_size, sequence_length, chunk_size, seed,
            jit_compile, dropout_scale: as in `mc_dropout_evaluate`.
        max_tokens: int or None. Tokens scored (for a 1-D `data`).
            Defaults to `50_000`, lamb's.
        temperatures: sequence of float > 0. The candidates.

    Returns:
        A dict with `temperature` (the best), `loss` (its mean loss in nats)
        and `losses` (`{τ: loss}` for every candidate).

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.models import LanguageModel
    >>> model = LanguageModel(20, units=8, batch_size=2, output_dropout=0.3)
    >>> model.build((2, None))
    >>> best = search_mc_dropout_temperature(
    ...     model, np.arange(60) % 20, passes=2, batch_size=2,
    ...     sequence_length=5, temperatures=(1.0, 0.9))
    >>> best["temperature"] in (1.0, 0.9)
    True

    Reference:
        - [Melis et al., 2020](https://arxiv.org/abs/1909.01792), Mogrifier
          LSTM (deepmind/lamb).
    """
    temperatures = [
        _validation.positive_float("temperatures", t) for t in temperatures
    ]
    if not temperatures:
        raise ValueError("Expected at least one temperature. Received: temperatures=[]")
    if max_tokens is not None:
        max_tokens = _validation.positive_int("max_tokens", max_tokens)
    totals, count = _ensemble_losses(
        model, data, passes, batch_size, sequence_length, max_tokens,
        temperatures, chunk_size, seed, jit_compile, dropout_scale,
    )
    losses = {tau: float(total) / count for tau, total in zip(temperatures, totals)}
    best = min(losses, key=losses.get)
    return {"temperature": best, "loss": losses[best], "losses": losses}


_RATES = (
    "input_dropout", "cell_output_dropout", "state_dropout", "output_dropout",
    "dual_dropout", "dual_embedding_dropout", "dual_hidden_dropout",
)


def scaled_dropout_options(model, dropout_scale):
    """`with_options` overrides that multiply every dropout rate by the scale."""
    dropout_scale = _validation.non_negative_float("dropout_scale", dropout_scale)
    rates = {name: getattr(model, name, None) for name in _RATES}
    if getattr(model, "mixture_of_softmaxes", 0):
        rates["mixture_dropout"] = model.effective_mixture_dropout
    scaled = {
        name: rate * dropout_scale for name, rate in rates.items() if rate is not None
    }
    too_high = {name: rate for name, rate in scaled.items() if rate >= 1.0}
    if too_high:
        raise ValueError(
            "Expected `dropout_scale` to keep every dropout rate below 1. "
            f"Received: dropout_scale={dropout_scale}, which makes "
            + ", ".join(f"{name}={rate:g}" for name, rate in sorted(too_high.items()))
        )
    return scaled


def _ensemble_losses(
    model, data, passes, batch_size, sequence_length, max_tokens,
    temperatures, chunk_size, seed, jit_compile, dropout_scale,
):
    """Σ of the ensemble's token losses at every τ, and the token count."""
    passes = _validation.positive_int("passes", passes)
    chunk_size = _validation.positive_int("chunk_size", chunk_size)
    if not getattr(model, "built", False) or not hasattr(model, "with_options"):
        raise ValueError(
            "Expected a built `LanguageModel` (train it or call "
            f"`model.build((batch, None))` first). Received: {model!r}"
        )
    options = scaled_dropout_options(model, dropout_scale)
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
    options.update(
        samples=passes,
        batch_size=dataset.batch_size,
        # Evaluation: the carried state is never zeroed (lamb drops state in
        # training only, training.py 435-441).
        drop_state_probability=0.0,
        # Features out in training; where width == vocab they cannot be told
        # from logits, and logits that small are cheap anyway.
        softmax_chunk_size=(
            None if model.softmax_width == model.vocabulary_size else chunk_size
        ),
    )
    if seed is not None:
        options["seed"] = seed
    ensemble = model.with_options(**options)
    scorer = _MonteCarloScorer(ensemble, tuple(temperatures), chunk_size)
    scorer.compile(jit_compile=jit_compile)
    totals, count = np.zeros(len(temperatures)), 0.0
    with _validation.ids_checked():  # above, once
        for index in range(len(dataset)):
            batch = dataset[index]
            x, y = batch[0], batch[1]
            weight = batch[2] if len(batch) > 2 else np.ones(y.shape, "float32")
            nll = np.asarray(scorer.predict_on_batch({"ids": x, "targets": y}), "float64")
            weight = np.asarray(weight, "float64")[..., None]
            totals += np.sum(np.where(weight != 0, nll * weight, 0.0), axis=(0, 1))
            count += float(np.sum(weight))
    if count == 0:
        raise ValueError(
            "Expected `data` to hold at least one predicted token. Received: "
            f"{dataset.num_tokens if hasattr(dataset, 'num_tokens') else 'no'} tokens"
        )
    return totals, count


class _MonteCarloScorer(keras.Model):
    """Per-token loss of the K-pass dropout ensemble at every τ: `(B, T, τs)`."""

    def __init__(self, ensemble, temperatures, chunk_size):
        super().__init__(name="mc_dropout_scorer")
        self.ensemble = ensemble
        self.temperatures = temperatures
        self.chunk_size = chunk_size

    def call(self, inputs, training=False):
        ids, targets = inputs["ids"], ops.cast(inputs["targets"], "int32")
        if self.ensemble.softmax_chunk_size is None and not getattr(
            self.ensemble, "mixture_of_softmaxes", 0
        ):
            out = self.ensemble(ids, training=True)
            return ops.stack(
                [token_nll(targets, out * tau) for tau in self.temperatures], axis=-1
            )
        if self.ensemble.softmax_chunk_size is None:
            # A mixture's τ acts inside each component: from the features.
            out, _ = self.ensemble(ids, training=True, return_features=True)
        else:
            out = self.ensemble(ids, training=True)
        log_prob = self.ensemble.target_log_probabilities(
            out, targets, self.chunk_size, temperature=list(self.temperatures),
            training=True,
        )  # (..., τs)
        if len(out.shape) == 4:
            passes = ops.cast(ops.shape(log_prob)[1], log_prob.dtype)
            log_prob = ops.logsumexp(log_prob, axis=1) - ops.log(passes)
        return ops.negative(log_prob)
