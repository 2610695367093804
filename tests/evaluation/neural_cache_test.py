"""NeuralCache against a NumPy implementation of Krause et al.'s eq. 3."""

import numpy as np
import pytest

from keras_mogrifier import NeuralCache
from keras_mogrifier.models import LanguageModel

import reference
from testing import to_numpy

V = 17


def model_for(cell="lstm", dual=False, batch=1, seed=0):
    model = LanguageModel(V, units=8, num_layers=2, cell=cell, mogrifier_rounds=2,
                          mogrifier_rank=2, dual=dual, batch_size=batch)
    model.build((batch, None))
    rng = np.random.default_rng(seed)
    for v in model.trainable_variables:
        v.assign(rng.uniform(-0.6, 0.6, v.shape).astype("float32"))
    return model


def numpy_cache_losses(model, stream, cache_size, lam, theta):
    """Eq. 3 position by position, on the model's own vectors (one pass)."""
    model.reset_states()
    features, logits = model.features_and_logits(stream[None, :-1])
    model.reset_states()
    z = to_numpy(logits)[0].astype("float64")
    log_p_model = z - z.max(-1, keepdims=True)
    log_p_model -= np.log(np.exp(log_p_model).sum(-1, keepdims=True))
    return reference.neural_cache_losses(to_numpy(features)[0], log_p_model, stream[1:],
                                         cache_size, lam, theta)


@pytest.mark.parametrize("cell, dual", [("lstm", False), ("mogrifier_rlstm", True)])
def test_matches_numpy_eq_3_across_segments_and_the_window(cell, dual):
    model = model_for(cell, dual)
    stream = np.tile(np.random.default_rng(1).integers(0, V, 9), 4)[:33]
    # 32 predicted tokens in segments of 5; the window (7) is shorter than the stream.
    cache = NeuralCache(model, cache_size=7, interpolation=0.3, flatness=0.4, segment_length=5)
    result = cache.evaluate(stream, verbose=0, return_token_losses=True)
    expected = numpy_cache_losses(model, stream, 7, 0.3, 0.4)
    np.testing.assert_allclose(result["token_losses"][0], expected, rtol=2e-5, atol=2e-6)
    assert result["loss"] == pytest.approx(expected.mean(), rel=1e-5)
    # The cache matters here: without it the losses differ.
    assert np.abs(numpy_cache_losses(model, stream, 7, 0.0, 0.4) - expected).max() > 1e-2


def test_zero_interpolation_is_static_evaluation():
    from keras_mogrifier import DynamicEvaluator

    model = model_for()
    stream = np.random.default_rng(2).integers(0, V, 40)
    cached = NeuralCache(model, interpolation=0.0, segment_length=5).evaluate(
        stream, verbose=0, return_token_losses=True
    )
    static = DynamicEvaluator(model, segment_length=5).evaluate(
        stream, verbose=0, adapt=False, return_token_losses=True
    )
    # To float rounding, not bitwise: the evaluator scores a stateful model
    # in windows of many segments, the cache one segment per call, and
    # PyTorch's kernels for the two shapes may round differently (a last-bit
    # difference, 2.4e-7, was seen on PyTorch beside other jobs).
    np.testing.assert_allclose(
        cached["token_losses"], static["token_losses"], rtol=1e-6, atol=1e-6
    )


def test_lowers_the_loss_of_a_repeated_passage_and_leaves_the_model_as_it_was():
    model = model_for(batch=2)
    passage = np.random.default_rng(3).integers(0, V, 30)
    text = np.concatenate([passage, passage])
    model.reset_states()
    model(np.zeros((2, 3), "int32"))  # some carried state to restore
    states = [to_numpy(v).copy() for v in model.weights]
    cache = NeuralCache(model, cache_size=100, interpolation=0.5, flatness=10.0)
    result = cache.evaluate(np.stack([text, text[::-1]]), batch_size=2, verbose=0,
                            return_token_losses=True)
    static = NeuralCache(model, interpolation=0.0).evaluate(
        text, verbose=0, return_token_losses=True
    )
    repeat = slice(30, None)
    # (An untrained model's vectors tell contexts apart only a little.)
    assert result["token_losses"][0, repeat].mean() < 0.97 * static["token_losses"][0, repeat].mean()
    assert result["num_tokens"] == 2 * 59
    for v, before in zip(model.weights, states):
        np.testing.assert_array_equal(to_numpy(v), before)


def test_search_picks_the_best_pair_from_one_pass():
    model = model_for()
    text = np.tile(np.random.default_rng(4).integers(0, V, 12), 5)
    cache = NeuralCache(model, cache_size=50)
    best = cache.search(text, interpolations=[0.0, 0.2, 0.5], flatnesses=[0.1, 1.0])
    assert len(best["losses"]) == 6
    for (lam, theta), loss in best["losses"].items():
        expected = numpy_cache_losses(model, text, 50, lam, theta).mean()
        assert loss == pytest.approx(expected, rel=1e-5)
    assert best["loss"] == min(best["losses"].values())
    assert (cache.interpolation, cache.flatness) == (best["interpolation"], best["flatness"])
    assert best["static_loss"] == pytest.approx(best["losses"][(0.0, 0.1)], rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"interpolation": 1.0}, "interpolation"),
        ({"interpolation": -0.1}, "interpolation"),
        ({"flatness": 0.0}, "flatness"),
        ({"cache_size": 0}, "cache_size"),
        ({"segment_length": 0}, "segment_length"),
        ({"jit_compile": "yes"}, "jit_compile"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(kwargs, message):
    model = model_for()
    with pytest.raises(ValueError, match=message):
        NeuralCache(model, **kwargs)


def test_bad_inputs_are_refused():
    import keras

    with pytest.raises(ValueError, match="features_and_logits"):
        NeuralCache(keras.Sequential([keras.layers.Dense(2)]))
    model = model_for()
    cache = NeuralCache(model)
    with pytest.raises(ValueError, match=r"token ids in \[0, "):
        cache.evaluate(np.array([1, 2, V]), verbose=0)
    with pytest.raises(ValueError, match="capacity"):
        cache.evaluate(np.zeros((3, 5), "int32"), batch_size=3, verbose=0)
    with pytest.raises(ValueError, match="interpolation"):
        cache.search(np.arange(10), interpolations=[1.5])
