"""Streams that continue across epochs (`StreamDataset.continued()`), and
`LanguageModel.fit`'s training on them with the state carried, lamb's way."""

import keras
import numpy as np
import pytest

from keras_mogrifier.data import StreamDataset
from keras_mogrifier.data.batching import lines_in_tokens
from keras_mogrifier.models import LanguageModel

from testing import to_numpy


def reference_reading(ids, batch_size, tokens, offsets):
    """Each stream's endless reading, token by token: stream b starts at
    b·(n // B), reads the n ids as a ring, and starts its p-th reading moved
    by `offsets(p)[b]`."""
    n = len(ids)
    length = n // batch_size
    reading = np.zeros((batch_size, tokens), np.int64)
    for b in range(batch_size):
        for k in range(tokens):
            ring_pass, r = divmod(k, n)
            reading[b, k] = ids[(b * length + offsets(ring_pass)[b] + r) % n]
    return reading


@pytest.mark.parametrize("jitter", [0, 7])
def test_continued_windows_read_each_stream_as_a_jittered_ring(jitter):
    ids = np.random.default_rng(0).integers(0, 50, size=103)
    data = StreamDataset(ids, batch_size=3, sequence_length=4, start_jitter=jitter, seed=5)
    windows = 3 * len(data) * 3  # past two wraps of every stream
    reading = reference_reading(ids, 3, windows * 4 + 1, data.pass_offsets)
    for g in range(windows):
        x, y = data.continued_window(g)
        np.testing.assert_array_equal(x, reading[:, 4 * g : 4 * g + 4])
        np.testing.assert_array_equal(y, reading[:, 4 * g + 1 : 4 * g + 5])
    # The first epoch is the dataset's own windows.
    for k in range(len(data)):
        for got, want in zip(data.continued_window(k), data[k]):
            np.testing.assert_array_equal(got, want)
    view = data.continued(start_window=5)
    assert view.num_batches is None
    np.testing.assert_array_equal(view[2][0], data.continued_window(7)[0])


def test_wrap_offsets_are_seeded_bounded_and_move():
    ids = np.arange(1000) % 97
    data = StreamDataset(ids, batch_size=16, sequence_length=5, start_jitter=9, seed=3)
    np.testing.assert_array_equal(data.pass_offsets(0), np.zeros(16))
    offsets = np.stack([data.pass_offsets(p) for p in range(1, 40)])
    assert offsets.min() >= -9 and offsets.max() <= 9
    assert len(np.unique(offsets)) > 10  # drawn, not constant
    again = StreamDataset(ids, batch_size=16, sequence_length=5, start_jitter=9, seed=3)
    np.testing.assert_array_equal(again.pass_offsets(4), data.pass_offsets(4))
    other = StreamDataset(ids, batch_size=16, sequence_length=5, start_jitter=9, seed=4)
    assert not np.array_equal(other.pass_offsets(4), data.pass_offsets(4))
    assert StreamDataset(ids, 2, 5).seed == 0
    assert StreamDataset(ids, 2, 5, seed=None).seed >= 0  # drawn


def test_lamb_jitter_is_100_lines_in_tokens():
    # 12 lines of 5 tokens then a line end (id 0): 6 tokens a line.
    ids = np.tile([1, 2, 3, 4, 5, 0], 12)
    assert lines_in_tokens(ids, 0, 100) == 600
    assert StreamDataset(ids, 2, 3, line_end_id=0).start_jitter == 600
    assert StreamDataset(ids, 2, 3).start_jitter == 0
    assert lines_in_tokens(np.arange(1, 9), 0, 3) == 24  # no line end: one line


def test_bad_arguments_are_refused():
    ids = np.arange(60) % 7
    for kwargs, match in (
        ({"start_jitter": -1}, "start_jitter"),
        ({"start_jitter": 1.5}, "start_jitter"),
        ({"seed": -2}, "seed"),
        ({"line_end_id": -1}, "line_end_id"),
    ):
        with pytest.raises(ValueError, match=match):
            StreamDataset(ids, 2, 5, **kwargs)
    with pytest.raises(ValueError, match="drop_remainder=True"):
        StreamDataset(ids, 2, 5, drop_remainder=False).continued()
    with pytest.raises(ValueError, match="start_window"):
        StreamDataset(ids, 2, 5).continued(start_window=-1)


def test_ids_read_only_after_the_first_epoch_are_checked_too():
    ids = np.arange(41) % 7
    ids[-1] = 99  # dropped by batchify, read when the streams wrap
    data = StreamDataset(ids, 2, 5)
    with pytest.raises(ValueError, match="continue past the first epoch"):
        data.check_token_ids(7)
    StreamDataset(ids, 2, 5, drop_remainder=False).check_token_ids(7)


def _model(seed=0):
    model = LanguageModel(
        11, units=6, embedding_dim=6, num_layers=1, cell="lstm", batch_size=2, seed=seed
    )
    model.build((2, None))
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _weights(model):
    return [to_numpy(w) for w in model.trainable_weights]


@pytest.mark.parametrize("reset", [False, True])
def test_fit_equals_steps_over_the_continued_windows(reset):
    """`fit` over 3 epochs is the same updates as `train_on_batch` over the
    windows the streams read: continued and with the state carried (the
    default), or restarted from zero state every epoch (`reset=True`)."""
    ids = np.random.default_rng(2).integers(0, 11, size=63)
    data = StreamDataset(ids, batch_size=2, sequence_length=6, start_jitter=3, seed=1)
    assert len(data) == 5
    fitted, stepped = _model(), _model()
    stepped.set_weights(fitted.get_weights())
    fitted.fit(data, epochs=3, verbose=0, **({"reset_state_each_epoch": True} if reset else {}))
    for epoch in range(3):
        if reset:
            stepped.reset_states()
        for k in range(len(data)):
            window = k if reset else epoch * len(data) + k
            stepped.train_on_batch(*data.continued_window(window))
    for got, want in zip(_weights(fitted), _weights(stepped)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    states = [to_numpy(v) for v in fitted.recurrent_state_variables]
    for got, want in zip(states, [to_numpy(v) for v in stepped.recurrent_state_variables]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_run_continued_with_initial_epoch_reads_on_and_keeps_the_state():
    ids = np.random.default_rng(3).integers(0, 11, size=63)
    data = StreamDataset(ids, batch_size=2, sequence_length=6, start_jitter=3, seed=1)
    whole, split = _model(), _model()
    split.set_weights(whole.get_weights())
    whole.fit(data, epochs=3, verbose=0)
    split.fit(data, epochs=1, verbose=0)
    split.fit(data, epochs=3, initial_epoch=1, verbose=0)
    for got, want in zip(_weights(split), _weights(whole)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reset_state_each_epoch_must_be_a_bool():
    data = StreamDataset(np.arange(63) % 11, batch_size=2, sequence_length=6)
    with pytest.raises(ValueError, match="reset_state_each_epoch"):
        _model().fit(data, epochs=1, verbose=0, reset_state_each_epoch="yes")
