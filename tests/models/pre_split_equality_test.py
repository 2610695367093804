"""The split LanguageModel gives the numbers of the release before the split.

tests/fixtures/make_pre_split_equality.py computed, with the code before
issue 27 and the same seed, each model's initial weights, its logits, the
loss of 2 `fit` steps with dropout on and the weights after them, on each
backend; here the current code computes the same. The initial weights and
the logits must match to the last bits (rtol 1e-5, atol 1e-6: the same
layers drawing the same random numbers in the same order; a different draw
or order changes them by the weights' own size, ~0.1). Not bit for bit:
JAX's orthogonal initializer (a QR decomposition in XLA) rounds differently
on different CPUs — on the 2026-11-27 machine the recurrent kernels of the
fixture (made on another AMD EPYC) came out up to 1.2e-7 apart (relative
7e-6) with no change to the code. The losses and weights after the `fit`
steps must match to float rounding: rtol 1e-5, and an absolute tolerance of
4 units in the last place of the array's largest value (float32: 4 × 3e-8
for weights of size 0.3). XLA splits a reduction by the number of threads it
has, so the fixture (made on one core) and a run on two cores can differ in
the last bits of a gradient — as JAX did on a 2-core run (relative 1e-5 on
values of 1e-8); and PyTorch's CPU kernels differ between processors: on
an Intel Xeon (the 2026-12-02 CI run) one recurrent weight of 7.7e-4, the
difference of two weights of size 0.1 after the SGD steps, came out 2.4e-8
(under one unit in the last place of 0.3) from the fixture made on an AMD
EPYC — relative 3e-5 on that small value. A changed step changes the
weights by the learning rate (0.5) times a gradient, far above this.
"""

import importlib.util
import os

import keras
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.util.spec_from_file_location(
    "make_pre_split_equality",
    os.path.join(HERE, "..", "fixtures", "make_pre_split_equality.py"),
)
maker = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(maker)


@pytest.fixture(scope="module")
def recorded():
    with np.load(maker.fixture_path(keras.backend.backend())) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize("name", list(maker.CONFIGS))
def test_same_seed_same_numbers_as_before_the_split(name, recorded):
    expected = {
        key[len(name) + 1 :]: value
        for key, value in recorded.items()
        if key.startswith(name + "/")
    }
    actual = maker.numbers(name)
    # Same weights, in the same order, at the same paths.
    assert sorted(actual) == sorted(expected)
    for key in sorted(expected):
        if key.startswith(("init/", "logits")):
            np.testing.assert_allclose(
                actual[key], expected[key], rtol=1e-5, atol=1e-6, err_msg=f"{name}: {key}"
            )
        else:
            np.testing.assert_allclose(
                actual[key], expected[key], rtol=1e-5, atol=_last_places(expected[key]),
                err_msg=f"{name}: {key}",
            )


def _last_places(array, units=4):
    """`units` units in the last place of `array`'s largest magnitude, in
    `array`'s own precision: the rounding one different summation order
    can leave on every value computed from values of that size."""
    array = np.asarray(array)
    return units * float(np.spacing(np.abs(array).max().astype(array.dtype)))
