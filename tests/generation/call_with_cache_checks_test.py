"""`call_with_cache` checks its ids and its cache as `model(ids)` checks ids.

Every refused call raises a `ValueError` naming the argument, what was
expected and what was received, before anything runs: the weights and the
carried state are bitwise unchanged (the call touches neither when it
works; a refused one must not either). keras-hub's samplers reach the model
through the same method: a bad cache handed to them is refused the same way.
"""

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from testing import to_numpy

from generate_test import V
from generate_test import make_model

ROWS = 3
IDS = np.array([[1, 2], [3, 4], [5, 6]], "int32")


@pytest.fixture(scope="module")
def model():
    # Two layers: a cache of the right length holds four tensors.
    return make_model(batch_size=ROWS, num_layers=2)


@pytest.fixture(scope="module")
def cache(model):
    return model.call_with_cache(IDS)[2]


def values(model):
    return [to_numpy(v).copy() for v in model.variables]


def assert_refused(model, call, match):
    before = values(model)
    with pytest.raises(ValueError, match=match):
        call()
    for old, new in zip(before, values(model)):
        np.testing.assert_array_equal(new, old)


def tensor(array):
    return ops.convert_to_tensor(np.asarray(array))


def ids_of(value, dtype="int32"):
    return tensor(np.full((ROWS, 1), value, dtype))


@pytest.mark.parametrize(
    "make_ids, match",
    [
        (lambda: ids_of(V), rf"token ids in \[0, {V}\). Received: an id {V}"),
        (lambda: ids_of(-1), rf"token ids in \[0, {V}\). Received: an id -1"),
        (lambda: ids_of(1.5, "float32"), "integer token ids. Received: token_ids.dtype=float32"),
        (lambda: ids_of(True, "bool"), "integer token ids. Received: token_ids.dtype=bool"),
        (lambda: [[V], [1], [1]], rf"token ids in \[0, {V}\)"),
        (lambda: tensor([1, 2, 3]), r"shape \(batch, time\). Received: token_ids.shape=\(3,\)"),
    ],
    ids=["id_V", "negative", "float", "bool", "list_id_V", "rank_1"],
)
def test_bad_token_ids_are_refused_with_a_cache_and_without(model, cache, make_ids, match):
    assert_refused(model, lambda: model.call_with_cache(make_ids(), cache), match)
    assert_refused(model, lambda: model.call_with_cache(make_ids()), match)


@pytest.mark.parametrize(
    "make_cache, rows, match",
    [
        # One array where the per-layer list belongs (rows would be read as
        # `h` and `c`): refused, also when its length happens to match.
        (lambda c: ops.stack(c), ROWS, r"a list of 4 state tensors .*Received: one tensor of shape \(4, 3, 8\)"),
        (lambda c: c[:2], ROWS, "a list of 4 state tensors .*Received: a list of 2 entries"),
        (lambda c: [s[:, :4] for s in c], ROWS, r"cache\[0\]` to have shape \(3, 8\).*Received: cache\[0\].shape=\(3, 4\)"),
        (lambda c: c, 2, r"cache\[0\]` to have shape \(2, 8\).*Received: cache\[0\].shape=\(3, 8\)"),
        (lambda c: [ops.cast(s, "int32") for s in c], ROWS, r"floating-point.*cache\[0\].dtype=int32"),
        (lambda c: [s[0] for s in c], ROWS, r"cache\[0\]` to have shape \(3, 8\).*Received: cache\[0\].shape=\(8,\)"),
    ],
    ids=["one_array", "too_few", "wrong_width", "wrong_rows", "int_dtype", "rank_1"],
)
def test_bad_caches_are_refused(model, cache, make_cache, rows, match):
    ids = tensor(IDS[:rows, :1])
    assert_refused(model, lambda: model.call_with_cache(ids, make_cache(cache)), match)


def test_a_valid_call_still_gives_the_full_pass_logits(model, cache):
    # The checks change nothing of a valid call: one token after the cache
    # is the last position of a call over all three tokens.
    logits, _, new_cache = model.call_with_cache(tensor(IDS[:, :1]), cache)
    expected, _, _ = model.call_with_cache(np.concatenate([IDS, IDS[:, :1]], axis=1))
    np.testing.assert_allclose(to_numpy(logits)[:, 0], to_numpy(expected)[:, -1], atol=1e-5)
    assert len(new_cache) == 4


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's traced ids")
@pytest.mark.compiled
def test_traced_ids_get_the_static_checks_under_jit(model, cache):
    # Under `jax.jit` the ids' values are unknown; their dtype, rank and the
    # cache's structure are checked all the same.
    import jax

    step = jax.jit(lambda ids, cache: model.call_with_cache(ids, cache)[0])
    assert_refused(model, lambda: step(ids_of(1.0, "float32"), cache), "integer token ids")
    assert_refused(
        model, lambda: step(ids_of(1), [s[:, :4] for s in cache]), r"cache\[0\]` to have shape"
    )
    assert step(ids_of(1), cache).shape == (ROWS, 1, V)


def next_function(model):
    def next(prompt, cache, index):
        tokens = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
        logits, hidden_states, cache = model.call_with_cache(tokens, cache, index - 1)
        return logits[:, 0], hidden_states[:, 0], cache

    return next


def run_keras_hub_sampler(model, prompts, cache):
    padded = np.zeros((ROWS, 5), "int32")
    padded[:, : prompts.shape[1]] = prompts
    mask = np.zeros((ROWS, 5), bool)
    mask[:, : prompts.shape[1]] = True
    return keras_hub.samplers.GreedySampler()(
        next_function(model), tensor(padded), cache=cache, index=prompts.shape[1],
        mask=tensor(mask), model=model,
    )


def test_keras_hub_sampler_given_a_bad_cache_is_refused(model, cache):
    narrow = [s[:, :4] for s in cache]
    assert_refused(
        model, lambda: run_keras_hub_sampler(model, IDS, narrow), r"cache\[0\]` to have shape"
    )
    assert_refused(
        model, lambda: run_keras_hub_sampler(model, IDS, ops.stack(cache)), "a list of 4"
    )


@pytest.mark.skipif(
    keras.backend.backend() == "jax",
    reason="keras-hub's loop is a traced lax.while_loop on JAX: ids checked before it",
)
def test_keras_hub_sampler_reading_an_out_of_range_prompt_id_is_refused(model, cache):
    # TensorFlow and PyTorch run keras-hub's loop eagerly: the ids each step
    # reads are concrete and checked. The bad id is the last prompt token,
    # read inside the loop (the cache holds the state before it).
    prompts = IDS.copy()
    prompts[0, -1] = V
    assert_refused(
        model, lambda: run_keras_hub_sampler(model, prompts, cache[:]),
        rf"token ids in \[0, {V}\)",
    )
