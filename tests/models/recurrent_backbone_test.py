"""RecurrentBackbone on its own, LanguageModel from parts, call_with_cache."""

import io
import zipfile

import h5py
import keras
import numpy as np
import pytest

from keras_mogrifier.layers import LanguageModelHead
from keras_mogrifier.models import LanguageModel
from keras_mogrifier.models import RecurrentBackbone

from testing import assert_config_round_trip
from testing import to_numpy

V, B, T, N = 13, 2, 6, 5


def _ids(seed=0, batch=B, time=T):
    return np.random.default_rng(seed).integers(0, V, size=(batch, time)).astype("int32")


def _h5_names(path):
    with zipfile.ZipFile(path) as archive:
        store = h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
        names = []
        store.visit(names.append)
    return names


def test_backbone_carries_its_state_from_one_call_to_the_next():
    backbone = RecurrentBackbone(V, units=N, num_layers=2, cell="rlstm", batch_size=B)
    ids = _ids()
    whole = to_numpy(backbone(ids))
    assert whole.shape == (B, T, N)
    backbone.reset_states()
    first = to_numpy(backbone(ids[:, :3]))
    second = to_numpy(backbone(ids[:, 3:]))
    np.testing.assert_allclose(np.concatenate([first, second], 1), whole, rtol=1e-5, atol=1e-5)
    # Without the carried state the second half differs.
    backbone.reset_states()
    np.testing.assert_raises(
        AssertionError, np.testing.assert_allclose, to_numpy(backbone(ids[:, 3:])), second, 1e-5, 1e-5
    )
    backbone.reset_states()
    for variable in backbone.recurrent_state_variables:
        assert not np.any(to_numpy(variable))


def test_call_with_state_is_the_stateful_call_without_touching_the_state():
    backbone = RecurrentBackbone(V, units=N, num_layers=2, batch_size=B)
    ids = _ids()
    expected = to_numpy(backbone(ids))
    carried = [to_numpy(v) for v in backbone.recurrent_state_variables]
    features, _, states = backbone.call_with_state(ids[:, :2])
    rest, _, states = backbone.call_with_state(ids[:, 2:], states)
    np.testing.assert_allclose(
        np.concatenate([to_numpy(features), to_numpy(rest)], 1), expected, rtol=1e-5, atol=1e-5
    )
    for variable, value, state in zip(backbone.recurrent_state_variables, carried, states):
        np.testing.assert_array_equal(to_numpy(variable), value)
        np.testing.assert_allclose(to_numpy(state), value, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Expected 4 state tensors"):
        backbone.call_with_state(ids, states[:2])


def test_backbone_config_round_trip():
    backbone = RecurrentBackbone(V, units=N, num_layers=3, cell="mogrifier_rlstm", mogrifier_rank=2,
                                 residual=False, skip_connections=True, input_dropout=0.1, seed=4)
    revived = assert_config_round_trip(backbone)
    assert revived.num_layers == 3 and revived.skip_connections


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_a_sequence_classifier_on_the_backbone_learns_a_separable_task():
    # Class 1 iff the sequence contains token 1 (the others are 2..V-1).
    rng = np.random.default_rng(0)
    x = rng.integers(2, V, size=(64, 8)).astype("int32")
    y = rng.integers(0, 2, size=(64,)).astype("int32")
    x[y == 1, rng.integers(0, 8, size=int(y.sum()))] = 1
    keras.utils.set_random_seed(0)
    backbone = RecurrentBackbone(V, units=16, num_layers=1, cell="lstm", stateful=False)
    ids = keras.Input((None,), dtype="int32")
    features = backbone(ids)
    pooled = keras.layers.GlobalMaxPooling1D()(features)
    classifier = keras.Model(ids, keras.layers.Dense(2)(pooled))
    classifier.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    before = classifier.evaluate(x, y, verbose=0, return_dict=True)["accuracy"]
    classifier.fit(x, y, batch_size=16, epochs=15, verbose=0)
    after = classifier.evaluate(x, y, verbose=0, return_dict=True)["accuracy"]
    assert after >= 0.95 > before
    assert any(w is backbone.embedding.embeddings for w in classifier.trainable_weights)


def _parts(seed=7, tie=True, **head):
    backbone = RecurrentBackbone(V, units=N, num_layers=2, embedding_dim=4, batch_size=B, seed=seed)
    head = LanguageModelHead(V, N, embedding_dim=4, tie_embeddings=tie, seed=seed, **head)
    return backbone, head


def test_a_model_from_parts_is_the_flat_model():
    flat = LanguageModel(V, units=N, num_layers=2, embedding_dim=4, batch_size=B, seed=7,
                         dual=True, input_dropout=0.2, output_dropout=0.3)
    backbone = RecurrentBackbone(V, units=N, num_layers=2, embedding_dim=4, batch_size=B, seed=7,
                                 input_dropout=0.2)
    head = LanguageModelHead(V, N, embedding_dim=4, seed=7, dual=True, output_dropout=0.3)
    composed = LanguageModel(backbone=backbone, head=head)
    ids = _ids()
    flat(ids)
    composed(ids)
    local = lambda model: [v.path.split("/", 1)[1] for v in model.weights]  # noqa: E731
    assert local(composed) == local(flat)
    composed.set_weights(flat.get_weights())
    flat.reset_states()
    composed.reset_states()
    np.testing.assert_array_equal(to_numpy(composed(ids)), to_numpy(flat(ids)))
    # Same seeds: the same dropout masks in training.
    np.testing.assert_array_equal(
        to_numpy(composed(ids, training=True)), to_numpy(flat(ids, training=True))
    )
    assert composed.backbone is backbone and composed.head is head
    assert composed.embedding is backbone.embedding and head.embedding is backbone.embedding
    assert flat.backbone.embedding is flat.embedding


def test_a_model_from_parts_saves_the_same_layout_and_round_trips(tmp_path):
    backbone, head = _parts(mixture_of_softmaxes=2, mixture_dropout=0.1)
    composed = LanguageModel(backbone=backbone, head=head, samples=2)
    ids = _ids()
    expected = to_numpy(composed(ids))
    path = str(tmp_path / "composed.keras")
    composed.save(path)
    flat = LanguageModel(V, units=N, num_layers=2, embedding_dim=4, batch_size=B, samples=2,
                         mixture_of_softmaxes=2, mixture_dropout=0.1)
    flat(ids)
    flat.save(str(tmp_path / "flat.keras"))
    assert _h5_names(path) == _h5_names(str(tmp_path / "flat.keras"))
    assert "layers/rnn/cell/vars" in _h5_names(path) and "embedding/vars" in _h5_names(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.backbone, RecurrentBackbone) and loaded.samples == 2
    loaded.reset_states()
    np.testing.assert_allclose(to_numpy(loaded(ids)), expected, rtol=1e-6, atol=1e-6)
    config = composed.get_config()
    assert LanguageModel.from_config(config).get_config() == config
    assert "backbone" not in flat.get_config()
    assert LanguageModel.from_config(flat.get_config()).get_config() == flat.get_config()
    # The parts are saved once, under the model's own attribute names.
    assert not any(name.startswith(("backbone", "head")) for name in _h5_names(path))


def test_with_options_on_a_model_from_parts_keeps_its_weights():
    backbone, head = _parts(output_dropout=0.3)
    model = LanguageModel(backbone=backbone, head=head)
    ids = _ids(batch=1)
    model(_ids())
    clone = model.with_options(batch_size=1, output_dropout=0.0, temperature=2.0)
    assert clone.backbone.batch_size == 1 and clone.head.output_dropout == 0.0
    model.reset_states()
    single = model.with_options(batch_size=1)
    np.testing.assert_allclose(
        to_numpy(clone(ids)), 2.0 * to_numpy(single(ids)), rtol=1e-5, atol=1e-5
    )


def test_parts_that_do_not_fit_are_refused():
    backbone, head = _parts()
    with pytest.raises(ValueError, match="Expected the architecture from `backbone=` and `head=` only"):
        LanguageModel(backbone=backbone, head=head, units=9)
    with pytest.raises(ValueError, match="Expected `backbone=` a `RecurrentBackbone`"):
        LanguageModel(backbone=backbone)
    with pytest.raises(ValueError, match="head units=6, backbone units=5"):
        LanguageModel(backbone=backbone, head=LanguageModelHead(V, 6, embedding_dim=4))
    with pytest.raises(ValueError, match="head vocabulary_size=12"):
        LanguageModel(backbone=backbone, head=LanguageModelHead(V - 1, N, embedding_dim=4))
    other = keras.layers.Embedding(V, 4)
    with pytest.raises(ValueError, match="a tied head reading another embedding"):
        LanguageModel(backbone=backbone, head=LanguageModelHead(V, N, embedding_dim=4, embedding=other))


@pytest.mark.parametrize("options", [{}, {"dual": True, "mixture_of_softmaxes": 2}])
def test_call_with_cache_continues_the_prompt_as_one_call_does(options):
    model = LanguageModel(V, units=N, num_layers=2, batch_size=B, temperature=0.7, **options)
    ids = _ids()
    expected = to_numpy(model(ids))
    model.reset_states()
    logits, features, cache = model.call_with_cache(ids[:, :3])
    steps = [to_numpy(logits)]
    for t in range(3, T):
        logits, step_features, cache = model.call_with_cache(ids[:, t : t + 1], cache, t)
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, 1), expected, rtol=1e-5, atol=1e-5)
    assert tuple(features.shape) == (B, 3, model.softmax_width) and len(cache) == 4
    # The carried state is untouched.
    for variable in model.recurrent_state_variables:
        assert not np.any(to_numpy(variable))


@pytest.mark.parametrize(
    "options",
    [{"cell": "rlstm"}, {"cell": "mogrifier_rlstm", "mogrifier_rank": 2}, {"cell": "mogrifier_lstm"}],
)
def test_one_token_calls_from_the_cache_are_the_whole_call_for_every_cell(options):
    # One-step sequences take the cell's per-step weights (no per-sequence
    # preparation, see CellRNN.inner_loop) and skip the sublayers' __call__.
    model = LanguageModel(V, units=N, num_layers=2, batch_size=B, **options)
    ids = _ids(seed=3)
    expected = to_numpy(model(ids))
    model.reset_states()
    cache = None
    steps = []
    for t in range(T):
        logits, _, cache = model.call_with_cache(ids[:, t : t + 1], cache)
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, 1), expected, rtol=1e-5, atol=1e-5)


def _count_layer_calls(monkeypatch):
    calls = []
    original = keras.layers.Layer.__call__

    def counting(self, *args, **kwargs):
        calls.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "__call__", counting)
    return calls


def test_a_call_from_a_state_at_inference_skips_the_sublayers_call_machinery(monkeypatch):
    # Keras's Layer.__call__ adds nothing at inference in full precision but
    # its cost (a quarter of a generated token's time on PyTorch).
    model = LanguageModel(V, units=N, num_layers=2, batch_size=B, cell="rlstm")
    model.build((B, None))
    calls = _count_layer_calls(monkeypatch)
    model.call_with_cache(_ids(time=1))
    assert calls == []
    # Training (dropout) goes through them.
    model.backbone.call_with_state(_ids(time=1), training=True)
    assert "embedding" in calls and "input_dropout" in calls


@pytest.mark.parametrize("cell", ["rlstm", "mogrifier_lstm"])
def test_a_call_from_a_state_at_inference_draws_no_dropout_mask(cell, monkeypatch):
    # `keras.layers.RNN.call` prepares the cells' dropout masks at every
    # call, inference included (a draw that is never used); the lean path
    # runs the time loop itself, with the full call's numbers.
    model = LanguageModel(
        V, units=N, num_layers=2, batch_size=B, cell=cell, state_dropout=0.2,
        mogrifier_rounds=2 if cell == "mogrifier_lstm" else 0,
    )
    model.build((B, None))
    cell_class = type(model.backbone.recurrent_layers[0].cell)
    draws = []
    original = cell_class._create_dropout_mask
    monkeypatch.setattr(
        cell_class, "_create_dropout_mask",
        lambda self, *args: draws.append(self.name) or original(self, *args))
    ids = _ids(seed=5, time=3)
    logits, _, cache = model.call_with_cache(ids[:, :2])
    logits_next, _, _ = model.call_with_cache(ids[:, 2:], cache)
    assert draws == []
    model.reset_states()
    expected = to_numpy(model(ids, training=False))
    np.testing.assert_allclose(
        np.concatenate([to_numpy(logits), to_numpy(logits_next)], 1), expected,
        rtol=1e-5, atol=1e-5,
    )
    model.backbone.call_with_state(ids, training=True)  # training draws them
    assert len(draws) >= 2


def _made_under_mixed_precision(make):
    """`make()` under the global `mixed_float16` policy (float32 again after)."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        return make()
    finally:
        keras.config.set_dtype_policy("float32")


def test_a_call_from_a_state_under_mixed_precision_keeps_the_call_machinery(monkeypatch):
    # Layer.__call__'s autocast matters there: the full path runs, and gives
    # the stateful call's numbers.
    model = _made_under_mixed_precision(
        lambda: LanguageModel(V, units=N, num_layers=2, batch_size=B, cell="rlstm")
    )
    assert model.backbone.embedding.dtype_policy.name == "mixed_float16"
    ids = _ids(seed=4)
    expected = to_numpy(model(ids)).astype("float32")
    calls = _count_layer_calls(monkeypatch)
    logits, _, _ = model.call_with_cache(ids)
    assert "embedding" in calls
    np.testing.assert_allclose(to_numpy(logits).astype("float32"), expected, rtol=1e-2, atol=1e-2)


def test_a_float32_backbone_over_mixed_precision_layers_keeps_the_call_machinery(monkeypatch):
    # The backbone's own policy is not enough: its sublayers took the global
    # policy when they were made.
    backbone = _made_under_mixed_precision(
        lambda: RecurrentBackbone(V, units=N, num_layers=2, batch_size=B, dtype="float32")
    )
    backbone.build((B, None))
    assert backbone.dtype_policy.name == "float32"
    assert backbone.embedding.dtype_policy.name == "mixed_float16"
    calls = _count_layer_calls(monkeypatch)
    backbone.call_with_state(_ids(time=1))
    assert "embedding" in calls
