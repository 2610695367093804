"""What `DynamicEvaluator` checks before anything changes, and its conversions.

The constructor's checks, the token streams and training batches (converted
to int32 NumPy arrays after every check), the model's vocabulary, batch and
output shapes, and the choice of the adapted variables (all, a list, a
predicate, or the sparse `adaptation_kernel` matrices). Every check raises a
`ValueError` saying what was expected and what was received, before any
weight or carried state changes. `NeuralCache` shares the stream checks.
"""

import numbers
import weakref

import keras
import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.evaluation import _recurrent_state
from keras_mogrifier.evaluation import update_rules

ADAPTATION_KERNEL_NAME = "adaptation_kernel"


def check_constructor_arguments(
    model, variables, sparse, jit_compile, vocabulary_size, gradient_steps,
    gradient_batch_size, validation_batch_size, frequency, verbose,
    validation_data, gradient_data, update_rule,
):
    """The checks of `DynamicEvaluator.__init__`, in its order."""
    if model is not None and not isinstance(model, keras.Layer):
        raise ValueError(
            "Expected `model` to be a Keras model or `None`. "
            f"Received: model={model!r}"
        )
    if not (variables is None or callable(variables) or is_sequence(variables)):
        raise ValueError(
            "Expected `variables` to be `None`, a list of variables or a "
            f"callable `variable -> bool`. Received: variables={variables!r}"
        )
    if not isinstance(sparse, bool):
        raise ValueError(f"Expected `sparse` to be a bool. Received: sparse={sparse!r}")
    if sparse and variables is not None:
        raise ValueError(
            "Expected at most one of `sparse=True` and `variables`. "
            f"Received: sparse={sparse!r}, variables={variables!r}"
        )
    if jit_compile not in ("auto", True, False):
        raise ValueError(
            "Expected `jit_compile` to be True, False or 'auto'. "
            f"Received: jit_compile={jit_compile!r}"
        )
    _validation.optional_positive_int("vocabulary_size", vocabulary_size)
    _validation.optional_positive_int("gradient_steps", gradient_steps)
    _validation.positive_int("gradient_batch_size", gradient_batch_size)
    _validation.optional_positive_int("validation_batch_size", validation_batch_size)
    _validation.optional_positive_int("frequency", frequency)
    check_verbose(verbose)
    if validation_data is not None:
        as_streams(validation_data, "validation_data", vocabulary_size)
        needs = update_rules.NEEDS_STATISTICS.get(update_rule, True)
        if gradient_data is None and needs:
            raise ValueError(
                "Expected `gradient_data` (training data for the gradient "
                "statistics) when `validation_data` is given. "
                "Received: gradient_data=None"
            )


def checked_property(name, check, *options):
    """A property kept in `_<name>` and set to `check(name, value, *options)`."""
    private = "_" + name

    def get(self):
        return getattr(self, private)

    def set_checked(self, value):
        setattr(self, private, check(name, value, *options))

    return property(get, set_checked)


# === The adapted variables ===


def select_adapted_variables(model, sparse, variables):
    """`DynamicEvaluator.adapted_variables`: see there."""
    if sparse:
        chosen = [v for v in model.variables if is_adaptation_kernel(v)]
        if not chosen:
            raise ValueError(
                "Expected the model to hold `adaptation_kernel` variables for "
                "`sparse=True` (build its recurrent cells with "
                "`adaptation_units=H`). Received a model without any."
            )
    elif variables is None:
        chosen = list(model.trainable_variables)
    elif callable(variables):
        chosen = [v for v in model.variables if variables(v)]
    else:
        known = {id(v) for v in model.variables}
        chosen = list(variables)
        for v in chosen:
            if id(v) not in known:
                raise ValueError(
                    "Expected every entry of `variables` to be a variable "
                    f"of the model. Received: {v!r}"
                )
    unique, seen = [], set()
    for v in chosen:
        if id(v) not in seen:
            seen.add(id(v))
            unique.append(v)
    if not unique:
        raise ValueError(
            "Expected at least one variable to adapt. Received: no variables "
            f"(variables={variables!r})"
        )
    for v in unique:
        if not keras.backend.is_float_dtype(v.dtype):
            raise ValueError(
                f"Expected adapted variables to be floating point. Received: "
                f"{v.path} of dtype {v.dtype}"
            )
    return unique


def is_adaptation_kernel(variable):
    return variable.name == ADAPTATION_KERNEL_NAME or variable.path.endswith(
        "/" + ADAPTATION_KERNEL_NAME
    )


def is_per_stream(variable):
    return is_adaptation_kernel(variable) and len(variable.shape) == 3


def per_stream_size(model):
    sizes = {int(v.shape[0]) for v in model.variables if is_per_stream(v)}
    if len(sizes) > 1:
        raise ValueError(
            "Expected every per-stream `adaptation_kernel` of the model to have "
            f"the same number of streams. Received: {sorted(sizes)}"
        )
    return sizes.pop() if sizes else None


# === The model ===


def require_model(model):
    """`model` if it is given and built, or a ValueError."""
    if model is None:
        raise ValueError(
            "Expected a model: pass `model` to `DynamicEvaluator` or use it "
            "as a callback in `fit`. Received: model=None"
        )
    if not model.built:
        raise ValueError(
            "Expected a built model (call it once, or give it an `Input`). "
            f"Received an unbuilt model: {model.name}"
        )
    return model


def vocabulary_limit(model, vocabulary_size):
    """The ids must lie below this: `vocabulary_size`, else the model's."""
    own = model_vocabulary_limit(model)
    if vocabulary_size is None:
        return own
    if own is not None and vocabulary_size > own:
        raise ValueError(
            f"Expected `vocabulary_size` to be at most the model's "
            f"vocabulary ({own} ids: its embedding and output); an id "
            f"≥ {own} has no embedding row. Received: "
            f"vocabulary_size={vocabulary_size}"
        )
    return vocabulary_size


def model_vocabulary_limit(model):
    limits = []
    size = getattr(model, "vocabulary_size", None)
    if isinstance(size, numbers.Integral):
        limits.append(int(size))
    try:
        last = model.output_shape[-1]
    except (AttributeError, ValueError, TypeError, IndexError):
        last = None  # e.g. a subclassed model: no static output shape
    if isinstance(last, numbers.Integral):
        limits.append(int(last))
    # The token table is the largest `Embedding`; a smaller one (positions,
    # segments, a `max_length` table) caps no token id.
    tables = [
        int(layer.input_dim)
        for layer in _recurrent_state._layers(model)
        if isinstance(layer, keras.layers.Embedding)
    ]
    if tables:
        limits.append(max(tables))
    return min(limits) if limits else None


def context_window(model, context_length, segment_length):
    """`K`, the window each segment is scored in, or `None`; or a ValueError.

    A model that carries its recurrent state across segments reads its
    context from that state: `None`, and a `context_length` is refused. A
    model without carried state reads each segment in a window of
    `context_length` tokens (default: the model's maximum, see
    `_token_model.maximum_length`; a keras-hub model without one needs
    `context_length`; any other model without one reads each segment
    alone, as before windows existed).
    """
    from keras_mogrifier.evaluation import _token_model

    maximum = _token_model.maximum_length(model)
    if _recurrent_state.state_variables(model):
        if context_length is not None:
            raise ValueError(
                "Expected `context_length=None` for a model that carries its "
                "recurrent state from segment to segment (its context is that "
                f"state). Received: context_length={context_length}"
            )
        return None
    if context_length is None:
        if maximum is None and isinstance(model, _token_model.TokenLogits):
            raise ValueError(
                "Expected `context_length` (the tokens each segment is scored "
                f"with) for {type(model.wrapped).__name__}, which has no "
                "maximum sequence length of its own. Received: context_length=None"
            )
        context_length = maximum
        if context_length is None:
            return None
    elif maximum is not None and context_length > maximum:
        raise ValueError(
            f"Expected `context_length` to be at most the model's maximum "
            f"sequence length ({maximum}). Received: context_length={context_length}"
        )
    if context_length < segment_length:
        raise ValueError(
            "Expected `context_length` to be at least `segment_length` "
            f"({segment_length}): a segment is scored in one window. "
            f"Received: context_length={context_length}"
        )
    return context_length


def check_causal(model, width, limit):
    """Raises unless changing a window's last token leaves the earlier logits be.

    A model without carried state is scored in windows that may hold tokens
    after the segment (the first `width` columns, for the segments that end
    before them): only a causal model's scores do not depend on them. Two
    calls (dropout off) on a random window of `min(width, 32)` ids, the
    second with its last id changed; nothing in the model changes.
    """
    length = max(2, min(width, 32))
    high = max(2, int(limit or 2))
    ids = np.random.default_rng(0).integers(0, high, (1, length)).astype("int32")
    changed = ids.copy()
    changed[0, -1] = (ids[0, -1] + 1) % high
    first = host_array(ops.cast(model(ops.convert_to_tensor(ids), training=False), "float32"))
    second = host_array(ops.cast(model(ops.convert_to_tensor(changed), training=False), "float32"))
    moved = float(np.max(np.abs(first[:, :-1] - second[:, :-1])))
    # A causal model computes the same prefix to the bit (same program, same
    # inputs); 1e-6 of the logits' scale leaves room for rounding, and an
    # untrained encoder moves them by 1e-4 of it.
    if moved > 1e-6 * float(np.max(np.abs(first))):
        raise ValueError(
            "Expected a causal model (the logits at a position depend on the "
            "tokens up to it only): each segment is scored in a window that "
            "may hold later tokens. Received a model whose earlier logits "
            f"moved by {moved:.3g} when the last token of a window changed "
            "(a bidirectional encoder?)"
        )


def check_batch_size(model, batch_size, subject):
    message = _recurrent_state.batch_size_error(model, batch_size, subject)
    if message:
        raise ValueError(message)


# The output shape of a model for an input shape, found once: a symbolic
# call traces the whole model (on TensorFlow about 60 ms for a 2 × 256
# RLSTM, as long as scoring 1,500 tokens), and every `evaluate` checks.
# Keyed by the model, kept no longer than it (a Keras model's weights keep
# their shapes once built: layers cannot be added, variables not reshaped);
# `None`: no symbolic call.
_OUTPUT_SHAPES = weakref.WeakKeyDictionary()


def _output_shape(model, batch_size, time):
    try:
        shapes = _OUTPUT_SHAPES.setdefault(model, {})
    except TypeError:  # not weakly referable: not cached
        shapes = {}
    key = (batch_size, time)
    if key not in shapes:
        try:
            spec = model.compute_output_spec(
                keras.KerasTensor((batch_size, time), dtype="int32")
            )
            shapes[key] = tuple(spec.shape)
        except Exception:
            shapes[key] = None
    return shapes[key]


def check_output(model, batch_size, time, vocabulary=None):
    """Raises unless `model` maps ids `(batch, time)` to `(batch, time, vocab)`.

    `vocab` must be at least `vocabulary` (the ids' limit: a target id has
    a logit) when both are known. Found symbolically (`compute_output_spec`:
    nothing runs, no state changes); a model that cannot be called
    symbolically is not checked here.
    """
    shape = _output_shape(model, batch_size, time)
    if shape is None:
        return
    if len(shape) != 3 or shape[0] not in (None, batch_size) or shape[1] not in (
        None, time
    ):
        raise ValueError(
            "Expected the model to map token ids (batch, time) to logits "
            "(batch, time, vocabulary). Received: a model whose output for "
            f"inputs of shape {(batch_size, time)} has shape {shape}"
        )
    if vocabulary is not None and shape[2] is not None and shape[2] < vocabulary:
        raise ValueError(
            f"Expected the model's logits to cover the {vocabulary} token ids "
            f"(a last axis of at least {vocabulary}). Received: logits of "
            f"shape {shape}"
        )


# === Arguments and data ===


def is_sequence(value):
    return isinstance(value, (list, tuple))


def check_verbose(verbose):
    if verbose not in ("auto", 0, 1, 2) or isinstance(verbose, bool):
        raise ValueError(
            f"Expected `verbose` to be 'auto', 0, 1 or 2. Received: verbose={verbose!r}"
        )


def check_callbacks(callbacks):
    if callbacks is None:
        return []
    if not is_sequence(callbacks) or not all(
        isinstance(c, keras.callbacks.Callback) for c in callbacks
    ):
        raise ValueError(
            "Expected `callbacks` to be a list of `keras.callbacks.Callback`. "
            f"Received: callbacks={callbacks!r}"
        )
    return list(callbacks)


def host_array(tensor):
    """A tensor of any backend (a step's result) as a NumPy array."""
    return np.asarray(ops.convert_to_numpy(tensor))


def to_numpy(value):
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    return np.asarray(ops.convert_to_numpy(value))


def check_ids(array, name, limit):
    # No copy when already int32: a view of a corpus's ids stays one.
    return _validation.token_ids(name, array, limit).astype("int32", copy=False)


def as_streams(x, name, limit):
    """`x` as int32 `(streams, time)` after every check, or a ValueError."""
    try:
        array = to_numpy(x)
    except Exception as error:  # ragged lists, objects NumPy cannot read
        raise ValueError(
            f"Expected `{name}` to be an array of token ids. Received: {type(x).__name__}"
        ) from error
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2:
        raise ValueError(
            f"Expected `{name}` to be 1-D (one stream) or 2-D (streams, time). "
            f"Received shape {array.shape}"
        )
    if array.shape[0] < 1 or array.shape[1] < 2:
        raise ValueError(
            f"Expected each stream of `{name}` to hold at least 2 tokens (the "
            f"first is context only). Received shape {array.shape}"
        )
    return check_ids(array, name, limit)


def as_training_stream(data):
    """A 1-D array when `data` is one stream; `None` for an iterable of batches."""
    if isinstance(data, (list, tuple)):
        if data and all(isinstance(t, numbers.Integral) for t in data):
            return np.asarray(data)
        if not data:
            raise ValueError("Expected `data` to be non-empty. Received an empty list")
        return None
    if isinstance(data, np.ndarray) or (
        hasattr(data, "shape") and hasattr(data, "dtype") and not hasattr(data, "element_spec")
    ):
        array = to_numpy(data)
        if array.ndim != 1:
            raise ValueError(
                "Expected `data` to be a 1-D stream of token ids or an iterable "
                f"of `(x, y)` batches. Received an array of shape {array.shape}"
            )
        return array
    if not hasattr(data, "__iter__"):
        raise ValueError(
            "Expected `data` to be a 1-D stream of token ids or an iterable of "
            f"`(x, y)` batches. Received: {type(data).__name__}"
        )
    return None


def check_batch_pair(model, batch, limit, ids_checked=False):
    """A training batch as `(x, y, w)` NumPy arrays after every check."""
    if not (isinstance(batch, (tuple, list)) and len(batch) in (2, 3)):
        raise ValueError(
            "Expected `data` to yield `(x, y)` or `(x, y, sample_weight)` "
            f"batches of token ids. Received: {type(batch).__name__}"
        )
    x, y = (np.asarray(ops.convert_to_numpy(t)) for t in batch[:2])
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(
            "Expected `x` and `y` of a batch to have the same shape "
            f"(batch, time). Received: {x.shape} and {y.shape}"
        )
    if len(batch) == 3:
        w = np.asarray(ops.convert_to_numpy(batch[2]), "float32")
        if w.shape != y.shape or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError(
                "Expected the sample weights of a batch to be finite, "
                f"non-negative and of shape {y.shape}. Received shape {w.shape}"
            )
    else:
        w = np.ones(y.shape, "float32")
    if not ids_checked:
        x = check_ids(x, "data", limit)
        y = check_ids(y, "data", limit)
    size = per_stream_size(model)
    if size is not None and x.shape[0] != size:
        raise ValueError(
            f"Expected batches of exactly {size} streams, the number of "
            f"per-stream adaptation matrices. Received: {x.shape[0]}"
        )
    check_batch_size(model, x.shape[0], "the batch size of `data`")
    return x, y, w
