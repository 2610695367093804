"""Argument checks shared by the whole package.

Every check raises a `ValueError` that names the argument, says what was
expected and shows what was received, in the Keras style:
"Expected `units` to be a positive integer. Received: units=0".
"""

import numbers

import numpy as np


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(name, value):
    if not _is_int(value) or value <= 0:
        raise ValueError(
            f"Expected `{name}` to be a positive integer. Received: {name}={value!r}"
        )
    return int(value)


def non_negative_int(name, value):
    if not _is_int(value) or value < 0:
        raise ValueError(
            f"Expected `{name}` to be a non-negative integer. "
            f"Received: {name}={value!r}"
        )
    return int(value)


def optional_positive_int(name, value):
    return None if value is None else positive_int(name, value)


def rate(name, value):
    """A dropout-like rate in [0, 1)."""
    if not _is_real(value) or not 0.0 <= float(value) < 1.0:
        raise ValueError(
            f"Expected `{name}` to be a float in [0, 1). Received: {name}={value!r}"
        )
    return float(value)


def non_negative_float(name, value):
    if not _is_real(value) or not np.isfinite(value) or value < 0:
        raise ValueError(
            f"Expected `{name}` to be a finite non-negative number. "
            f"Received: {name}={value!r}"
        )
    return float(value)


def positive_float(name, value):
    if not _is_real(value) or not np.isfinite(value) or value <= 0:
        raise ValueError(
            f"Expected `{name}` to be a finite positive number. "
            f"Received: {name}={value!r}"
        )
    return float(value)


def one_of(name, value, choices):
    if value not in choices:
        raise ValueError(
            f"Expected `{name}` to be one of {sorted(choices)}. "
            f"Received: {name}={value!r}"
        )
    return value


def token_ids(name, ids, vocabulary_size):
    """Checks a NumPy array of token ids: integers in [0, vocabulary_size)."""
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"Expected `{name}` to hold integer token ids. "
            f"Received: {name}.dtype={ids.dtype}"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= vocabulary_size):
        bad = ids[(ids < 0) | (ids >= vocabulary_size)].ravel()[0]
        raise ValueError(
            f"Expected `{name}` to hold token ids in [0, {vocabulary_size}). "
            f"Received: an id {int(bad)} (min {int(ids.min())}, "
            f"max {int(ids.max())})"
        )
    return ids
