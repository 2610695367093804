"""Text ↔ token ids for generation and scoring, through a `Vocabulary`.

The vocabulary reads and writes text at its own level (`Vocabulary.encode`
and `Vocabulary.decode`): words split on whitespace (or the corpus's
tokenizer), characters, or bytes. Lines are separated by the
end-of-sentence token; in word-level text `<eos>` may also be written out.
Decoding joins words with spaces (`<eos>` stays visible), characters and
bytes with nothing (`<eos>` becomes a newline).
"""

import numbers

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.data.vocabulary import Vocabulary


def level_of(vocabulary):
    """The level of `vocabulary`: `"word"`, `"char"` or `"byte"`."""
    return vocabulary.level


def encode(vocabulary, text, where=None):
    """The int32 ids of `text` (`vocabulary.encode`); unknown tokens become
    `<unk>` or an error.

    Args:
        vocabulary: a `Vocabulary`.
        text: str.
        where: str or `None`. What the text is, for error messages (e.g.
            `"prompt 1"`).
    """
    return vocabulary.encode(text, where=where)


def decode(vocabulary, ids):
    """The text of `ids` (`vocabulary.decode`)."""
    return vocabulary.decode(ids)


def resolve_vocabulary(model, vocabulary):
    """The vocabulary to use: the argument, else the model's, else `None`."""
    if vocabulary is None:
        return getattr(model, "vocabulary", None)
    if not isinstance(vocabulary, Vocabulary):
        raise ValueError(
            "Expected `vocabulary` to be a `keras_mogrifier.data.Vocabulary` "
            f"or None. Received: vocabulary={type(vocabulary).__name__}"
        )
    size = getattr(model, "vocabulary_size", None)
    if size is not None and len(vocabulary) != size:
        raise ValueError(
            f"Expected a vocabulary of the model's {size} tokens. Received: "
            f"a vocabulary of {len(vocabulary)} tokens"
        )
    return vocabulary


def as_sequences(texts, vocabulary, vocabulary_size, name, min_tokens):
    """`texts` as a list of int32 id arrays, and how to give results back.

    `texts` is a string, a list of strings, a 1-D sequence of ids, or a
    2-D array / list of id sequences. Every check runs here, before any
    model call.

    Returns:
        `(sequences, single, as_text)`: the id arrays; whether one text was
        given (return one result, not a list); whether the texts were
        strings (return strings).
    """
    if isinstance(texts, str):
        items, single, as_text = [texts], True, True
    elif isinstance(texts, (list, tuple)) and texts and all(isinstance(t, str) for t in texts):
        items, single, as_text = list(texts), False, True
    else:
        items, single = _id_items(texts, name), False
        as_text = False
        if items is None:
            items, single = [texts], True
    if not items:
        raise ValueError(f"Expected at least one {name}. Received: an empty list")
    sequences = []
    for i, item in enumerate(items):
        where = name if single else f"{name} {i}"
        if as_text:
            if vocabulary is None:
                raise ValueError(
                    f"Expected a vocabulary to read text {name}s: build the "
                    "model with `vocabulary=` (e.g. `corpus.vocabulary`) or "
                    f"pass `vocabulary=`. Received: {name}s as strings and no "
                    "vocabulary"
                )
            ids = encode(vocabulary, item, where=where)
        else:
            ids = _ids(item, where, vocabulary_size)
        if len(ids) < min_tokens:
            what = "at least one token" if min_tokens == 1 else (
                f"at least {min_tokens} tokens (the first is context only)"
            )
            raise ValueError(
                f"Expected every {name} to hold {what}. Received: {where} "
                f"with {len(ids)} token(s)" + (f": {item!r}" if as_text else "")
            )
        sequences.append(ids)
    return sequences, single, as_text


def _id_items(texts, name):
    """A list of id sequences, or `None` when `texts` is one sequence."""
    if isinstance(texts, np.ndarray) or hasattr(texts, "shape"):
        array = np.asarray(ops.convert_to_numpy(texts))
        if array.ndim == 1:
            return None
        if array.ndim == 2:
            return list(array)
        raise ValueError(
            f"Expected {name}s as ids to be 1-D (one) or 2-D (several). "
            f"Received shape {array.shape}"
        )
    if isinstance(texts, (list, tuple)):
        if texts and all(_is_int(t) for t in texts):
            return None
        return list(texts)
    raise ValueError(
        f"Expected a string, a list of strings or token ids as {name}s. "
        f"Received: {type(texts).__name__}"
    )


def _is_int(value):
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def _ids(item, where, vocabulary_size):
    try:
        array = np.asarray(item)
    except Exception as error:  # ragged nesting NumPy cannot read
        raise ValueError(f"Expected {where} to be a sequence of token ids.") from error
    if isinstance(item, str) or array.ndim != 1 or not (
        array.size == 0 or np.issubdtype(array.dtype, np.integer)
    ):
        raise ValueError(
            f"Expected {where} to be a string or a 1-D sequence of integer "
            f"token ids. Received: {item!r}"[:300]
        )
    if array.size and not _validation.ids_known_below(array, vocabulary_size) and (
        array.min() < 0 or array.max() >= vocabulary_size
    ):
        bad = array[(array < 0) | (array >= vocabulary_size)][0]
        raise ValueError(
            f"Expected token ids in [0, {vocabulary_size}) in {where}. "
            f"Received: id {int(bad)}"
        )
    return array.astype("int32", copy=False)
