"""Cutting a token stream into B contiguous streams and windows of T tokens."""

import numpy as np
import keras

from keras_mogrifier import _validation
from keras_mogrifier._validation import optional_positive_int
from keras_mogrifier._validation import positive_int


def _as_id_stream(ids):
    ids = _validation.to_host(ids)
    if ids.ndim != 1 or not (
        ids.size == 0 or (np.issubdtype(ids.dtype, np.integer) and ids.dtype != bool)
    ):
        raise ValueError(
            "Expected `ids` to be a 1-D array of integer token ids. Received: "
            f"shape {ids.shape}, dtype {ids.dtype}"
        )
    if ids.size:
        _validation.token_ids("ids", ids, None)
    return ids


def batchify(ids, batch_size):
    """Splits a token stream into `batch_size` contiguous streams.

    Stream `b` is `ids[b·L : (b+1)·L]` with `L = len(ids) // batch_size`;
    the last `len(ids) % batch_size` tokens are dropped, as in the standard
    Penn Treebank setup (Zaremba et al. 2014).

    Args:
        ids: 1-D int array. The token ids of a split.
        batch_size: int. The number of streams B.

    Returns:
        An int array of shape `(batch_size, L)`.

    Example:

    >>> batchify(np.arange(10), 3).tolist()
    [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """
    ids = _as_id_stream(ids)
    batch_size = positive_int("batch_size", batch_size)
    length = len(ids) // batch_size
    if length < 1:
        raise ValueError(
            f"Expected at least `batch_size` = {batch_size} tokens to batchify. "
            f"Received: {len(ids)} tokens"
        )
    return ids[: batch_size * length].reshape(batch_size, length)


class StreamDataset(keras.utils.PyDataset):
    """Windows of B contiguous token streams, in order, for stateful training.

    The id stream is split into `batch_size` contiguous streams by
    `batchify` (stream b holds tokens `[b·L, (b+1)·L)`). Batch k is the k-th
    window of `sequence_length` tokens of every stream: `x[b] = streams[b,
    kT : kT+T]` and the targets, shifted by one, `y[b] = streams[b, kT+1 :
    kT+T+1]`. Row b of batch k+1 continues row b of batch k, so a stateful
    model that carries its recurrent state from one batch to the next sees
    each stream as one long sequence (truncated backpropagation through
    time). Every token but the first of each stream is predicted exactly
    once per epoch.

    The last window is usually shorter than T. With `drop_remainder=True`
    it is dropped and batches are `(x, y)` of shape `(B, T)`. With
    `drop_remainder=False` it is kept, padded to T with id 0, and every batch
    is `(x, y, sample_weight)` with weight 1 on real targets and 0 on
    padding, so that all batches have the same shape (no retracing) and
    weighted losses and metrics count every token exactly once — the right
    choice for evaluation. Keras passes sample weights to the metrics given
    as `compile(weighted_metrics=[...])` only, so compile `Perplexity` there
    (as `weighted_metrics`) when batches carry weights.

    Keras shuffles the batches of a `PyDataset` when `fit` is called with
    `shuffle=True` (its default): pass `shuffle=False` to `model.fit` so
    the windows arrive in order (language models of this package do this
    for you). `evaluate` and `predict` never shuffle.

    Args:
        ids: 1-D int array (or tensor). The token ids of a split (e.g.
            `corpus.train`), non-negative; `check_token_ids` checks them
            against a vocabulary size (`LanguageModel`'s entry points do).
        batch_size: int. The number of streams B.
        sequence_length: int. The window length T (BPTT length).
        drop_remainder: bool. Drop the last partial window (`True`) or keep
            it padded with zero sample weights (`False`). Defaults to `True`.
        max_batches: int or `None`. Use only the first `max_batches` windows.
            Defaults to `None`.
        max_tokens: int or `None`. Use only the first windows holding at most
            `max_tokens` predicted tokens (`B·T` per full window), rounded
            down to whole windows but at least one. Defaults to `None`.
        **kwargs: `workers`, `use_multiprocessing`, `max_queue_size` of
            `keras.utils.PyDataset`.

    Example:

    >>> data = StreamDataset(np.arange(21), batch_size=2, sequence_length=4)
    >>> x, y = data[0]
    >>> x.tolist(), y.tolist()
    ([[0, 1, 2, 3], [10, 11, 12, 13]], [[1, 2, 3, 4], [11, 12, 13, 14]])
    >>> len(data), data.num_tokens
    (2, 16)

    Reference:
        Zaremba, Sutskever, Vinyals. "Recurrent Neural Network
        Regularization", arXiv:1409.2329, 2014.
    """

    def __init__(
        self,
        ids,
        batch_size,
        sequence_length,
        drop_remainder=True,
        max_batches=None,
        max_tokens=None,
        **kwargs,
    ):
        ids = _as_id_stream(ids)
        batch_size = positive_int("batch_size", batch_size)
        sequence_length = positive_int("sequence_length", sequence_length)
        if not isinstance(drop_remainder, (bool, np.bool_)):
            raise ValueError(
                "Expected `drop_remainder` to be a bool. "
                f"Received: drop_remainder={drop_remainder!r}"
            )
        max_batches = optional_positive_int("max_batches", max_batches)
        max_tokens = optional_positive_int("max_tokens", max_tokens)
        if len(ids) < 2 * batch_size:
            raise ValueError(
                f"Expected at least 2 tokens per stream, i.e. {2 * batch_size} "
                f"tokens for batch_size={batch_size}. Received: {len(ids)} tokens"
            )
        streams = batchify(ids, batch_size)
        predicted = streams.shape[1] - 1  # targets per stream
        full, rest = divmod(predicted, sequence_length)
        num_windows = full + (1 if rest and not drop_remainder else 0)
        if num_windows == 0:
            raise ValueError(
                f"Expected streams longer than `sequence_length`: each of the "
                f"{batch_size} streams predicts only {predicted} tokens, fewer "
                f"than sequence_length={sequence_length}, and "
                "drop_remainder=True drops that window. Use fewer streams, a "
                "shorter window, or drop_remainder=False"
            )
        if max_tokens is not None:
            num_windows = min(
                num_windows, max(1, max_tokens // (batch_size * sequence_length))
            )
        if max_batches is not None:
            num_windows = min(num_windows, max_batches)
        super().__init__(**kwargs)
        self.batch_size = batch_size
        self.sequence_length = sequence_length
        self.drop_remainder = bool(drop_remainder)
        self.max_batches = max_batches
        self.max_tokens = max_tokens
        self.streams = streams
        self._num_windows = num_windows

    @property
    def num_batches(self):
        return self._num_windows

    def __len__(self):
        return self._num_windows

    def window_length(self, index):
        """The number of real (unpadded) targets per stream in window `index`."""
        index = self._check_index(index)
        start = index * self.sequence_length
        return min(self.sequence_length, self.streams.shape[1] - 1 - start)

    @property
    def num_tokens(self):
        """The number of predicted (unpadded) tokens in one pass over the data."""
        return (
            sum(self.window_length(k) for k in range(self._num_windows))
            * self.batch_size
        )

    def check_token_ids(self, vocabulary_size):
        """Checks that every id the batches hold is below `vocabulary_size`.

        Only the tokens the batches use are checked (`max_batches` and
        `max_tokens` may leave the end of the streams out). Ids are known to
        be non-negative integers (checked at construction). The ids of a
        `Corpus` (and slices of them) were checked when it was made: they
        are not scanned again.

        Raises:
            ValueError: naming the first batch holding a bad id (as input or
                as target), the stream and the token's position in it.
        """
        vocabulary_size = positive_int("vocabulary_size", vocabulary_size)
        if _validation.ids_known_below(self.streams, vocabulary_size):
            return  # a corpus's ids, checked when it was made
        used = min(
            self.streams.shape[1], self._num_windows * self.sequence_length + 1
        )
        try:  # the one scan of `_validation`; then where the bad id is
            _validation.scan_token_ids("ids", self.streams[:, :used], vocabulary_size)
            return
        except ValueError:
            bad = self.streams[:, :used] >= vocabulary_size
        token = int(np.flatnonzero(bad.any(axis=0))[0])
        stream = int(np.flatnonzero(bad[:, token])[0])
        # Token t is the input of batch t // T and the target of (t-1) // T.
        batch = max(token - 1, 0) // self.sequence_length
        raise ValueError(
            f"Expected the token ids of the StreamDataset to be in [0, "
            f"{vocabulary_size}) (the model's vocabulary). Received: an id "
            f"{int(self.streams[stream, token])} in batch {batch} (stream "
            f"{stream}, token {token} of the stream)"
        )

    def _check_index(self, index):
        if isinstance(index, (bool, np.bool_)) or not isinstance(
            index, (int, np.integer)
        ):
            raise TypeError(f"Expected an integer batch index. Received: {index!r}")
        if not 0 <= index < self._num_windows:
            raise IndexError(
                f"Batch index {index} out of range for {self._num_windows} batches"
            )
        return int(index)

    def __getitem__(self, index):
        index = self._check_index(index)
        start = index * self.sequence_length
        length = self.window_length(index)
        x = self.streams[:, start : start + length]
        y = self.streams[:, start + 1 : start + 1 + length]
        x = np.ascontiguousarray(x, dtype=np.int32)
        y = np.ascontiguousarray(y, dtype=np.int32)
        if self.drop_remainder:
            return x, y
        pad = self.sequence_length - length
        weights = np.ones((self.batch_size, self.sequence_length), np.float32)
        if pad:
            x = np.pad(x, ((0, 0), (0, pad)))
            y = np.pad(y, ((0, 0), (0, pad)))
            weights[:, length:] = 0.0
        return x, y, weights
