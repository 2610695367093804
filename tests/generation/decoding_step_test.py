"""`generate`'s decoding steps: PyTorch's own (`backend.decoding_step`) and
the compiled ones (`Decoder.generation_steps`) read the prompts into the
carried state `Decoder.step` leaves and pick the ids it picks, bit for bit;
the known tokens are read without their logits."""

import keras
import numpy as np
import pytest
from testing import BACKEND
from testing import to_numpy

from generate_test import make_model
from keras_mogrifier import backend
from keras_mogrifier import samplers
from keras_mogrifier.generation import decoder as decoder_lib
from keras_mogrifier.models import LanguageModel

ROWS, STEPS = 3, 12


def _state(model):
    return [to_numpy(v).copy() for v in model.recurrent_state_variables]


def _run(model, sampler, prompts, through_step):
    """The ids of `STEPS` steps after the prompts, and the carried state
    after them, through `Decoder.step` or `generate`'s steps; the model's
    own state kept."""
    decoder = decoder_lib.decoder_for(model)
    # One row of uniforms per position, whichever way it is read.
    uniforms = np.random.default_rng(5).random(
        (prompts.shape[1] + STEPS, len(prompts)), dtype=np.float32
    )
    ids = []
    with decoder.fresh_state():
        if through_step:
            def step(tokens, uniform):
                next_ids, _ = decoder.step(tokens, uniform, sampler)
                return np.asarray(to_numpy(next_ids))

            # Known tokens: as `read` would read them (in windows where the
            # model is compiled: a compiled window of several tokens need
            # not round like as many one-token calls).
            read = 0
            if backend.decoding_step(model) is None:
                read = decoder.read_known(prompts, prompts.shape[1] - 1)
        else:
            read, step = decoder.generation_steps(sampler)
            read = read(prompts, prompts.shape[1] - 1)
        for t in range(read, prompts.shape[1]):
            next_ids = step(prompts[:, t], uniforms[t])
        for t in range(prompts.shape[1], prompts.shape[1] + STEPS):
            ids.append(next_ids)
            next_ids = step(next_ids, uniforms[t])
        state = _state(model)
    return np.stack(ids, 1), state


SAMPLERS = {
    "greedy": samplers.GreedySampler(),
    "greedy_t2": samplers.GreedySampler(temperature=2.0),
    "random": samplers.RandomSampler(temperature=0.7),
    "top_k": samplers.TopKSampler(k=4),
}
MODELS = {
    "lstm": {"cell": "lstm"},
    "rlstm": {"cell": "rlstm"},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm"},
    "mogrifier_lstm_plain": {"cell": "mogrifier_lstm", "residual": False},
    "rlstm_skip_untied": {
        "cell": "rlstm", "residual": False, "skip_connections": True,
        "tie_embeddings": False,
    },
}


@pytest.mark.parametrize("sampler", list(SAMPLERS), ids=list(SAMPLERS))
@pytest.mark.parametrize("options", list(MODELS.values()), ids=list(MODELS))
def test_the_generation_steps_pick_the_ids_and_leave_the_state_of_step(options, sampler):
    model = make_model(batch_size=ROWS, **options)
    # A temperature of the model's own: an output layer without it would
    # change the random samplers' ids.
    model.set_temperature(0.6)
    sampler = SAMPLERS[sampler]
    # On PyTorch the package's models run PyTorch's own step; elsewhere the
    # compiled steps, without their host checks.
    assert (backend.decoding_step(model) is not None) == (BACKEND == "torch")
    prompts = np.random.default_rng(1).integers(0, model.vocabulary_size, (ROWS, 6))
    before = _state(model)
    expected_ids, expected_state = _run(model, sampler, prompts, through_step=True)
    ids, state = _run(model, sampler, prompts, through_step=False)
    np.testing.assert_array_equal(ids, expected_ids)
    for value, expected in zip(state, expected_state):
        np.testing.assert_array_equal(value, expected)
    for variable, value in zip(model.recurrent_state_variables, before):
        np.testing.assert_array_equal(to_numpy(variable), value)


def test_generate_reads_the_weights_of_each_call():
    # PyTorch's step reads the weights when it is made: `generate` makes
    # one per call, so a change of weights between calls is seen.
    model = make_model(batch_size=1, cell="rlstm")
    prompt = [3, 4, 5]
    first = model.generate(prompt, max_length=12, stop_token_ids=None)
    rng = np.random.default_rng(9)
    for weight in model.trainable_weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape).astype("float32"))
    second = model.generate(prompt, max_length=12, stop_token_ids=None)
    expected, _ = _run(model, samplers.GreedySampler(), np.array([prompt]), True)
    assert list(second[3:]) == list(expected[0, : 12 - 3])
    assert list(first) != list(second)


@pytest.mark.parametrize(
    "options",
    [
        {"dual": True},
        {"mixture_of_softmaxes": 2},
        {"embedding_dim": 6},
        {"adaptation_units": 4},
    ],
    ids=["dual", "mixture", "projection", "adaptation"],
)
def test_models_outside_pytorchs_step_take_the_compiled_one(options):
    model = make_model(batch_size=ROWS, cell="rlstm", **options)
    sampler = samplers.GreedySampler()
    assert backend.decoding_step(model) is None
    prompts = np.random.default_rng(2).integers(0, model.vocabulary_size, (ROWS, 3))
    expected_ids, expected_state = _run(model, sampler, prompts, through_step=True)
    ids, state = _run(model, sampler, prompts, through_step=False)
    np.testing.assert_array_equal(ids, expected_ids)
    for value, expected in zip(state, expected_state):
        np.testing.assert_array_equal(value, expected)


def test_a_mixed_precision_model_takes_the_compiled_step():
    keras.config.set_dtype_policy("mixed_float16" if BACKEND != "tensorflow" else "float32")
    try:
        model = make_model(batch_size=1, cell="rlstm")
    finally:
        keras.config.set_dtype_policy("float32")
    if BACKEND != "tensorflow":  # (TensorFlow's CPU kernels lack some float16 ones)
        assert backend.decoding_step(model) is None


def test_the_generation_steps_take_a_one_token_sampler_only():
    decoder = decoder_lib.decoder_for(make_model())
    for sampler in (samplers.BeamSampler(num_beams=2), "greedy", None):
        with pytest.raises(ValueError, match="Expected a `keras_mogrifier.samplers.Sampler`"):
            decoder.generation_steps(sampler)


class _OwnCache(LanguageModel):
    """A subclass with its own `call_with_cache` (its windows and steps go
    through it)."""

    def call_with_cache(self, token_ids, cache=None, cache_update_index=None):
        self.cache_calls = getattr(self, "cache_calls", 0) + 1
        return super().call_with_cache(token_ids, cache, cache_update_index)


@pytest.mark.parametrize("own_cache", [False, True], ids=["package", "subclass"])
def test_known_tokens_are_read_into_the_state_read_leaves(own_cache):
    cls = _OwnCache if own_cache else LanguageModel
    keras.utils.set_random_seed(0)
    model = cls(17, units=8, num_layers=2, cell="mogrifier_rlstm", batch_size=2)
    model.build((2, None))
    rng = np.random.default_rng(4)
    for weight in model.trainable_weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape).astype("float32"))
    tokens = rng.integers(0, 17, (2, 26)).astype("int32")
    decoder = decoder_lib.decoder_for(model)
    with decoder.fresh_state():
        for start, window in ((0, 16), (16, 4), (20, 4)):
            decoder.read(tokens[:, start : start + window], tokens[:, start + 1 : start + window + 1])
        expected = _state(model)
    model.cache_calls = 0
    with decoder.fresh_state():
        assert decoder.read_known(tokens, 25) == 24
        state = _state(model)
    # The subclass's windows go through its `call_with_cache` (JAX calls it
    # when it traces a window's shape); the package's model reads with its
    # backbone alone.
    assert (model.cache_calls > 0) == own_cache
    for value, want in zip(state, expected):
        np.testing.assert_array_equal(value, want)


@pytest.mark.parametrize("ulps, temperature", [(1, 1.0), (13, 10.0)])
def test_greedy_picks_what_greedy_sampler_picks_where_rounding_ties_two_tokens(
    ulps, temperature
):
    # Logits 0.1 and a float32 a few ulps above it: `argmax(logits)` is the
    # second, but `exp(−gap / temperature)` rounds to 1 (and, for the
    # wider gap, only after the division by the temperature), so
    # `GreedySampler`'s probabilities tie and its argmax is the first.
    # Every backend's generation step picks what `GreedySampler` picks.
    model = LanguageModel(5, units=4, num_layers=1, batch_size=1)
    model.build((1, None))
    model.backbone.embedding.embeddings.assign(np.zeros((5, 4), "float32"))
    above = np.float32(0.1)
    for _ in range(ulps):
        above = np.nextafter(above, np.float32(1.0))
    logits = np.array([-9.0, 0.1, above, -9.0, -9.0], "float32")
    model.head.output_bias.assign(logits)
    sampler = samplers.GreedySampler(temperature=temperature)
    assert int(np.argmax(logits)) == 2
    assert to_numpy(sampler(logits[None], np.zeros(1, "float32"))).tolist() == [1]
    if temperature != 1.0:  # without the division the tie would not be there
        assert to_numpy(samplers.GreedySampler()(logits[None], np.zeros(1, "float32"))).tolist() == [2]
    ids, _ = _run(model, sampler, np.array([[3]]), through_step=False)
    assert ids.tolist() == [[1] * STEPS]
