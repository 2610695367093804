import keras
import numpy as np
import pytest
from keras import layers
from keras import ops

from keras_mogrifier.data import StreamDataset
from keras_mogrifier.data import batchify

from testing import to_numpy


def test_batchify_layout_drops_the_tail():
    ids = np.arange(23)
    streams = batchify(ids, 4)
    assert streams.shape == (4, 5)
    for b in range(4):
        np.testing.assert_array_equal(streams[b], ids[b * 5 : (b + 1) * 5])
    with pytest.raises(ValueError, match="at least `batch_size`"):
        batchify(np.arange(3), 4)
    with pytest.raises(ValueError, match="batch_size"):
        batchify(ids, 0)
    with pytest.raises(ValueError, match="1-D array of integer"):
        batchify(np.zeros((2, 3), int), 2)
    with pytest.raises(ValueError, match="1-D array of integer"):
        batchify(np.zeros(10, "float32"), 2)


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_windows_are_shifted_by_one_and_in_order(drop_remainder):
    ids = np.arange(1000, 1000 + 3 * 17 + 2)  # 3 streams of 17, 2 dropped
    data = StreamDataset(
        ids, batch_size=3, sequence_length=5, drop_remainder=drop_remainder
    )
    streams = ids[: 3 * 17].reshape(3, 17)
    # 16 targets per stream: 3 full windows of 5 and one of 1.
    assert len(data) == (3 if drop_remainder else 4)
    xs, ys = [], []
    for k in range(len(data)):
        batch = data[k]
        x, y = batch[0], batch[1]
        assert x.shape == y.shape == (3, 5)
        assert x.dtype == y.dtype == np.int32
        if drop_remainder:
            assert len(batch) == 2
            valid = 5
        else:
            w = batch[2]
            valid = int(w[0].sum())
            assert np.all(w[:, :valid] == 1) and np.all(w[:, valid:] == 0)
            assert np.all(x[:, valid:] == 0) and np.all(y[:, valid:] == 0)
        # Targets are the inputs shifted by one within each stream.
        np.testing.assert_array_equal(y[:, : valid - 1], x[:, 1:valid])
        xs.append(x[:, :valid])
        ys.append(y[:, :valid])
        if k > 0:
            # Row b continues row b of the previous batch: state can be carried.
            np.testing.assert_array_equal(x[:, 0], ys[-2][:, -1])
    x_all, y_all = np.concatenate(xs, 1), np.concatenate(ys, 1)
    n = x_all.shape[1]
    assert n == (15 if drop_remainder else 16)
    np.testing.assert_array_equal(x_all, streams[:, :n])
    np.testing.assert_array_equal(y_all, streams[:, 1 : n + 1])
    assert data.num_tokens == 3 * n


def test_iteration_and_index_errors():
    data = StreamDataset(np.arange(21), batch_size=2, sequence_length=4)
    assert len(list(data)) == len(data) == 2
    with pytest.raises(IndexError):
        data[2]
    with pytest.raises(IndexError):
        data[-1]
    with pytest.raises(TypeError):
        data[0.5]


def test_caps_on_batches_and_tokens():
    ids = np.arange(401)
    full = StreamDataset(
        ids, batch_size=4, sequence_length=10
    )  # 100 per stream: 9 windows
    assert len(full) == 9
    assert len(StreamDataset(ids, 4, 10, max_batches=3)) == 3
    assert len(StreamDataset(ids, 4, 10, max_tokens=130)) == 3  # 40 tokens per window
    assert len(StreamDataset(ids, 4, 10, max_tokens=5)) == 1  # at least one window
    assert len(StreamDataset(ids, 4, 10, max_tokens=10**6)) == 9
    capped = StreamDataset(ids, 4, 10, max_batches=5, max_tokens=80)
    assert len(capped) == 2 and capped.num_tokens == 80
    np.testing.assert_array_equal(capped[1][0], full[1][0])


def test_argument_validation():
    ids = np.arange(50)
    for kwargs, match in (
        ({"batch_size": 0, "sequence_length": 5}, "batch_size"),
        ({"batch_size": 2, "sequence_length": 0}, "sequence_length"),
        ({"batch_size": 2, "sequence_length": 5, "max_batches": 0}, "max_batches"),
        ({"batch_size": 2, "sequence_length": 5, "max_tokens": -1}, "max_tokens"),
        (
            {"batch_size": 2, "sequence_length": 5, "drop_remainder": "yes"},
            "drop_remainder",
        ),
        ({"batch_size": 30, "sequence_length": 5}, "at least 2 tokens per stream"),
        ({"batch_size": 5, "sequence_length": 10}, "longer than `sequence_length`"),
    ):
        with pytest.raises(ValueError, match=match):
            StreamDataset(ids, **kwargs)
    # The short window is fine when it is kept.
    assert len(StreamDataset(ids, 5, 10, drop_remainder=False)) == 1


class _Recorder(layers.Layer):
    """Identity that records the training batches it sees (run eagerly).

    Only calls with `training=True` are recorded: building the model (on
    symbolic or placeholder inputs, depending on the backend) is not a batch.
    """

    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.record = log.append  # a bound method: Keras does not copy it

    def call(self, x, training=None):
        if training:
            self.record(np.asarray(ops.convert_to_numpy(x)))
        return x

    def compute_output_shape(self, input_shape):
        return input_shape


def test_fit_with_shuffle_false_sees_the_windows_in_order():
    ids = np.random.default_rng(0).integers(0, 9, size=203)
    train = StreamDataset(ids, batch_size=4, sequence_length=6)
    log = []
    inputs = keras.Input((6,), dtype="int32")
    h = _Recorder(log)(inputs)
    logits = layers.Dense(9)(layers.Embedding(9, 4)(h))
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=True,
    )
    log.clear()
    model.fit(train, epochs=2, shuffle=False, verbose=0)
    seen = [x for x in log if x.shape == (4, 6)]
    expected = [train[k][0] for k in range(len(train))] * 2
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected):
        np.testing.assert_array_equal(got, want)


def test_stateful_rnn_over_windows_equals_one_pass_over_the_streams():
    ids = np.random.default_rng(1).integers(0, 7, size=3 * 26)
    data = StreamDataset(ids, batch_size=3, sequence_length=5)  # 5 windows
    embedding = layers.Embedding(7, 4)
    stateful_in = keras.Input((5,), batch_size=3, dtype="int32")
    stateful_lstm = layers.LSTM(6, return_sequences=True, stateful=True)
    stateful = keras.Model(stateful_in, stateful_lstm(embedding(stateful_in)))
    full_in = keras.Input((None,), dtype="int32")
    full_lstm = layers.LSTM(6, return_sequences=True)
    full = keras.Model(full_in, full_lstm(embedding(full_in)))
    full_lstm.set_weights(stateful_lstm.get_weights())
    # Direct calls, not `predict_on_batch`: on JAX, Keras's predict function
    # does not write the updated RNN state back into `stateful_lstm.states`.
    outputs = [to_numpy(stateful(data[k][0])) for k in range(len(data))]
    expected = to_numpy(full(data.streams[:, : 5 * len(data)]))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, atol=1e-5)
