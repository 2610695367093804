"""generate runs through LanguageModel.call_with_cache, keras-hub's way."""

import numpy as np
import pytest
from testing import to_numpy

from keras_mogrifier import backend
from keras_mogrifier.generation import decoder as decoder_lib
from keras_mogrifier.models import LanguageModel

from generate_test import PROMPTS
from generate_test import make_model


def greedy_through_the_cache(model, prompt, max_length):
    """keras-hub's loop: one call over the prompt seeds the cache, then one
    `call_with_cache` per new token (the carried state is not used)."""
    ids = np.asarray([prompt], "int32")
    logits, _, cache = model.call_with_cache(ids)
    output = list(prompt)
    while len(output) < max_length:
        output.append(int(np.argmax(to_numpy(logits)[0, -1])))
        ids = np.asarray([[output[-1]]], "int32")
        logits, _, cache = model.call_with_cache(ids, cache, len(output) - 1)
    return output


@pytest.mark.parametrize(
    "options", [{}, {"cell": "mogrifier_rlstm", "dual": True, "mixture_of_softmaxes": 2}],
    ids=["lstm", "dual_mos"],
)
def test_generate_calls_call_with_cache_and_agrees_with_a_cache_loop(options, monkeypatch):
    model = make_model(**options)
    calls = []
    original = LanguageModel.call_with_cache

    def spy(self, token_ids, cache=None, cache_update_index=None):
        calls.append(tuple(token_ids.shape))
        return original(self, token_ids, cache, cache_update_index)

    monkeypatch.setattr(LanguageModel, "call_with_cache", spy)
    outputs = model.generate(PROMPTS, max_length=12, stop_token_ids=None)
    if backend.decoding_step(model) is None:
        # Every step went through the cache.
        assert calls and all(shape[1] == 1 for shape in calls)
    else:
        # PyTorch's own decoding step (the same numbers:
        # tests/generation/decoding_step_test.py) instead.
        assert calls == []
    monkeypatch.setattr(LanguageModel, "call_with_cache", original)
    for prompt, output in zip(PROMPTS, outputs):
        assert list(output) == greedy_through_the_cache(model, prompt, 12), prompt


def test_the_cache_is_the_leading_rows_of_the_carried_state():
    model = make_model()
    rng = np.random.default_rng(3)
    for variable in model.recurrent_state_variables:
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    before = [to_numpy(v) for v in model.recurrent_state_variables]
    ids = np.asarray([[4], [7]], "int32")
    logits = to_numpy(decoder_lib.logits_through_cache(model, ids))
    cache = [b[:2] for b in before]
    expected, _, after = model.call_with_cache(ids, cache)
    np.testing.assert_array_equal(logits, to_numpy(expected))
    for variable, old, new in zip(model.recurrent_state_variables, before, after):
        value = to_numpy(variable)
        np.testing.assert_array_equal(value[:2], to_numpy(new))
        np.testing.assert_array_equal(value[2:], old[2:])
