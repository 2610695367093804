"""The reverse copy data (Mogrifier paper §4.3): structure, uniformity, seeds."""

import numpy as np
import pytest

from keras_mogrifier.data import reverse_copy

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite


def test_structure_is_lambs_conditioned_layout():
    """lamb/corpus.py 283-298: cond = tokens + eos; source = eos + target
    tokens; target = target tokens + eos (the copy, reversed, here)."""
    (encoder, decoder), targets = reverse_copy(50, 7, vocabulary_size=13, seed=0)
    for array in (encoder, decoder, targets):
        assert array.shape == (50, 8) and array.dtype == np.int32
    eos = np.full(50, 13)
    np.testing.assert_array_equal(encoder[:, -1], eos)
    np.testing.assert_array_equal(decoder[:, 0], eos)
    np.testing.assert_array_equal(targets[:, -1], eos)
    np.testing.assert_array_equal(targets[:, :-1], encoder[:, -2::-1])  # reversed
    np.testing.assert_array_equal(decoder[:, 1:], targets[:, :-1])  # teacher forcing
    assert encoder[:, :-1].min() >= 0 and encoder[:, :-1].max() < 13


def test_tokens_are_uniform():
    (encoder, _), _ = reverse_copy(20_000, 10, vocabulary_size=8, seed=1)
    encoder = encoder[:, :-1]
    counts = np.bincount(encoder.ravel(), minlength=8)
    expected = encoder.size / 8
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 24.3  # the 0.999 quantile of χ² with 7 degrees of freedom
    # Positions are independent: the first and last tokens are uncorrelated.
    assert abs(np.corrcoef(encoder[:, 0], encoder[:, -1])[0, 1]) < 0.03


def test_seeds():
    a = reverse_copy(5, 4, 10, seed=3)
    b = reverse_copy(5, 4, 10, seed=3)
    c = reverse_copy(5, 4, 10, seed=4)
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((0, 5, 10), {}, "num_examples"),
        ((5, 0, 10), {}, "length"),
        ((5, 5, 1), {}, "vocabulary_size"),
        ((5, 5, 2.5), {}, "vocabulary_size"),
        ((5, 5, 10), {"seed": 1.5}, "seed"),
        ((5, 5, 10), {"seed": -1}, "Expected `seed` to be a non-negative int"),
        ((5, 5, 2**31), {}, r"Expected `vocabulary_size` below 2147483647"),
        ((2**20, 2**12, 10), {}, r"num_examples=1048576, length=4096"),
    ],
)
def test_bad_sizes_raise(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        reverse_copy(*args, **kwargs)
