"""Cutting a token stream into B contiguous streams and windows of T tokens."""

import hashlib

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

    **Across epochs** (stateful training). `LanguageModel.fit` does not
    restart the streams at each epoch: it trains on `continued()`, where
    every stream goes on reading its own text where the previous epoch left
    it, and carries the recurrent state with it — the way the Mogrifier
    authors train (lamb's `equidistant_iterators`: one endless iterator per
    stream, no epoch boundary). An epoch is still `len(self)` windows. Each
    stream reads the id stream as a ring: after reading all `len(ids)`
    tokens from its start it wraps to that start moved by a random offset
    in `[-start_jitter, start_jitter]` tokens, drawn from `seed` (lamb moves
    it by up to ±100 lines at each wrap, `lamb/corpus.py`,
    `get_batches(..., start_jitter=100)`). The first epoch is exactly the
    windows `self[k]`. `fit(..., reset_state_each_epoch=True)` restores the
    old behaviour (every epoch restarts the streams and zeroes the state).

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
        start_jitter: int or None. How far (in tokens) a stream's start may
            move each time it wraps around the text in `continued()`. `None`
            (the default): lamb's ±100 lines in tokens, at the mean line
            length of `ids` counted with `line_end_id`, or 0 without
            `line_end_id`.
        line_end_id: int or None. The id that ends a line (a `Corpus`'s
            `vocabulary.eos_id`), to measure lines in tokens. Defaults to
            `None`.
        seed: int or None. Seed of the wrap offsets, so that a run (and a
            resumed run) reads the same windows. `None` draws one (see the
            `seed` attribute; a run resumed from a `TrainingCheckpoint` then
            needs that seed given). Defaults to `0`.
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
        start_jitter=None,
        line_end_id=None,
        seed=0,
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
        if line_end_id is not None:
            line_end_id = _validation.non_negative_int("line_end_id", line_end_id)
        if start_jitter is None:
            start_jitter = (
                0 if line_end_id is None
                else lines_in_tokens(ids, line_end_id, LAMB_START_JITTER_LINES)
            )
        start_jitter = _validation.non_negative_int("start_jitter", start_jitter)
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        seed = _validation.non_negative_int("seed", seed)
        super().__init__(**kwargs)
        self.ids = ids
        self.start_jitter = start_jitter
        self.seed = seed
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
        except ValueError:
            bad = self.streams[:, :used] >= vocabulary_size
        else:
            if self.drop_remainder:
                # Training data: `continued()` reads every id of the ring.
                self._check_ring(vocabulary_size)
            return
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

    @property
    def steps_per_epoch(self):
        """The windows of one epoch: `len(self)`."""
        return self._num_windows

    def fingerprint(self):
        """What a checkpoint of training on this data records to refuse other
        data: the id stream's length and hash, the batch shape, the epoch's
        windows and the wrap's jitter and seed."""
        return {
            "tokens": int(len(self.ids)),
            "ids_sha256": hashlib.sha256(
                np.ascontiguousarray(self.ids, dtype=np.int64).tobytes()
            ).hexdigest(),
            "batch_size": self.batch_size,
            "sequence_length": self.sequence_length,
            "steps_per_epoch": self._num_windows,
            "start_jitter": self.start_jitter,
            "seed": self.seed,
        }

    def continued(self, start_window=0):
        """The windows as one endless sequence that continues across epochs.

        Window `g` of the result is window `g` of every stream's endless
        reading (see the class docstring); window `g < len(self)` equals
        `self[g]`. `LanguageModel.fit` trains on it with `steps_per_epoch =
        len(self)` and `start_window = initial_epoch · len(self)` (plus the
        steps already done of a resumed epoch), so a resumed run reads the
        windows the uninterrupted run would have read.

        Args:
            start_window: int. The window the result starts at. Defaults to 0.

        Returns:
            A `keras.utils.PyDataset` without a length (give `fit` its
            `steps_per_epoch`).
        """
        if not self.drop_remainder:
            raise ValueError(
                "Expected a training StreamDataset (drop_remainder=True) to "
                "continue across epochs: with drop_remainder=False the last "
                "window is padded, which only a single pass (evaluation) "
                "uses. Received: drop_remainder=False"
            )
        start_window = _validation.non_negative_int("start_window", start_window)
        return ContinuedStreams(self, start_window)

    def continued_window(self, window):
        """`(x, y)` of window `window` of the endless reading (`continued()`)."""
        window = _validation.non_negative_int("window", window)
        length = self.sequence_length
        # Token k of each stream's reading (k = 0 is the stream's start):
        # pass k // n of the ring, at offset k % n from that pass's start.
        n = len(self.ids)
        k = window * length + np.arange(length + 1, dtype=np.int64)
        passes = k // n
        jitter = np.zeros((self.batch_size, length + 1), np.int64)
        for p in np.unique(passes):
            if p > 0 and self.start_jitter:
                jitter[:, passes == p] = self.pass_offsets(int(p))[:, None]
        starts = np.arange(self.batch_size, dtype=np.int64) * self.streams.shape[1]
        tokens = self.ids[(starts[:, None] + jitter + (k % n)[None, :]) % n]
        x = np.ascontiguousarray(tokens[:, :-1], dtype=np.int32)
        y = np.ascontiguousarray(tokens[:, 1:], dtype=np.int32)
        return x, y

    def pass_offsets(self, ring_pass):
        """How far each stream's start moves for its `ring_pass`-th reading
        of the text (0 for the first): `(batch_size,)` ints in
        `[-start_jitter, start_jitter]`, a function of `seed` and the pass."""
        ring_pass = _validation.non_negative_int("ring_pass", ring_pass)
        if ring_pass == 0 or not self.start_jitter:
            return np.zeros(self.batch_size, np.int64)
        rng = np.random.default_rng([self.seed, ring_pass])
        return rng.integers(
            -self.start_jitter, self.start_jitter + 1, size=self.batch_size
        )

    def _check_ring(self, vocabulary_size):
        bad = np.flatnonzero(self.ids >= vocabulary_size)
        if bad.size:
            raise ValueError(
                f"Expected the token ids of the StreamDataset to be in [0, "
                f"{vocabulary_size}) (the model's vocabulary). Received: an id "
                f"{int(self.ids[bad[0]])} at token {int(bad[0])} of the ids, "
                "which the streams read when they continue past the first "
                "epoch"
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


# lamb/corpus.py, `get_batches`: `equidistant_iterators(batch_size,
# random_starts=True, start_jitter=100, ...)`, where the corpus's instances
# are lines: ±100 lines.
LAMB_START_JITTER_LINES = 100


def lines_in_tokens(ids, line_end_id, lines):
    """`lines` lines of `ids` in tokens, at their mean line length.

    The mean line length is `len(ids)` over the number of `line_end_id`s
    (Penn Treebank's training text: 929,589 tokens in 42,068 lines, 22.1
    tokens a line, so lamb's ±100 lines are ±2,210 tokens). Without a line
    end in `ids`, the whole text is one line.
    """
    ids = _as_id_stream(ids)
    line_end_id = _validation.non_negative_int("line_end_id", line_end_id)
    lines = _validation.non_negative_int("lines", lines)
    count = int(np.count_nonzero(ids == line_end_id))
    return int(round(lines * len(ids) / max(count, 1)))


class DatasetView(keras.utils.PyDataset):
    """A `PyDataset` serving another one's batches (with its workers,
    multiprocessing and queue settings) in some other way."""

    def __init__(self, dataset):
        super().__init__(
            workers=dataset.workers,
            use_multiprocessing=dataset.use_multiprocessing,
            max_queue_size=dataset.max_queue_size,
        )
        self.dataset = dataset


class ContinuedStreams(DatasetView):
    """The endless windows of a `StreamDataset` (`StreamDataset.continued()`).

    It has no length: Keras reads it with `fit(..., steps_per_epoch=...)`,
    from one iterator across all epochs, so batch `i` it serves is window
    `start_window + i` whatever the epoch — a pure function of the index,
    which keeps resumed runs exact.
    """

    def __init__(self, dataset, start_window):
        super().__init__(dataset)
        self.start_window = start_window

    @property
    def num_batches(self):
        return None

    @property
    def batch_size(self):
        return self.dataset.batch_size

    def __getitem__(self, index):
        if isinstance(index, (bool, np.bool_)) or not isinstance(
            index, (int, np.integer)
        ) or index < 0:
            raise TypeError(
                f"Expected a non-negative integer batch index. Received: {index!r}"
            )
        return self.dataset.continued_window(self.start_window + int(index))
