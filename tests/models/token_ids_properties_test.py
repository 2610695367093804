"""Properties of every entry point that takes token ids (issue 42).

For arbitrary arrays — any dtype, shape and range — each entry point either
accepts them (it must when they are valid) or raises its `ValueError`, and
a refused call leaves every weight and the carried recurrent state bitwise
as they were. Never another kind of error: an `IndexError` from a gather or
a framework's `InvalidArgumentError` is a bug here.

Run with a fixed seed (`derandomize=True`) and few examples per entry
point: the shapes stay small so that the valid calls compile little.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import event
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from testing import to_numpy

from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.generation import Decoder
from keras_mogrifier.models import LanguageModel

V = 11
ROWS = 2
EXAMPLES = 40

DTYPES = st.sampled_from(
    ["int8", "int16", "int32", "int64", "uint8", "uint32", "float32", "float64", "bool"]
)
# Mostly valid ids, with the edges just outside the range.
VALUES = st.integers(-2, V + 1) | st.sampled_from([0, V - 1])


@st.composite
def valid_like(draw, valid_ranks, max_rows):
    """Integer ids in range, of a rank and size the entry point takes."""
    dtype = np.dtype(draw(st.sampled_from(["int32", "int64", "uint8"])))
    rank = draw(st.sampled_from(valid_ranks))
    shape = (draw(st.integers(1, max_rows)),) * (rank == 2) + (draw(st.integers(1, 3)),)
    return draw(hnp.arrays(dtype, shape, elements=st.integers(0, V - 1)))


@st.composite
def spoiled(draw, valid_ranks, max_rows):
    """Valid ids with one thing wrong: one id out of range, or the dtype."""
    array = draw(valid_like(valid_ranks, max_rows)).astype("int64")
    if draw(st.booleans()):
        index = tuple(draw(st.integers(0, n - 1)) for n in array.shape)
        array[index] = draw(st.sampled_from([-1, V, V + 7, -(2**31)]))
        return array
    return array.astype(draw(st.sampled_from(["float32", "float64", "bool"])))


def arrays(ranks=(0, 1, 2, 3), valid_ranks=(2,), max_rows=3):
    """Valid ids, valid ids spoiled once, and anything (dtype, shape, range)."""
    return st.one_of(
        valid_like(valid_ranks, max_rows), spoiled(valid_ranks, max_rows), anything(ranks)
    )


@st.composite
def anything(draw, ranks):
    dtype = np.dtype(draw(DTYPES))
    rank = draw(st.sampled_from(ranks))
    shape = tuple(draw(st.integers(0, 3)) for _ in range(rank))
    if dtype.kind == "b":
        elements = st.booleans()
    elif dtype.kind == "f":
        elements = VALUES.map(float) | st.sampled_from([0.5, np.nan, np.inf])
    elif dtype.kind == "u":
        elements = VALUES.filter(lambda v: v >= 0)
    else:
        elements = VALUES
    return draw(hnp.arrays(dtype, shape, elements=elements))


def is_valid_ids(array, min_rows=1, max_rows=None, min_time=1):
    """Integer ids of shape (rows, time) in range, within the given sizes."""
    if array.dtype.kind not in "iu" or array.ndim != 2:
        return False
    rows, time = array.shape
    if rows < min_rows or (max_rows is not None and rows > max_rows) or time < min_time:
        return False
    return bool(np.all((array >= 0) & (array < V)))


def as_batch(array):
    return array[None] if array.ndim == 1 else array


def clearly_invalid(array):
    """Refused by every entry point: not integer, or an id out of range."""
    if array.dtype.kind not in "iu":
        return True
    return array.size > 0 and bool(np.any((array < 0) | (array >= V)))


@pytest.fixture(scope="module")
def model():
    import keras

    keras.utils.set_random_seed(0)
    model = LanguageModel(V, units=4, num_layers=1, cell="lstm", batch_size=ROWS)
    model.build((ROWS, None))
    rng = np.random.default_rng(0)
    for variable in model.recurrent_state_variables:
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    return model


def snapshot(model):
    return [to_numpy(v).copy() for v in model.variables]


def check(model, call, array, valid):
    """`call(array)` is accepted when `valid`, refused when clearly invalid,
    and a refusal is a ValueError that changed nothing."""
    event("valid" if valid else "clearly invalid" if clearly_invalid(array) else "other")
    before = snapshot(model)
    try:
        call(array)
    except ValueError:
        assert not valid, f"a valid input was refused: {array!r}"
        for old, new in zip(before, snapshot(model)):
            np.testing.assert_array_equal(new, old)
        return
    assert not clearly_invalid(array), f"accepted silently: {array!r}"


# Empty arrays: no row, no token (an IndexError inside the recurrent layer
# before they were refused).
EMPTY = (np.zeros((0, 2), "int32"), np.zeros((2, 0), "int32"), np.zeros((0, 0), "int8"))


def with_empty(test):
    for array in EMPTY:
        test = example(array=array)(test)
    return test


PROPERTY = settings(
    max_examples=EXAMPLES, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@with_empty
@given(array=arrays(max_rows=ROWS))
def test_model_call(model, array):
    check(model, model, array, is_valid_ids(array, max_rows=ROWS))


@PROPERTY
@with_empty
@given(array=arrays())
def test_call_with_cache(model, array):
    check(model, model.call_with_cache, array, is_valid_ids(array))


@PROPERTY
@with_empty
@given(array=arrays(max_rows=ROWS))
def test_decoder_read(model, array):
    decoder = Decoder(model)
    check(
        model, lambda ids: decoder.read(ids, ids), array,
        is_valid_ids(array, max_rows=ROWS),
    )


@PROPERTY
@with_empty
@given(array=arrays(ranks=(1, 2, 3), valid_ranks=(1, 2)))
def test_score(model, array):
    # One text (1-D) or a batch of texts (2-D); the first token is context.
    check(model, model.score, array, is_valid_ids(as_batch(array), min_time=2))


@PROPERTY
@with_empty
@given(array=arrays(ranks=(1, 2, 3), valid_ranks=(1, 2)))
def test_generate(model, array):
    # One prompt (1-D) or a batch of prompts (2-D), shorter than max_length.
    valid = is_valid_ids(as_batch(array)) and array.shape[-1] < 4
    check(
        model, lambda ids: model.generate(ids, max_length=4, stop_token_ids=None),
        array, valid,
    )


@pytest.fixture(scope="module")
def evaluator(model):
    one = model.with_options(batch_size=1)
    evaluator = DynamicEvaluator(one, learning_rate=1e-2, segment_length=3)
    evaluator.collect_gradient_statistics(np.arange(40) % V, batch_size=1)
    return evaluator


@PROPERTY
@given(array=arrays(ranks=(0, 1, 2), valid_ranks=(1,)))
def test_adapt_to(evaluator, array):
    def adapt(document):
        with evaluator.adapt_to(document):
            pass

    valid = (
        array.dtype.kind in "iu" and array.ndim == 1 and len(array) >= 2
        and bool(np.all((array >= 0) & (array < V)))
    )
    check(evaluator.model, adapt, array, valid)
