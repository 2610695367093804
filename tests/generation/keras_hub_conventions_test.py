"""keras-hub's `CausalLM` conventions on `LanguageModel`: `compile(sampler=)`,
`generate(..., strip_prompt=)` and an optional `max_length`."""

import keras
import numpy as np
import pytest

from keras_mogrifier import samplers
from keras_mogrifier.generation.generate import DEFAULT_NEW_TOKENS

from generate_test import WORDS
from generate_test import make_model

PROMPTS = [[3, 4, 5], [2, 6]]


@pytest.fixture(scope="module")
def model():
    return make_model(batch_size=2, num_layers=1)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_compile_sampler_is_the_default_of_generate_and_a_call_may_override_it(model):
    model.compile(optimizer="adam", sampler=samplers.TopKSampler(k=4, temperature=2.0))
    assert isinstance(model.sampler, samplers.TopKSampler) and model.sampler.k == 4
    compiled = model.generate(PROMPTS, max_length=9, seed=3, stop_token_ids=None)
    explicit = model.generate(PROMPTS, 9, "top_k", k=4, temperature=2.0, seed=3,
                              stop_token_ids=None)
    _same(compiled, explicit)
    greedy = model.generate(PROMPTS, 9, "greedy", stop_token_ids=None)
    assert any(not np.array_equal(a, b) for a, b in zip(compiled, greedy))
    # A name, as keras-hub takes it; a model never given one is greedy.
    model.compile(optimizer="adam", sampler="greedy")
    _same(model.generate(PROMPTS, 9, stop_token_ids=None), greedy)
    fresh = make_model(batch_size=2, num_layers=1)
    assert getattr(fresh, "sampler", None) is None
    _same(fresh.generate(PROMPTS, 9, stop_token_ids=None), greedy)


@pytest.mark.parametrize(
    "sampler, message",
    [("top_q", "one of"), (keras.layers.Dense(2), "Sampler"), (3, "one of")],
)
def test_a_bad_sampler_is_refused_before_compile_changes_anything(model, sampler, message):
    model.compile(optimizer="adam", sampler="top_p")
    optimizer, before = model.optimizer, model.sampler
    with pytest.raises(ValueError, match=message):
        model.compile(optimizer="sgd", sampler=sampler)
    assert model.optimizer is optimizer and model.sampler is before


def test_max_length_defaults_to_the_longest_prompt_and_100_new_tokens(model):
    out = model.generate(PROMPTS, stop_token_ids=None, sampler="greedy")
    assert [len(o) for o in out] == [3 + DEFAULT_NEW_TOKENS] * 2
    assert DEFAULT_NEW_TOKENS == 100
    longer = model.generate(PROMPTS, max_length=3 + DEFAULT_NEW_TOKENS, sampler="greedy",
                            stop_token_ids=None)
    _same(out, longer)


def test_strip_prompt_returns_the_new_tokens_only(model):
    full = model.generate(PROMPTS, 8, "greedy", stop_token_ids=None)
    stripped = model.generate(PROMPTS, 8, "greedy", stop_token_ids=None, strip_prompt=True)
    _same(stripped, [f[len(p):] for f, p in zip(full, PROMPTS)])
    assert [len(s) for s in stripped] == [5, 6]
    text = model.generate("the company", 5, "greedy", stop_token_ids=None)
    new = model.generate("the company", 5, "greedy", stop_token_ids=None, strip_prompt=True)
    assert text.split() == ["the", "company"] + new.split()
    assert WORDS.decode(WORDS.encode(new)) == new
    with pytest.raises(ValueError, match="strip_prompt"):
        model.generate(PROMPTS, 8, strip_prompt="yes")
