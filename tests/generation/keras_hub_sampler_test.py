"""keras-hub's own samplers drive LanguageModel through `call_with_cache`.

keras-hub's `CausalLM.generate_step` hands a sampler a function
`next(prompt, cache, index)` that reads the token before `index` and
returns `(logits, hidden_states, cache)`; for a recurrent model the cache
is the recurrent state, seeded by one call over the prompt (as keras-hub's
`RWKV7CausalLM` seeds its state). The continuation must be the one our
own `generate` writes, and the greedy one of full passes over the text.
"""

import keras_hub
import numpy as np
import pytest
from keras import ops
from testing import to_numpy

from generate_test import full_pass_log_probs
from generate_test import make_model

PROMPTS = np.array([[3, 4, 5, 6], [2, 1, 0, 16], [10, 11, 12, 13]], "int32")
MAX_LENGTH = 11


def keras_hub_continuation(model, sampler):
    batch, length = PROMPTS.shape
    padded = np.zeros((batch, MAX_LENGTH), "int32")
    padded[:, :length] = PROMPTS
    mask = np.zeros((batch, MAX_LENGTH), bool)
    mask[:, :length] = True
    # The state after every prompt token but the last: `next` reads that.
    _, _, cache = model.call_with_cache(PROMPTS[:, :-1])

    def next(prompt, cache, index):
        tokens = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
        logits, hidden_states, cache = model.call_with_cache(tokens, cache, index - 1)
        return logits[:, 0], hidden_states[:, 0], cache

    output = sampler(
        next,
        ops.convert_to_tensor(padded),
        cache=cache,
        index=length,
        mask=ops.convert_to_tensor(mask),
        model=model,
    )
    return to_numpy(output)


@pytest.mark.parametrize(
    "options", [{}, {"cell": "mogrifier_rlstm", "dual": True, "mixture_of_softmaxes": 2}],
    ids=["lstm", "dual_mos"],
)
def test_keras_hub_greedy_sampler_writes_what_generate_writes(options):
    model = make_model(**options)
    expected = model.generate(PROMPTS.tolist(), max_length=MAX_LENGTH, stop_token_ids=None)
    output = keras_hub_continuation(model, keras_hub.samplers.GreedySampler())
    np.testing.assert_array_equal(output[:, : PROMPTS.shape[1]], PROMPTS)
    np.testing.assert_array_equal(output, np.asarray(expected))
    # And each new token is the argmax of a full pass over the text before
    # it (an ordinary call, not through the cache).
    log_probs = full_pass_log_probs(model, output)
    for row, text in zip(log_probs, output):
        for t in range(PROMPTS.shape[1], MAX_LENGTH):
            assert text[t] == row[t - 1].argmax(), (text, t)
