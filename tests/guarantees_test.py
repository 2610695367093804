"""What the library guarantees (docs/guarantees.md), as a user meets it.

One test per row of issue 15's table of bad inputs and faults, written as a
user would call the library: each asserts the clear error and that every
weight, the optimizer state and the carried recurrent state are bitwise
unchanged (for non-finite training: equal to the last finite step's).
"""

import gzip
import json

import keras
import numpy as np
import pytest
from keras import ops

import keras_mogrifier as km
from keras_mogrifier.data import StreamDataset
from keras_mogrifier.models import LanguageModel
from keras_mogrifier.models import NonFiniteLossError

from testing import JIT_COMPILE
from testing import backend_specific
from testing import to_numpy

V, B, T = 11, 2, 5
JIT_CHOICES = sorted({JIT_COMPILE, False}, key=str)


# === Helpers ===


def _model(cls=LanguageModel, **kwargs):
    return cls(V, units=8, num_layers=1, cell="lstm", batch_size=B, seed=0, **kwargs)


def _compile(model, optimizer=None, jit_compile=JIT_COMPILE):
    model.compile(
        optimizer=optimizer or km.RectifiedAdam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    return model


def _stream(n=200, seed=0):
    return np.random.default_rng(seed).integers(0, V, n).astype("int32")


def _windows(count=4, seed=0):
    """`count` consecutive windows `(B, T)` of B streams, and their targets."""
    streams = StreamDataset(_stream(seed=seed), B, T)
    x = np.stack([streams[k][0] for k in range(count)])
    y = np.stack([streams[k][1] for k in range(count)])
    return x, y


def _trained(optimizer=None, jit_compile=JIT_COMPILE, cls=LanguageModel, **kwargs):
    """A model after one short `fit`: non-zero carried state and moments."""
    model = _compile(_model(cls, **kwargs), optimizer, jit_compile)
    model.fit(StreamDataset(_stream(), B, T, max_batches=2), verbose=0)
    return model


def _state(model):
    """Every weight (carried state included) and optimizer variable, by path."""
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        variables += list(optimizer.variables)
    return {v.path: to_numpy(v).copy() for v in variables}


def _assert_bitwise_equal(before, after, skip=()):
    """Same paths, same bytes; `skip`: variable names left out."""
    assert sorted(before) == sorted(after)
    compared = [p for p in before if p.rsplit("/", 1)[-1] not in skip]
    assert len(compared) > len(before) - len(skip) - 1
    changed = [p for p in compared if before[p].tobytes() != after[p].tobytes()]
    assert not changed, f"changed: {changed}"


class _RecordStates(keras.callbacks.Callback):
    """`_state(model)` after every training step."""

    def __init__(self):
        super().__init__()
        self.states = []

    def on_train_batch_end(self, batch, logs=None):
        self.states.append(_state(self.model))


class PoisonedLanguageModel(LanguageModel):
    """Its training logits are multiplied by the variable `poison`.

    With `where="loss"`, `poison - 1` is added to the loss instead, behind
    a `stop_gradient`: a NaN poison then makes the loss NaN and leaves every
    gradient finite.
    """

    def __init__(self, *args, where="logits", **kwargs):
        super().__init__(*args, **kwargs)
        self.where = where

    def build(self, input_shape):
        super().build(input_shape)
        self.poison = self.add_weight(
            shape=(), initializer="ones", trainable=False, name="poison"
        )

    def call(self, inputs, training=False):
        logits = super().call(inputs, training=training)
        if not training:
            return logits
        if self.where == "loss":
            self.add_loss(ops.stop_gradient(self.poison - 1.0))
            return logits
        return logits * ops.cast(self.poison, logits.dtype)


class _PoisonStep(keras.callbacks.Callback):
    """Sets the poison to NaN for the `at`-th step of `fit` (1-based)."""

    def __init__(self, at):
        super().__init__()
        self.at, self.count = at, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.count += 1
        value = float("nan") if self.count == self.at else 1.0
        self.model.poison.assign(value)  # (`self.model` syncs JAX's state)


class _Interrupt(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            raise KeyboardInterrupt

    on_test_batch_begin = on_predict_batch_begin = on_train_batch_begin


class _Windows(keras.utils.PyDataset):
    """A user's own PyDataset: batch k is `(x[k], y[k])`."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


# === Token ids ===


def test_fit_with_a_nan_sample_weight_is_refused_up_front():
    model = _trained()
    x, y = _windows(1)
    weights = np.ones((B, T), "float32")
    weights[1, 2] = np.nan
    before = _state(model)
    with pytest.raises(ValueError, match=r"`sample_weight` to be finite.*nan at position \(1, 2\)"):
        model.fit(x[0], y[0], sample_weight=weights, verbose=0)
    _assert_bitwise_equal(before, _state(model))


@pytest.mark.parametrize("jit_compile", JIT_CHOICES)
def test_fit_on_a_stream_dataset_with_an_id_beyond_the_vocabulary(jit_compile):
    model = _trained(jit_compile=jit_compile)
    ids = _stream()
    ids[3 * T + 1] = V  # stream 0, a target of batch 3 (and input of 4)
    before = _state(model)
    with pytest.raises(ValueError, match=rf"\[0, {V}\).*an id {V} in batch 3 \(stream 0"):
        model.fit(StreamDataset(ids, B, T), verbose=0)
    _assert_bitwise_equal(before, _state(model))


@pytest.mark.parametrize("jit_compile", JIT_CHOICES)
def test_fit_on_batches_checks_each_on_the_host_before_its_update(jit_compile):
    model = _trained(jit_compile=jit_compile)
    x, y = _windows(4)
    y[2, 1, 3] = V + 5  # batch 2 is bad
    record = _RecordStates()
    with pytest.raises(ValueError, match=rf"`y` in batch 2 of the training data.*an id {V + 5} at position \(1, 3\)"):
        model.fit(_Windows(x, y), callbacks=[record], verbose=0)
    assert len(record.states) == 2  # batches 0 and 1 trained
    _assert_bitwise_equal(record.states[-1], _state(model))
    model.fit(_Windows(x[:2], y[:2]), verbose=0)  # usable


def test_fit_on_a_tf_data_dataset_checks_each_batch_on_the_host():
    tf = pytest.importorskip("tensorflow")
    model = _trained()
    x, y = _windows(4)
    x[1, 0, 0] = -3
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    record = _RecordStates()
    with pytest.raises(ValueError, match=r"`x` in batch 1 of the training data.*an id -3"):
        model.fit(dataset, callbacks=[record], verbose=0)
    assert len(record.states) == 1
    _assert_bitwise_equal(record.states[-1], _state(model))


@pytest.mark.parametrize("bad_id", [V, -1])
def test_fit_and_predict_check_backend_tensors(bad_id):
    model = _trained()
    x, y = _windows(1)
    x, y = x[0], y[0]
    x[1, 4] = bad_id
    before = _state(model)
    with pytest.raises(ValueError, match=rf"`x` to hold token ids in \[0, {V}\).*an id {bad_id} at position \(1, 4\)"):
        model.fit(ops.convert_to_tensor(x), ops.convert_to_tensor(y), verbose=0)
    with pytest.raises(ValueError, match=rf"an id {bad_id} at position \(1, 4\)"):
        model.predict(ops.convert_to_tensor(x), verbose=0)
    with pytest.raises(ValueError, match=rf"`inputs` to hold token ids.*an id {bad_id}"):
        model(ops.convert_to_tensor(x))  # an eager call
    _assert_bitwise_equal(before, _state(model))


@backend_specific("tensorflow", reason="`tf.constant` is the TensorFlow backend's own tensor")
def test_fit_and_predict_check_tf_constants():
    import tensorflow as tf

    model = _trained()
    x, y = _windows(1)
    x = x[0].copy()
    x[0, 1] = -2
    before = _state(model)
    with pytest.raises(ValueError, match=r"an id -2 at position \(0, 1\)"):
        model.fit(tf.constant(x), tf.constant(y[0]), verbose=0)
    with pytest.raises(ValueError, match=r"an id -2 at position \(0, 1\)"):
        model.predict(tf.constant(x), verbose=0)
    _assert_bitwise_equal(before, _state(model))


def test_a_stream_dataset_refuses_negative_ids():
    ids = _stream()
    ids[17] = -3
    with pytest.raises(ValueError, match=r"non-negative token ids.*an id -3 at position \(17,\)"):
        StreamDataset(ids, B, T)


# === Shapes ===


def test_fit_with_3d_ids_or_mismatched_targets_changes_nothing():
    model = _trained()
    x, y = _windows(1)
    x, y = x[0], y[0]
    before = _state(model)
    with pytest.raises(ValueError, match=r"`x` to be token ids of shape \(batch, time\).*\(2, 5, 1\)"):
        model.fit(x[..., None], y[..., None], verbose=0)
    with pytest.raises(ValueError, match=r"`y` to have the shape of `x`, \(2, 5\).*\(2, 4\)"):
        model.fit(x, y[:, :4], verbose=0)
    with pytest.raises(ValueError, match="Expected targets `y`"):
        model.fit(x, verbose=0)
    rows = np.zeros((10, T), "int32")
    with pytest.raises(ValueError, match=r"shape of `x`, \(10, 5\).*\(9, 5\)"):
        model.fit(rows, rows[:9], batch_size=B, verbose=0)
    _assert_bitwise_equal(before, _state(model))


def test_predict_with_3d_ids_or_more_rows_than_the_state_holds():
    model = _trained()
    x, _ = _windows(1)
    before = _state(model)
    with pytest.raises(ValueError, match=r"`x` to be token ids of shape \(batch, time\). Received: x.shape=\(1, 2, 5\)"):
        model.predict(x, verbose=0)
    rows = np.zeros((2 * B + 1, T), "int32")
    with pytest.raises(ValueError, match=rf"at most {B} sequences per batch.*room for {B} rows"):
        model.predict(rows, batch_size=2 * B + 1, verbose=0)
    with pytest.raises(ValueError, match=r"shape \(batch, time\). Received: inputs.shape=\(1, 2, 5\)"):
        model(x)
    with pytest.raises(ValueError, match=rf"at most {B} sequences"):
        model(rows)
    _assert_bitwise_equal(before, _state(model))


def test_a_stateful_model_refuses_shuffled_windows():
    model = _trained()
    x, y = _windows(2)
    before = _state(model)
    with pytest.raises(ValueError, match=r"`shuffle=False` for a stateful LanguageModel.*in order"):
        model.fit(StreamDataset(_stream(), B, T), shuffle=True, verbose=0)
    with pytest.raises(ValueError, match="shuffle=True"):
        model.fit(x[0], y[0], shuffle=True, verbose=0)
    _assert_bitwise_equal(before, _state(model))
    stateless = _compile(_model(stateful=False))
    stateless.fit(x[0], y[0], shuffle=True, verbose=0)  # allowed


# === Optimizer ===


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"learning_rate": -1e-2}, "learning_rate"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1e-8}, "epsilon"),
    ],
)
def test_rectified_adam_refuses_a_bad_learning_rate_or_epsilon(kwargs, message):
    with pytest.raises(ValueError, match=f"Expected `{message}` to be a finite.*Received: {message}="):
        km.RectifiedAdam(**kwargs)


def test_rectified_adam_accepts_a_schedule_and_zero_learning_rate():
    km.RectifiedAdam(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.5))
    km.RectifiedAdam(learning_rate=0.0)


# === with_options ===


@pytest.mark.parametrize(
    "override", [{"units": 16}, {"num_layers": 2}, {"vocabulary_size": 12}, {"cell": "rlstm"},
                 {"embedding_dim": 4}, {"dual": True}, {"mogrifier_rounds": 2}, {"unit": 8}],
)
def test_with_options_refuses_what_would_change_the_weights(override):
    model = _trained()
    before = _state(model)
    with pytest.raises(ValueError, match=r"keep every trained weight: \[.*'batch_size'.*\].*Received: " + list(override)[0]):
        model.with_options(**override)
    _assert_bitwise_equal(before, _state(model))


def test_with_options_applies_the_temperature():
    model = _trained()
    x, _ = _windows(1)
    copy = model.with_options(temperature=0.5)
    assert copy.temperature == 0.5
    model.reset_states()
    logits = to_numpy(model(x[0]))
    np.testing.assert_allclose(to_numpy(copy(x[0])), 0.5 * logits, rtol=1e-6, atol=1e-6)
    assert model.temperature == 1.0


# === Carried state ===


def test_search_temperature_after_fit_keeps_the_carried_state():
    model = _trained()
    before = _state(model)
    result = km.search_temperature(model, _stream(120, seed=3), batch_size=B, sequence_length=T, apply=False)
    _assert_bitwise_equal(before, _state(model))
    km.search_temperature(model, _stream(120, seed=3), batch_size=B, sequence_length=T)
    _assert_bitwise_equal(before, _state(model), skip=("temperature",))
    assert model.temperature == result["temperature"]


def test_search_temperature_with_more_streams_than_the_state_holds():
    model = _trained()
    before = _state(model)
    with pytest.raises(ValueError, match=rf"at most the capacity of the model's recurrent state \({B},.*Received: {B + 1}"):
        km.search_temperature(model, _stream(), batch_size=B + 1)
    bad = _stream()
    bad[5] = V
    with pytest.raises(ValueError, match=rf"`ids` to hold token ids in \[0, {V}\)"):
        km.search_temperature(model, bad, batch_size=B)
    _assert_bitwise_equal(before, _state(model))
    assert model.temperature == 1.0


# === Metrics ===


@pytest.mark.parametrize("metric", [km.Perplexity, km.BitsPerCharacter])
def test_metrics_over_zero_tokens_report_nan(metric):
    m = metric()
    logits = np.zeros((2, 3, V), "float32")
    m.update_state(np.zeros((2, 3), "int32"), logits, sample_weight=np.zeros((2, 3)))
    assert np.isnan(float(m.result()))
    m.update_state(np.zeros((2, 3), "int32"), logits)
    assert np.isfinite(float(m.result()))


# === Dynamic evaluation ===


def test_dynamic_evaluator_names_the_output_it_expects():
    model = keras.Sequential([
        keras.Input(batch_shape=(1, None), dtype="int32"),
        keras.layers.Embedding(V, 8),
        keras.layers.LSTM(8, stateful=True),  # no time axis
        keras.layers.Dense(V),
    ])
    evaluator = km.DynamicEvaluator(model)
    with pytest.raises(ValueError, match=r"logits \(batch, time, vocabulary\). Received: .*shape \(1, 11\)"):
        evaluator.evaluate(_stream(30), adapt=False, verbose=0)
    with pytest.raises(ValueError, match=r"logits \(batch, time, vocabulary\)"):
        evaluator.collect_gradient_statistics(_stream(60), batch_size=1)


def test_mc_dropout_checks_a_stream_dataset_against_the_vocabulary():
    model = _trained()
    ids = _stream()
    ids[50] = V + 1
    before = _state(model)
    with pytest.raises(ValueError, match=rf"an id {V + 1} in batch"):
        km.mc_dropout_evaluate(model, StreamDataset(ids, B, T), passes=2)
    _assert_bitwise_equal(before, _state(model))


# === Files ===


def test_a_truncated_gz_corpus_names_the_file(tmp_path):
    for split in ("train", "valid", "test"):
        with gzip.open(tmp_path / f"ptb.{split}.txt.gz", "wt") as f:
            f.write("the cat sat on the mat\n" * 200)
    path = tmp_path / "ptb.valid.txt.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"ptb\.valid\.txt\.gz.*complete gzip-compressed file.*truncated"):
        km.data.load_corpus(tmp_path)


def test_a_truncated_vocabulary_file_names_the_file(tmp_path):
    path = tmp_path / "vocabulary.json"
    km.data.Vocabulary.build("a b c".split()).save(path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"vocabulary\.json.*not valid JSON"):
        km.data.Vocabulary.load(path)
    path.write_text(json.dumps({"format": json.loads(text)["format"], "tokens": ["a"]}))
    with pytest.raises(ValueError, match=r"vocabulary\.json.*without the entries"):
        km.data.Vocabulary.load(path)


# === Non-finite training ===


@pytest.mark.parametrize(
    "averaging, where",
    [(False, "logits"), (True, "logits"), (False, "loss")],
    ids=["radam", "two_tailed", "finite_gradients"],
)
def test_fit_stops_at_a_non_finite_loss_at_the_last_finite_step(averaging, where):
    optimizer = km.RectifiedAdam(1e-2)
    if averaging:
        optimizer = km.TwoTailedAveragingOptimizer(optimizer)
    model = _trained(optimizer, cls=PoisonedLanguageModel, where=where)
    record = _RecordStates()
    with pytest.raises(NonFiniteLossError, match="batch 2 of epoch 0: its loss is nan.*last finite step") as info:
        model.fit(StreamDataset(_stream(), B, T), callbacks=[_PoisonStep(3), record], verbose=0)
    assert (info.value.epoch, info.value.batch) == (0, 2)
    assert len(record.states) == 2
    # Weights, optimizer state (averages included) and carried state.
    _assert_bitwise_equal(record.states[-1], _state(model), skip=("poison",))
    assert not any(name in vars(model.optimizer) for name in ("apply", "stateless_apply"))


def test_a_non_finite_first_step_leaves_the_model_as_it_was():
    model = _trained(cls=PoisonedLanguageModel)
    before = _state(model)
    with pytest.raises(NonFiniteLossError, match="batch 0.*as it was before `fit`"):
        model.fit(StreamDataset(_stream(), B, T), callbacks=[_PoisonStep(1)], verbose=0)
    _assert_bitwise_equal(before, _state(model), skip=("poison",))


def test_stop_on_non_finite_false_trains_on_as_keras_does():
    model = _trained(cls=PoisonedLanguageModel)
    model.fit(
        StreamDataset(_stream(), B, T, max_batches=4), callbacks=[_PoisonStep(2)],
        stop_on_non_finite=False, verbose=0,
    )
    assert not np.all(np.isfinite(to_numpy(model.embedding.embeddings)))


def test_divergence_recovery_keeps_restarting_from_its_checkpoint():
    model = _trained(cls=PoisonedLanguageModel)
    recovery = km.DivergenceRecovery(monitor=None, verbose=0)
    history = model.fit(
        StreamDataset(_stream(), B, T, max_batches=4), epochs=2,
        callbacks=[_PoisonStep(2), recovery], verbose=0,
    )
    assert recovery.recoveries == 1
    assert np.isfinite(history.history["loss"][-1])
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())


# === Failures and interrupts ===


def test_an_interrupt_before_the_first_step_leaves_the_model_as_it_was():
    model = _trained()
    before = _state(model)
    with pytest.raises(KeyboardInterrupt):
        model.fit(StreamDataset(_stream(), B, T), callbacks=[_Interrupt(0)], verbose=0)
    _assert_bitwise_equal(before, _state(model))


def test_an_interrupt_later_keeps_what_was_trained():
    model = _trained()
    record = _RecordStates()
    with pytest.raises(KeyboardInterrupt):
        model.fit(StreamDataset(_stream(), B, T), callbacks=[record, _Interrupt(3)], verbose=0)
    assert len(record.states) == 3
    _assert_bitwise_equal(record.states[-1], _state(model))
    model.fit(StreamDataset(_stream(), B, T, max_batches=1), verbose=0)  # usable


@pytest.mark.parametrize("entry_point", ["evaluate", "predict"])
def test_an_interrupted_evaluation_leaves_the_model_as_it_was(entry_point):
    model = _trained()
    before = _state(model)
    data = StreamDataset(_stream(), B, T)
    with pytest.raises(KeyboardInterrupt):
        getattr(model, entry_point)(data, callbacks=[_Interrupt(2)], verbose=0)
    _assert_bitwise_equal(before, _state(model))
    model.evaluate(data, verbose=0)  # usable
