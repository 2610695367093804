"""Log-probabilities of texts under a stateful language model."""

import math

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.generation import text as text_lib
from keras_mogrifier.generation.decoder import WINDOWS
from keras_mogrifier.generation.decoder import check_model
from keras_mogrifier.generation.decoder import decoder_for


def score(model, texts, *, vocabulary=None, jit_compile="auto"):
    """Total and per-token log-probabilities and perplexity of each text.

    Each text is read from a zero recurrent state, as `model.evaluate` reads
    `x = text[:-1]`, `y = text[1:]`: the first token is context only, every
    other token is scored given all before it, with dropout off and the
    model's softmax temperature. So `-log_probability / num_tokens` is the
    loss `evaluate` reports for that text, and `perplexity` its perplexity.
    (To score the first word of a sentence too, start the text with
    `<eos>`, which precedes every sentence in the corpora.) The text is read
    in windows with the state carried, never all logits at once. The
    model's carried state, weights and temperature are as they were
    afterwards.

    Args:
        model: a built, stateful `LanguageModel`.
        texts: a string, a list of strings (read with the vocabulary), a
            1-D sequence of token ids, or a list / 2-D array of them; each
            of at least 2 tokens.
        vocabulary: a `keras_mogrifier.data.Vocabulary` or `None`. Defaults
            to the model's `vocabulary`.
        jit_compile: bool or `"auto"`. Defaults to `"auto"`.

    Returns:
        For each text (one dict for one text, else a list) a dict with
        `log_probability` (natural log, summed over the scored tokens),
        `num_tokens`, `perplexity` (`exp(-log_probability / num_tokens)`),
        `token_log_probabilities` (float32 array, one per scored token) and,
        with a vocabulary, `tokens` (the scored tokens).
    """
    check_model(model)
    vocabulary = text_lib.resolve_vocabulary(model, vocabulary)
    sequences, single, _ = text_lib.as_sequences(
        texts, vocabulary, model.vocabulary_size, "text", min_tokens=2
    )
    decoder = decoder_for(model, jit_compile)
    results = []
    with decoder.fresh_state():
        for start in range(0, len(sequences), decoder.capacity):
            if start:
                decoder.reset_state()
            group = sequences[start : start + decoder.capacity]
            for ids, log_probs in zip(group, _read_group(decoder, group)):
                total = float(np.sum(log_probs, dtype="float64"))
                result = {
                    "log_probability": total,
                    "num_tokens": int(log_probs.size),
                    "perplexity": _safe_exp(-total / log_probs.size),
                    "token_log_probabilities": log_probs,
                }
                if vocabulary is not None:
                    result["tokens"] = vocabulary.to_tokens(ids[1:])
                results.append(result)
    return results[0] if single else results


def _read_group(decoder, group):
    predicted = max(len(ids) for ids in group) - 1
    # The smallest window that holds a short text, else the longest window.
    window = next((w for w in sorted(WINDOWS) if w >= predicted), max(WINDOWS))
    padded = -(-predicted // window) * window
    inputs = np.zeros((len(group), padded + 1), "int32")
    for row, ids in enumerate(group):
        inputs[row, : len(ids)] = ids
    # The texts' ids were checked (`score`); padding is 0: the windows that
    # `Decoder.read` gets need no second scan.
    _validation.mark_token_ids(inputs, decoder.model.vocabulary_size)
    # Padding comes after each text: it changes nothing before it.
    log_probs = [
        np.asarray(
            ops.convert_to_numpy(
                decoder.read(inputs[:, s : s + window], inputs[:, s + 1 : s + window + 1])
            )
        )
        for s in range(0, padded, window)
    ]
    log_probs = np.concatenate(log_probs, axis=1).astype("float32")
    return [log_probs[row, : len(ids) - 1] for row, ids in enumerate(group)]


def _safe_exp(value):
    try:
        return math.exp(value)
    except OverflowError:
        return float("inf")
