"""Dynamic evaluation document by document (`reset="document"`).

Each document is scored as a stream of its own: the adapted weights start
from θ_g and the recurrent state from zero at its first token, and a model
without carried state reads no context from the document before. Documents
come as a list of token-id sequences, or from a stream cut at a separator
token: the stream `w_0 … w_N` with separators at positions `p_1 < … < p_k`
(below `N`) becomes the documents `w_0 … w_{p_1}`, `w_{p_1} … w_{p_2}`, …,
`w_{p_k} … w_N` — each separator ends one document and is the context-only
first token of the next — so every token but `w_0` is predicted exactly
once, as with `reset="never"`, and the two are compared token for token.
"""

import math

import keras
import numpy as np

from keras_mogrifier.evaluation import _dynamic_checks as checks
from keras_mogrifier.evaluation._stream_scoring import summary
from keras_mogrifier.evaluation.divergence_error import DivergenceError

RESETS = ("never", "document")


def check_separator(separator, limit):
    """`separator` as a sorted int array of ids (or `None`), or a ValueError."""
    if separator is None:
        return None
    ids = np.atleast_1d(np.asarray(separator))
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            "Expected `separator` to be a token id or a list of token ids. "
            f"Received: separator={separator!r}"
        )
    high = limit if limit is not None else np.iinfo("int32").max
    bad = ids[(ids < 0) | (ids >= high)]
    if bad.size:
        raise ValueError(
            f"Expected `separator` ids in [0, {high}) (the model's "
            f"vocabulary). Received: {int(bad[0])}"
        )
    return np.unique(ids.astype("int32"))


def split(x, separator, limit):
    """`(documents, layout)`: the documents as 1-D int32 arrays, or a ValueError.

    A list (or tuple) of sequences is a list of documents, taken as they
    are; anything else is one stream or `(streams, time)`, cut after every
    `separator` token.

    `layout` is `None` for a list of documents (their token losses are
    returned as a list), else `(shape, places)`: the streams' shape and,
    for each document, its stream and first position, to put its token
    losses back in the streams' order.
    """
    separator = check_separator(separator, limit)
    listed = isinstance(x, (list, tuple)) and len(x) > 0 and all(
        np.ndim(document) >= 1 for document in x
    )
    if listed and separator is not None:
        raise ValueError(
            "Expected a list of documents with `separator=None` (documents are "
            "taken as they are), or a stream or `(streams, time)` array to cut "
            f"at `separator`. Received a list of {len(x)} sequences and "
            f"separator={separator.tolist()}"
        )
    if listed:
        # A list of documents, taken as they are.
        if any(np.ndim(document) != 1 for document in x):
            raise ValueError(
                "Expected each document of `x` to be a 1-D sequence of token "
                f"ids. Received dimensions {[int(np.ndim(d)) for d in x]}"
            )
        documents = [
            checks.as_streams(document, f"x[{i}]", limit)[0]
            for i, document in enumerate(x)
        ]
        return documents, None
    if separator is None:
        raise ValueError(
            "Expected a list of documents (1-D sequences of token ids) or a "
            "`separator` token to cut `x` at, for `reset='document'`. "
            f"Received: {type(x).__name__} and separator=None"
        )
    streams = checks.as_streams(x, "x", limit)
    documents, places = [], []
    for s, stream in enumerate(streams):
        boundaries = np.flatnonzero(np.isin(stream[:-1], separator))
        starts = np.concatenate([[0], boundaries])
        stops = np.concatenate([boundaries + 1, [stream.shape[0]]])
        for start, stop in zip(starts, stops):
            if stop - start >= 2:  # a separator at position 0 starts nothing
                documents.append(stream[start:stop])
                places.append((s, int(start)))
    return documents, (streams.shape, places)


def padded_segments(segments, per_call):
    """Segments a document is padded to: a power of two up to `per_call`,
    then a multiple of it, so that few call shapes are ever compiled."""
    if segments >= per_call:
        return -(-segments // per_call) * per_call
    return min(per_call, 2 ** math.ceil(math.log2(segments)))


def score(documents, layout, score_streams, restart, segment_length, per_call, verbose):
    """Scores `documents` one by one; returns `(report, token_losses)`.

    Args:
        documents, layout: from `split`.
        score_streams: `f(streams, real_length=) -> (report, token_losses)`,
            one stream whose predicted tokens after `real_length` are padding.
        restart: `f()` putting θ_g back in the adapted variables.
        segment_length: n.
        per_call: the most segments per compiled call.
        verbose: 0, 1 or 2: a progress bar over the documents.
    """
    n = segment_length
    progress = keras.utils.Progbar(len(documents), verbose=verbose) if verbose else None
    losses, done = [], 0
    for i, document in enumerate(documents):
        restart()
        predicted = document.shape[0] - 1
        # Padding after the document: scored at weight 0, and the weights
        # and state it reaches are reset before the next document.
        length = padded_segments(-(-predicted // n), per_call) * n + 1
        padded = np.concatenate(
            [document, np.full(length - document.shape[0], document[-1], "int32")]
        )
        try:
            _, token_losses = score_streams(padded[None], real_length=predicted)
        except DivergenceError as error:
            stream, offset = (i, 0) if layout is None else layout[1][i]
            raise DivergenceError.at(
                stream=stream, token=offset + error.token, segment=error.segment,
                loss=error.loss, settings=error.settings,
                tokens_scored=done + error.tokens_scored,
            ) from error
        losses.append(token_losses[0, :predicted])
        done += predicted
        if progress is not None:
            progress.update(i + 1)
    report = summary(np.concatenate(losses))
    if layout is None:
        return report, losses
    shape, places = layout
    token_losses = np.zeros((shape[0], shape[1] - 1), "float32")
    for (stream, start), document_losses in zip(places, losses):
        token_losses[stream, start : start + document_losses.shape[0]] = document_losses
    return report, token_losses
