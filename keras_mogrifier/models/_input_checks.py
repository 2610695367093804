"""What `LanguageModel`'s entry points check before anything changes.

Arrays and tensors (of any backend) are checked whole, up front. A
`StreamDataset` holds all of its ids: they are checked up front too. Data
that arrives batch by batch (any other `keras.utils.PyDataset`, a
`tf.data.Dataset`, a Python generator) is checked on the host as each
batch is fetched, before the step that would use it: a bad batch raises a
`ValueError` naming its index, and none of its updates is applied. Other
kinds of data (a `torch.utils.data.DataLoader`, ...) pass unchecked.
"""

import inspect
import types

import keras
import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.data.batching import DatasetView
from keras_mogrifier.data.batching import StreamDataset

KERAS_DEFAULT_BATCH_SIZE = 32
# The attributes of a LanguageModel that the checks read.
_MODEL_FIELDS = ("vocabulary_size", "stateful", "state_capacity", "batch_size", "samples")


def max_rows(model, training):
    """The most sequences a call may hold, or `None` (no carried state).

    The carried state has room for `batch_size * samples` rows; a training
    call uses `samples` rows per sequence, an evaluation call one.
    """
    if not model.stateful:
        return None
    capacity = getattr(model, "state_capacity", None)
    if capacity is None:
        if model.batch_size is None:
            return None  # set by the first call
        capacity = model.batch_size * model.samples
    return capacity // model.samples if training else capacity


def check_not_empty(shape, name):
    """Refuses ids with no row or no token (a static 0 in their shape)."""
    if any(isinstance(size, int) and size == 0 for size in shape):
        raise ValueError(
            f"Expected `{name}` to hold at least one sequence of at least one "
            f"token. Received: {name}.shape={tuple(shape)}"
        )


def check_rows(model, rows, training, received):
    limit = max_rows(model, training)
    if limit is not None and rows is not None and rows > limit:
        capacity = limit * (model.samples if training else 1)
        per = (
            f" ({model.samples} dropout samples per sequence in training)"
            if training and model.samples > 1
            else ""
        )
        raise ValueError(
            f"Expected at most {limit} sequences per batch: the carried "
            f"recurrent state of this stateful LanguageModel has room for "
            f"{capacity} rows{per}. Build it with a larger `batch_size` or "
            f"use `model.with_options(batch_size=...)`. Received: {received}"
        )


def _unpack(batch):
    if isinstance(batch, list):
        batch = tuple(batch)
    if not isinstance(batch, tuple):
        return batch, None, None
    if len(batch) not in (1, 2, 3):
        raise ValueError(
            "Expected a batch `(x,)`, `(x, y)` or `(x, y, sample_weight)`. "
            f"Received: a tuple of {len(batch)} elements"
        )
    return tuple(batch) + (None,) * (3 - len(batch))


def check_arrays(model, x, y, sample_weight, rows, training, targets, where=None):
    """Checks one `(x, y, sample_weight)` of token ids; `rows` per call."""
    ids = _validation.token_ids("x", x, model.vocabulary_size, ndim=2, where=where)
    if y is None:
        if targets:
            at = f" {where}" if where else ""
            raise ValueError(
                f"Expected targets `y`{at}: the ids of the next tokens, "
                f"shaped like `x` {ids.shape}. Received: y=None"
            )
    else:
        labels = _validation.token_ids(
            "y", y, model.vocabulary_size, ndim=2, where=where
        )
        if labels.shape != ids.shape:
            at = f" {where}" if where else ""
            raise ValueError(
                f"Expected `y`{at} to have the shape of `x`, {ids.shape} (the "
                f"next token of every position). Received: y.shape="
                f"{labels.shape}"
            )
    if sample_weight is not None:
        _validation.sample_weights("sample_weight", sample_weight, ids.shape, where)
    check_rows(
        model,
        len(ids) if rows is None else min(rows, len(ids)),
        training,
        f"x.shape={ids.shape}"
        + (f" {where}" if where else f" in batches of {rows}" if rows else ""),
    )


class BatchCheck:
    """Checks each batch of streamed data on the host; keeps the first error.

    Called as `check(index, batch)` by the wrappers below. The error is kept
    because the trainer may report it wrapped in its own (TensorFlow's
    input pipeline does): the caller raises the kept one instead.
    """

    def __init__(self, model, training, targets, role):
        # What the checks read of the model, not the model itself: a
        # PyDataset with `use_multiprocessing` may be pickled with this.
        self.model = types.SimpleNamespace(
            **{name: getattr(model, name, None) for name in _MODEL_FIELDS}
        )
        self.training = training
        self.targets = targets
        self.role = role
        self.error = None

    def __call__(self, index, batch):
        try:
            x, y, sample_weight = _unpack(batch)
            check_arrays(
                self.model, x, y, sample_weight, None, self.training,
                self.targets, where=f"in batch {index} of the {self.role}",
            )
        except ValueError as error:
            if self.error is None:
                self.error = error
            raise

    def reported(self, error):
        """The kept error if `error` is it or reports it, else None."""
        if self.error is None:
            return None
        if error is self.error or str(self.error) in str(error):
            return self.error
        return None


class _CheckedPyDataset(DatasetView):
    """A `PyDataset` whose batches are checked as they are fetched."""

    def __init__(self, dataset, check):
        super().__init__(dataset)
        self.check = check

    def __len__(self):
        return len(self.dataset)

    @property
    def num_batches(self):
        return self.dataset.num_batches

    def __getitem__(self, index):
        batch = self.dataset[index]
        self.check(index, batch)
        return batch

    def on_epoch_begin(self):
        self.dataset.on_epoch_begin()

    def on_epoch_end(self):
        self.dataset.on_epoch_end()


def _checked_generator(generator, check):
    for index, batch in enumerate(generator):
        check(index, batch)
        yield batch


def is_tf_dataset(data):
    return any(
        parent.__name__ == "DatasetV2"
        and str(parent.__module__).startswith("tensorflow.python.")
        for parent in type(data).__mro__
    )


def is_host_array(data):
    return isinstance(data, (np.ndarray, np.generic))


def bind(method, *args, **kwargs):
    """The arguments of a call of `keras.Model.<method>`, by name."""
    arguments = inspect.signature(method).bind_partial(None, *args, **kwargs)
    arguments = dict(arguments.arguments)
    arguments.pop("self", None)
    arguments.update(arguments.pop("kwargs", {}))
    return arguments


def is_array_like(data):
    return isinstance(data, (np.ndarray, list, tuple)) or (
        hasattr(data, "shape") and hasattr(data, "dtype")
    )


def prepare(model, x, y, sample_weight, batch_size, training, targets, role):
    """Checks data given to an entry point; wraps data that comes in batches.

    Returns `(x, check)`: `x` as the trainer should receive it and the
    `BatchCheck` of streamed data (else `None`).
    """
    if isinstance(x, StreamDataset):
        x.check_token_ids(model.vocabulary_size)
        check_rows(
            model, x.batch_size, training, f"a StreamDataset of batch_size={x.batch_size}"
        )
        return x, None
    if isinstance(x, keras.utils.PyDataset):
        check = BatchCheck(model, training, targets, role)
        return _CheckedPyDataset(x, check), check
    if is_tf_dataset(x):
        check = BatchCheck(model, training, targets, role)
        return get_backend_module().check_dataset_on_host(x, check), check
    if inspect.isgenerator(x):
        check = BatchCheck(model, training, targets, role)
        return _checked_generator(x, check), check
    if x is None or not is_array_like(x):
        return x, None  # e.g. a torch DataLoader: not checked
    check_arrays(
        model, x, y, sample_weight, batch_size or KERAS_DEFAULT_BATCH_SIZE,
        training, targets,
    )
    return x, None


def first_batch_rows(x, batch_size):
    """The rows of the first batch `fit` takes from `x`, or `None` if unknown.

    Known for a `StreamDataset` and for arrays (the first batch is the
    largest); other data (datasets, generators) is only read by the trainer.
    """
    if isinstance(x, StreamDataset):
        return x.batch_size
    if x is not None and is_array_like(x):
        return min(batch_size or KERAS_DEFAULT_BATCH_SIZE, len(x))
    return None


def prepare_validation_data(model, validation_data, batch_size):
    """`fit`'s `validation_data`, checked (or wrapped) as `evaluate`'s data."""
    if validation_data is None:
        return None, None
    if isinstance(validation_data, (tuple, list)) and len(validation_data) in (2, 3):
        vx, vy, vw = tuple(validation_data) + (None,) * (3 - len(validation_data))
        if is_array_like(vx):
            check_arrays(
                model, vx, vy, vw, batch_size or KERAS_DEFAULT_BATCH_SIZE,
                False, True, where="in `validation_data`",
            )
            return validation_data, None
    return prepare(
        model, validation_data, None, None, batch_size, False, True,
        "validation data",
    )


def _static_shape(value):
    try:
        return tuple(value.shape)
    except (AttributeError, TypeError, ValueError):  # TF: unknown rank
        return None


def _differ(size, expected):
    """Whether two sizes are both known (static) and differ."""
    return isinstance(size, int) and isinstance(expected, int) and size != expected


def _dtype_name(value):
    return keras.backend.standardize_dtype(value.dtype)


def check_cache_call(model, token_ids, cache):
    """Checks the arguments of `call_with_cache` before the call.

    The ids get the checks of `model(ids)`: rank 2 and an integer dtype
    always (also when traced: both are static), every id in
    `[0, vocabulary_size)` when the ids are concrete (eager, or host
    arrays). The cache: `None`, or a list (or tuple) of `2 · num_layers`
    floating tensors `(rows, units)`, `h` and `c` of each layer, with the
    rows of the ids.

    Returns:
        `token_ids`, as a NumPy array when given as a list or tuple.
    """
    if isinstance(token_ids, (list, tuple)) or is_host_array(token_ids):
        token_ids = model.check_token_ids(token_ids, "token_ids")
    shape = _static_shape(token_ids)
    if shape is not None and len(shape) != 2:
        raise ValueError(
            "Expected `token_ids` to be token ids of shape (batch, time). "
            f"Received: token_ids.shape={shape}"
        )
    if shape is not None:
        check_not_empty(shape, "token_ids")
    dtype = _dtype_name(token_ids)
    if dtype == "bool" or not ("int" in dtype):
        raise ValueError(
            "Expected `token_ids` to hold integer token ids. "
            f"Received: token_ids.dtype={dtype}"
        )
    if not (
        is_host_array(token_ids)
        or isinstance(token_ids, keras.KerasTensor)
        or _validation.in_ids_checked()
    ) and get_backend_module().is_concrete(token_ids):
        model.check_token_ids(token_ids, "token_ids")
    if cache is None:
        return token_ids
    layers = model.num_layers
    expected = (
        f"a list of {2 * layers} state tensors (`h` and `c` of each of the "
        f"{layers} layers, each (batch, {model.units}))"
    )
    if not isinstance(cache, (list, tuple)):
        received = _static_shape(cache)
        what = (
            f"one tensor of shape {received}" if received is not None
            else type(cache).__name__
        )
        raise ValueError(f"Expected `cache` to be {expected}. Received: {what}")
    if len(cache) != 2 * layers:
        raise ValueError(
            f"Expected `cache` to be {expected}. Received: a list of "
            f"{len(cache)} entries"
        )
    rows = shape[0] if shape is not None else None
    for index, state in enumerate(cache):
        name = f"cache[{index}]"
        if not hasattr(state, "dtype"):
            raise ValueError(
                f"Expected `{name}` to be a tensor of shape (batch, "
                f"{model.units}). Received: {type(state).__name__}"
            )
        state_shape = _static_shape(state)
        if state_shape is None:
            continue  # TensorFlow, traced with an unknown rank
        if len(state_shape) != 2 or _differ(state_shape[1], model.units) or _differ(
            state_shape[0], rows
        ):
            batch = rows if isinstance(rows, int) else "batch"
            raise ValueError(
                f"Expected `{name}` to have shape ({batch}, {model.units}) "
                f"(one row per row of `token_ids`, the width of the "
                f"model's recurrent layers). Received: {name}.shape="
                f"{state_shape}"
            )
        if "float" not in _dtype_name(state):
            raise ValueError(
                f"Expected `{name}` to be a floating-point tensor. Received: "
                f"{name}.dtype={_dtype_name(state)}"
            )
    return token_ids
