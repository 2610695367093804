"""Decoder: every argument checked on the host before the step runs, and a
refused or failing step leaves the carried state as it was, on every backend."""

import numpy as np
import pytest
from keras import ops
from testing import to_numpy

from generate_test import make_model
from keras_mogrifier import samplers
from keras_mogrifier.generation import Decoder

V = 17


def _state(model):
    return [to_numpy(v).copy() for v in model.recurrent_state_variables]


def _assert_state(model, before):
    for v, b in zip(model.recurrent_state_variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)


@pytest.fixture(scope="module")
def model():
    model = make_model()
    rng = np.random.default_rng(0)
    for v in model.recurrent_state_variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    return model


U = np.full(3, 0.5, "float32")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: d.read([[1, V]], [[1, 2]]), r"Expected `inputs` to hold token ids in \[0, 17\)"),
        (lambda d: d.read([[1, -1]], [[1, 2]]), r"an id -1"),
        (lambda d: d.read([[1, 2]], [[1, V]]), r"Expected `targets` to hold token ids"),
        (lambda d: d.read(np.array([[1.0, 2.5]]), [[1, 2]]), r"integer token ids.*float64"),
        (lambda d: d.read([[1, 2]], [[1, 2, 3]]), r"Expected `targets` of the shape"),
        (lambda d: d.read(np.zeros((4, 2), "int32"), np.zeros((4, 2), "int32")),
         r"between 1 and 3 rows"),
        (lambda d: d.step(np.array([1, V, 2]), U), r"Expected `tokens` to hold token ids"),
        (lambda d: d.step(np.array([1, -1, 2]), U), r"an id -1"),
        (lambda d: d.step(np.array([1.0, 2.0, 3.0]), U), r"integer token ids"),
        (lambda d: d.step(np.array([1, 2, 3]), np.array([0.5, 1.0, 0.2], "float32")),
         r"Expected `uniform` to hold numbers in \[0, 1\). Received: 1.0 at row 1"),
        (lambda d: d.step(np.array([1, 2, 3]), np.array([0.5, np.nan, 0.2], "float32")),
         r"numbers in \[0, 1\)"),
        (lambda d: d.step(np.array([1, 2, 3]), np.zeros(2, "float32")),
         r"shape \(3,\), one number in \[0, 1\) per row"),
        (lambda d: d.step(np.array([1, 2, 3]), U, samplers.BeamSampler(num_beams=3)),
         r"picks one token per row \(beam search runs through `beam_step`\)"),
        (lambda d: d.step(np.array([1, 2, 3]), U, "greedy"), r"Expected a `keras_mogrifier"),
        (lambda d: d.beam_step(np.array([1, 2, 3]), np.zeros((1, 3), "float32"),
                               np.ones(1, bool), np.array([1]), np.zeros(3, bool), 0,
                               samplers.GreedySampler()),
         r"Expected a `keras_mogrifier.samplers.BeamSampler`"),
        (lambda d: d.beam_step(np.array([1, V, 3]), np.zeros((1, 3), "float32"),
                               np.ones(1, bool), np.array([1]), np.zeros(3, bool), 0,
                               samplers.BeamSampler(num_beams=3)),
         r"Expected `tokens` to hold token ids"),
        (lambda d: d.beam_step(np.array([1, 2, 3]), np.zeros((1, 3), "float32"),
                               np.ones(1, bool), np.array([1]), np.zeros(3, bool), V,
                               samplers.BeamSampler(num_beams=3)),
         r"Expected `pad` to hold token ids"),
    ],
)
def test_bad_arguments_are_refused_before_the_state_moves(model, call, message):
    decoder = Decoder(model)
    before = _state(model)
    with pytest.raises(ValueError, match=message):
        call(decoder)
    _assert_state(model, before)


class Raising(samplers.Sampler):
    def get_next_token(self, probabilities, uniform):
        raise RuntimeError("a custom sampler that fails")


class NoNextToken(samplers.Sampler):
    pass


def test_a_failing_custom_sampler_leaves_the_state_as_it_was(model):
    decoder = Decoder(model)
    before = _state(model)
    with pytest.raises(RuntimeError, match="a custom sampler that fails"):
        decoder.step(np.array([1, 2, 3]), U, Raising())
    _assert_state(model, before)
    with pytest.raises(NotImplementedError, match=r"`NoNextToken` must override "
                       r"`get_next_token\(self, probabilities, uniform\)`"):
        decoder.step(np.array([1, 2, 3]), U, NoNextToken())
    _assert_state(model, before)


def test_a_refused_step_does_not_spoil_the_beam_step(model):
    """step and beam_step keep their compiled functions apart."""
    decoder = Decoder(model)
    beam = samplers.BeamSampler(num_beams=3)
    with pytest.raises(ValueError):
        decoder.step(np.array([1, 2, 3]), U, beam)
    assert decoder._steps == {}
    args = (np.array([1, 2, 3]), np.array([[0.0, -1e9, -1e9]], "float32"), np.ones(1, bool),
            np.array([1]), np.zeros(3, bool), 0)
    with decoder.fresh_state():
        tokens, scores, parents = decoder.beam_step(*args, beam)
    assert to_numpy(tokens).shape == (3,) and to_numpy(scores).shape == (1, 3)
    # A greedy step after a beam step: each has its own function.
    with decoder.fresh_state():
        tokens, _ = decoder.step(np.array([1, 2, 3]), U, samplers.GreedySampler())
    assert to_numpy(tokens).shape == (3,)


@pytest.mark.parametrize("jit_compile", [True, False])
def test_tiny_temperatures_are_greedy_and_below_the_floor_refused(jit_compile):
    """temperature=1e-30 under XLA repeated one token: the logits are shifted
    by their maximum before the division, so every temperature down to the
    floor is the greedy limit exactly."""
    model = make_model(scale=0.3)
    kwargs = dict(max_length=12, stop_token_ids=None, jit_compile=jit_compile)
    prompts = [[3, 4, 5], [2], [10, 11]]
    greedy = model.generate(prompts, **kwargs)
    for name in ("random", "top_k", "top_p"):
        cold = model.generate(prompts, sampler=name, temperature=1e-30, seed=5, **kwargs)
        for a, b in zip(cold, greedy):
            np.testing.assert_array_equal(a, b)
    beams = model.generate([[3, 4, 5]], sampler="beam", num_beams=1, temperature=1e-30,
                           **kwargs)
    np.testing.assert_array_equal(beams[0], greedy[0])
    with pytest.raises(ValueError, match=r"Expected `temperature` ≥ 1e-30"):
        model.generate(prompts, sampler="random", temperature=1e-31, **kwargs)
