"""The samplers: keras-hub's names and meanings, driven by one uniform per row."""

import numpy as np
import pytest
from testing import to_numpy

from keras_mogrifier import samplers
from keras_mogrifier.samplers import GreedySampler
from keras_mogrifier.samplers import RandomSampler
from keras_mogrifier.samplers import TopKSampler
from keras_mogrifier.samplers import TopPSampler
from keras_mogrifier.samplers import sample_from

PROBABILITIES = np.array([0.1, 0.4, 0.05, 0.25, 0.2], "float32")
N = 2000
# Evenly spread uniforms: the inverse CDF then gives exact frequencies.
GRID = ((np.arange(N) + 0.5) / N).astype("float32")


def _draw(sampler, probabilities=PROBABILITIES, uniform=GRID):
    logits = np.log(np.tile(probabilities, (len(uniform), 1))).astype("float32")
    return to_numpy(sampler(logits, uniform))


def _frequencies(tokens, size=len(PROBABILITIES)):
    return np.bincount(tokens, minlength=size) / len(tokens)


def test_random_sampler_draws_each_token_with_its_probability():
    np.testing.assert_allclose(_frequencies(_draw(RandomSampler())), PROBABILITIES, atol=1e-3)


def test_temperature_divides_the_logits():
    tempered = PROBABILITIES ** (1 / 2.0)
    tempered /= tempered.sum()
    frequencies = _frequencies(_draw(RandomSampler(temperature=2.0)))
    np.testing.assert_allclose(frequencies, tempered, atol=1e-3)


def test_top_k_keeps_the_k_most_probable_renormalised():
    frequencies = _frequencies(_draw(TopKSampler(k=2)))
    np.testing.assert_allclose(frequencies, [0, 0.4 / 0.65, 0, 0.25 / 0.65, 0], atol=1e-3)


def test_top_p_keeps_the_smallest_set_reaching_p():
    # Sorted: 0.4, 0.25, 0.2, 0.1, 0.05. p = 0.6 needs 0.4 + 0.25.
    frequencies = _frequencies(_draw(TopPSampler(p=0.6)))
    np.testing.assert_allclose(frequencies, [0, 0.4 / 0.65, 0, 0.25 / 0.65, 0], atol=1e-3)
    # p = 0.66 needs a third token.
    frequencies = _frequencies(_draw(TopPSampler(p=0.66)))
    np.testing.assert_allclose(frequencies, [0, 0.4 / 0.85, 0, 0.25 / 0.85, 0.2 / 0.85], atol=1e-3)
    # With `k`, only the k most probable are considered.
    frequencies = _frequencies(_draw(TopPSampler(p=0.9, k=2)))
    np.testing.assert_allclose(frequencies, [0, 0.4 / 0.65, 0, 0.25 / 0.65, 0], atol=1e-3)


def test_greedy_and_temperature_towards_zero():
    assert set(_draw(GreedySampler(temperature=3.0))) == {1}
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 50)).astype("float32") * 3
    uniform = rng.random(64, dtype=np.float32)
    greedy = to_numpy(GreedySampler()(logits, uniform))
    np.testing.assert_array_equal(greedy, logits.argmax(-1))
    for sampler in (RandomSampler, TopKSampler, TopPSampler):
        np.testing.assert_array_equal(to_numpy(sampler(temperature=1e-6)(logits, uniform)), greedy)


def test_sample_from_never_picks_a_zero_weight():
    weights = np.array([[0.0, 0.3, 0.0, 0.7, 0.0]] * 4, "float32")
    # The largest float32 below 1 must not fall off the end of the row.
    uniform = np.array([0.0, 0.3, 0.99, np.nextafter(np.float32(1), np.float32(0))], "float32")
    np.testing.assert_array_equal(to_numpy(sample_from(weights, uniform)), [1, 3, 3, 3])


def test_get_by_name_and_errors():
    assert isinstance(samplers.get("top_k", k=3), TopKSampler)
    assert samplers.get("beam", num_beams=3).get_config() == {"temperature": 1.0, "num_beams": 3}
    with pytest.raises(ValueError, match="Expected `BeamSampler` to run through"):
        samplers.BeamSampler()(np.zeros((1, 3), "float32"), np.zeros(1, "float32"))
    assert samplers.get("top_p", p=0.5, temperature=0.7).get_config() == {
        "temperature": 0.7, "p": 0.5, "k": None,
    }
    sampler = TopKSampler(k=3)
    assert samplers.get(sampler) is sampler
    with pytest.raises(ValueError, match="Expected `sampler` to be one of"):
        samplers.get("nucleus")
    with pytest.raises(ValueError, match=r"Expected only \['temperature'\] for sampler='greedy'"):
        samplers.get("greedy", k=3)
    with pytest.raises(ValueError, match="only with a sampler name"):
        samplers.get(sampler, temperature=2.0)
    with pytest.raises(ValueError, match="Expected `k` to be a positive integer"):
        TopKSampler(k=0)
    with pytest.raises(ValueError, match=r"Expected `p` to be a float in \(0, 1\]"):
        TopPSampler(p=1.5)
    with pytest.raises(ValueError, match="Expected `temperature` to be a finite positive number"):
        RandomSampler(temperature=0.0)


@pytest.mark.parametrize(
    "logits, uniform, message",
    [
        (np.array([[0.0, np.nan, 1.0]], "float32"), np.zeros(1, "float32"),
         r"Expected finite logits .*NaN or \+inf in row 0"),
        (np.array([[0.0, np.inf, 1.0]], "float32"), np.zeros(1, "float32"), r"\+inf"),
        (np.array([[-np.inf, -np.inf]], "float32"), np.zeros(1, "float32"),
         r"at least one finite logit per row"),
        (np.zeros(3, "float32"), np.zeros(1, "float32"),
         r"Expected `logits` of shape \(batch, vocabulary\). Received: logits.shape=\(3,\)"),
        (np.zeros((1, 2, 3), "float32"), np.zeros(1, "float32"), r"logits.shape=\(1, 2, 3\)"),
        (np.zeros((2, 3), "float32"), np.zeros(3, "float32"),
         r"Expected `uniform` of shape \(2,\)"),
        (np.zeros((2, 3), "float32"), np.zeros((2, 1), "float32"), r"uniform.shape=\(2, 1\)"),
        (np.zeros((2, 3), "float32"), np.array([0.5, 1.0], "float32"),
         r"Expected `uniform` to hold floats in \[0, 1\)"),
        (np.zeros((2, 3), "float32"), np.array([-0.1, 0.5], "float32"), r"min -0.1"),
        (np.zeros((2, 3), "float32"), np.array([0, 0]), r"dtype int"),
    ],
)
@pytest.mark.parametrize("name", ["greedy", "random", "top_k", "top_p"])
def test_direct_calls_refuse_bad_logits_and_uniforms(name, logits, uniform, message):
    with pytest.raises(ValueError, match=message):
        samplers.get(name)(logits, uniform)


def test_minus_infinity_is_a_token_that_cannot_come_out():
    logits = np.log(np.array([[0.0, 0.5, 0.5]], "float32"))  # -inf for token 0
    tokens = {int(to_numpy(RandomSampler()(logits, np.array([u], "float32")))[0])
              for u in (0.0, 0.3, 0.7, 0.99)}
    assert tokens == {1, 2}


def test_a_subclass_without_get_next_token_says_what_to_override():
    class Mine(samplers.Sampler):
        pass

    with pytest.raises(NotImplementedError, match=r"`Mine` must override "
                       r"`get_next_token\(self, probabilities, uniform\)`"):
        Mine()(np.zeros((1, 3), "float32"), np.zeros(1, "float32"))


def test_temperature_floor_and_the_greedy_limit_at_it():
    with pytest.raises(ValueError, match=r"Expected `temperature` ≥ 1e-30"):
        RandomSampler(temperature=1e-31)
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(32, 40)) * 50).astype("float32")
    uniform = rng.random(32, dtype=np.float32)
    for sampler in (RandomSampler, TopKSampler, TopPSampler):
        np.testing.assert_array_equal(
            to_numpy(sampler(temperature=1e-30)(logits, uniform)), logits.argmax(-1))
