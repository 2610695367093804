"""Argument checks shared by the whole package.

Every check raises a `ValueError` that names the argument, says what was
expected and shows what was received, in the Keras style:
"Expected `units` to be a positive integer. Received: units=0".
"""

import contextlib
import numbers
import threading

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


def to_host(value):
    """`value` as a NumPy array: arrays, lists and tensors of any backend.

    Tensors are copied to the host (`keras.ops.convert_to_numpy`).
    """
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple, numbers.Number, np.generic)):
        return np.asarray(value)
    import keras

    try:
        return np.asarray(keras.ops.convert_to_numpy(value))
    except Exception:  # e.g. a TensorFlow tensor with another Keras backend
        return np.asarray(value)


def _rank_text(ndim):
    return " or ".join(f"{n}-D" for n in ndim)


# === Token ids checked once ===
#
# A corpus checks its ids when it is made (every id in [0, vocabulary
# size)) and makes its arrays read-only; `mark_token_ids` records that
# bound for the memory they occupy, so that `token_ids` below (which every
# consumer calls: StreamDataset, the temperature search, `evaluate`, the
# gradient statistics) finds it for the arrays themselves and for every view
# of them (slices, reshapes: `corpus.valid[:10_001]`) and skips the scan.
# Read-only memory cannot change under the record (NumPy refuses to make a
# view of it writable), and the record goes when the memory is freed.

_KNOWN_BOUNDS = {}  # id(owner) -> (weakref to owner, [(low, high, bound)])


def _owner(array):
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def mark_token_ids(array, bound):
    """Records that `array` (an integer NumPy array) holds ids in `[0, bound)`.

    The array is made read-only first. Only call it after checking.
    """
    import weakref

    from numpy.lib.array_utils import byte_bounds

    array.flags.writeable = False
    owner = _owner(array)
    key = id(owner)
    if key not in _KNOWN_BOUNDS:
        ref = weakref.ref(owner, lambda _, key=key: _KNOWN_BOUNDS.pop(key, None))
        _KNOWN_BOUNDS[key] = (ref, [])
    low, high = byte_bounds(array)
    _KNOWN_BOUNDS[key][1].append((low, high, int(bound)))
    return array


def known_token_bound(array):
    """The smallest recorded bound of `array`'s ids, or `None` if unchecked."""
    if not isinstance(array, np.ndarray) or array.flags.writeable or not array.size:
        return None
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        return None
    entry = _KNOWN_BOUNDS.get(id(_owner(array)))
    if entry is None or entry[0]() is not _owner(array):
        return None
    from numpy.lib.array_utils import byte_bounds

    low, high = byte_bounds(array)
    bounds = [b for lo, hi, b in entry[1] if lo <= low and high <= hi]
    return min(bounds) if bounds else None


def ids_known_below(array, vocabulary_size):
    """Whether `array`'s ids were checked to lie in `[0, vocabulary_size)`."""
    bound = known_token_bound(array)
    return bound is not None and (vocabulary_size is None or bound <= vocabulary_size)


def token_ids(name, ids, vocabulary_size, ndim=None, where=None):
    """Checks token ids and returns them as a NumPy array on the host.

    The one check of token ids used by every entry point of the library:
    integer dtype (not bool), rank `ndim` (an int or a tuple of allowed
    ranks, `None` for any) and every id in `[0, vocabulary_size)` (only
    `>= 0` when `vocabulary_size` is `None`).

    Args:
        name: str. The argument's name, used in the message (e.g. `"x"`).
        ids: NumPy array, list or tensor of any backend.
        vocabulary_size: int or None. Number of token ids.
        ndim: int, tuple of int or None. Allowed ranks.
        where: str or None. Where the ids come from, e.g. `"in batch 3"`,
            added to the message.

    Returns:
        The ids as a NumPy array (not copied when already one).

    Raises:
        ValueError: saying what was expected and what was received.
    """
    at = f" {where}" if where else ""
    try:
        array = to_host(ids)
    except Exception as error:  # ragged lists, objects NumPy cannot read
        raise ValueError(
            f"Expected `{name}`{at} to be an array of integer token ids. "
            f"Received: {type(ids).__name__}, which is not one ({str(error)[:120]})"
        ) from error
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        first = ""
        if array.size:  # every value is of the wrong kind: show the first
            position = (0,) * array.ndim
            value = array.reshape(-1)[0]
            value = value.item() if isinstance(value, np.generic) else value
            first = f", e.g. {repr(value)[:40]} at position {position}"
        raise ValueError(
            f"Expected `{name}`{at} to hold integer token ids. "
            f"Received: {name}.dtype={array.dtype}{first}"
        )
    if ndim is not None:
        ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if array.ndim not in ranks:
            what = (
                "token ids of shape (batch, time)"
                if ranks == (2,)
                else f"a {_rank_text(ranks)} array of token ids"
            )
            raise ValueError(
                f"Expected `{name}`{at} to be {what}. "
                f"Received: {name}.shape={array.shape}"
            )
    if array.size and not ids_known_below(array, vocabulary_size):
        scan_token_ids(name, array, vocabulary_size, at)
    return array


def scan_token_ids(name, array, vocabulary_size, at=""):
    """The scan of `token_ids`: every id in range, or a ValueError naming one."""
    low, high = array.min(), array.max()
    too_large = vocabulary_size is not None and high >= vocabulary_size
    if low < 0 or too_large:
        bad = (array < 0) if vocabulary_size is None else (
            (array < 0) | (array >= vocabulary_size)
        )
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        value = int(array[position])
        expected = (
            "non-negative token ids"
            if vocabulary_size is None
            else f"token ids in [0, {vocabulary_size})"
        )
        raise ValueError(
            f"Expected `{name}`{at} to hold {expected}. Received: an id "
            f"{value} at position {position} (min {int(low)}, max "
            f"{int(high)})"
        )


def sample_weights(name, weights, ids_shape, where=None):
    """Checks sample weights: finite, non-negative, `(batch,)` or like the ids.

    Returns them as a float32 NumPy array.
    """
    at = f" {where}" if where else ""
    try:
        array = np.asarray(to_host(weights), dtype="float32")
    except Exception as error:
        raise ValueError(
            f"Expected `{name}`{at} to be an array of numbers. "
            f"Received: {type(weights).__name__}"
        ) from error
    shapes = (tuple(ids_shape[:1]), tuple(ids_shape))
    if array.shape not in shapes:
        raise ValueError(
            f"Expected `{name}`{at} to have shape {shapes[0]} (one weight "
            f"per sequence) or {shapes[1]} (one per token). Received: "
            f"{name}.shape={array.shape}"
        )
    bad = ~np.isfinite(array) | (array < 0)
    if np.any(bad):
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"Expected `{name}`{at} to be finite and non-negative (a NaN or "
            "infinite weight makes the loss, then every trained weight, "
            f"non-finite). Received: {float(array[position])} at position "
            f"{position}"
        )
    return array


class _Checked(threading.local):
    depth = 0


_CHECKED = _Checked()


@contextlib.contextmanager
def ids_checked():
    """Within it, `LanguageModel.__call__` does not check concrete ids again.

    The entry points (`fit`, `evaluate`, `predict`, the evaluation helpers)
    check their data once, up front or batch by batch on the host; the
    model calls they make need no second check (on PyTorch every call is
    eager and would copy the ids to the host again).
    """
    _CHECKED.depth += 1
    try:
        yield
    finally:
        _CHECKED.depth -= 1


def in_ids_checked():
    return _CHECKED.depth > 0
