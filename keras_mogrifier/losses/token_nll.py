"""Per-token negative log-likelihood, with an optional dropout-sample axis.

This is the one place where the package turns logits into per-token losses:
`IWAEDropoutLoss`, `Perplexity` and `BitsPerCharacter` all call `token_nll`.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_mogrifier import backend

try:  # Keras >= 3.8 keeps masks behind this accessor.
    from keras.src.backend import get_keras_mask as _get_keras_mask
except ImportError:  # pragma: no cover - older Keras 3 releases

    def _get_keras_mask(x):
        return getattr(x, "_keras_mask", None)


def get_keras_mask(x):
    """Returns the Keras mask attached to tensor `x`, or `None`."""
    return _get_keras_mask(x)


def _static_dim(shape, axis):
    dim = shape[axis]
    return None if dim is None else int(dim)


def _concrete_value(x):
    """NumPy value of `x` when it has one (eager), `None` inside a traced or
    compiled graph."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, keras.KerasTensor):
        return None
    # Traced (`torch.compile` too, whose tensors still convert): reading
    # the value would copy it to the host and split the compiled graph.
    if not backend.get_backend_module().is_concrete(x):
        return None
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # symbolic tensor of a tf.function / jax.jit trace
        return None


def _sample_axis_layout(true_rank, pred_rank):
    if pred_rank == true_rank + 1:
        return False
    if pred_rank == true_rank + 2:
        return True
    raise ValueError(
        "Expected `y_pred` to be logits of shape `y_true.shape + (vocab,)` "
        "or, with a sample axis, `(batch, samples) + y_true.shape[1:] + "
        f"(vocab,)`. Received: y_true of rank {true_rank} and y_pred of rank "
        f"{pred_rank}"
    )


def _check_shapes(true_shape, pred_shape, has_samples):
    expected = list(true_shape)
    if has_samples:
        expected.insert(1, pred_shape[1])
    for axis, (want, got) in enumerate(zip(expected, pred_shape[:-1])):
        if want is not None and got is not None and int(want) != int(got):
            raise ValueError(
                "Expected the leading axes of `y_pred` (logits) to match "
                "`y_true`"
                + (" after the sample axis" if has_samples else "")
                + f". Received: y_true.shape={tuple(true_shape)}, "
                f"y_pred.shape={tuple(pred_shape)} (axis {axis} differs)"
            )


def token_nll(y_true, y_pred, samples=None):
    """Per-token negative log-likelihood in nats, from logits.

    With logits of shape `(batch, time, vocab)` this is the ordinary sparse
    categorical cross-entropy `-log_softmax(logits)[w]`. With a sample axis,
    logits `(batch, samples, time, vocab)` holding D dropout samples of each
    sequence, the D *probabilities* of the target are averaged before the log
    (Circling Back §4):

    `nll_t = -(logsumexp_d log_softmax(logits_d)[w_t] - ln D)`.

    The target's log-probability comes from the backend's sparse softmax
    cross-entropy from logits (a fused, stable log-softmax on TensorFlow) and
    the samples are combined with log-sum-exp, so no probability underflows:
    the result is finite for logits of any magnitude. Half-precision logits
    are promoted to float32.

    Token ids must lie in `[0, vocab)`. When the ids have a concrete value
    (eager calls) an id outside that range raises a `ValueError`; inside a
    compiled graph (`model.fit`), where values are not known while tracing,
    the loss of such a token is NaN instead of a silently wrong number.

    Args:
        y_true: int tensor. Target ids, shape `(batch, time)` (any number of
            axes after the batch axis is accepted).
        y_pred: float tensor. Logits, `y_true.shape + (vocab,)` or
            `(batch, samples) + y_true.shape[1:] + (vocab,)`.
        samples: int or `None`. When an int D, `y_pred` must have a sample
            axis of size D (D = 1 also accepts logits without one).
            `None` infers the layout from the ranks. Defaults to `None`.

    Returns:
        A float tensor of shape `y_true.shape`: the loss of every token.

    Example:

    >>> import numpy as np
    >>> logits = np.zeros((2, 3, 5), "float32")   # uniform over 5 tokens
    >>> nll = token_nll(np.zeros((2, 3), "int32"), logits)
    >>> bool(np.allclose(nll, np.log(5.0)))
    True

    Reference:
        Melis, G. "Circling Back to Recurrent Models of Language", 2022, §4.
    """
    if samples is not None and (
        isinstance(samples, bool)
        or not isinstance(samples, (int, np.integer))
        or samples < 1
    ):
        raise ValueError(
            "Expected `samples` to be a positive integer (the number D of "
            f"dropout samples) or None. Received: samples={samples!r}"
        )
    logits = ops.convert_to_tensor(y_pred)
    if ops.dtype(logits) not in ("float32", "float64"):
        logits = ops.cast(logits, "float32")
    ids = ops.convert_to_tensor(y_true)
    true_shape = tuple(ids.shape)
    pred_shape = tuple(logits.shape)
    has_samples = _sample_axis_layout(len(true_shape), len(pred_shape))
    if samples is not None and samples > 1 and not has_samples:
        raise ValueError(
            f"Expected `y_pred` to have a sample axis of size {samples}, "
            "shape `(batch, samples, time, vocab)`. Received: "
            f"y_pred.shape={pred_shape} (no sample axis)"
        )
    if has_samples:
        num_samples = _static_dim(pred_shape, 1)
        if num_samples is not None and num_samples < 1:
            raise ValueError(
                "Expected the sample axis of `y_pred` (axis 1) to hold at "
                f"least one sample. Received: y_pred.shape={pred_shape}"
            )
        if samples is not None and num_samples is not None:
            if num_samples != samples:
                raise ValueError(
                    f"Expected `y_pred` to have {samples} samples on axis 1. "
                    f"Received: y_pred.shape={pred_shape}"
                )
    _check_shapes(true_shape, pred_shape, has_samples)

    vocab = _static_dim(pred_shape, -1)
    if vocab is not None and vocab < 1:
        raise ValueError(
            f"Expected a vocabulary axis of size >= 1. Received: "
            f"y_pred.shape={pred_shape}"
        )
    ids_value = _concrete_value(y_true)
    if ids_value is not None and vocab is not None and ids_value.size:
        ids_value = np.asarray(ids_value)
        bad = (
            (ids_value < 0) | (ids_value >= vocab) | (ids_value != np.round(ids_value))
        )
        if np.any(bad):
            first = float(ids_value[bad].flat[0])
            first = int(first) if first.is_integer() else first
            raise ValueError(
                "Expected `y_true` to hold token ids in [0, vocab) with "
                f"vocab={vocab} (the last axis of the logits). Received: "
                f"id {first} at index {tuple(int(i) for i in np.argwhere(bad)[0])}"
                f" ({int(bad.sum())} out-of-range ids in all)"
            )

    ids = ops.cast(ids, "int32")
    vocab_size = ops.shape(logits)[-1]
    valid = ops.logical_and(ops.greater_equal(ids, 0), ops.less(ids, vocab_size))
    safe_ids = ops.where(valid, ids, ops.zeros_like(ids))
    if has_samples:
        safe_ids = ops.expand_dims(safe_ids, 1)
        safe_ids = ops.broadcast_to(safe_ids, ops.shape(logits)[:-1])
    # -log_softmax(logits)[w]; on TensorFlow the fused (stable) sparse
    # softmax cross-entropy kernel (see `backend.sparse_crossentropy`).
    log_prob = ops.negative(backend.sparse_crossentropy(safe_ids, logits))
    if has_samples:
        num = ops.cast(ops.shape(logits)[1], log_prob.dtype)
        log_prob = ops.logsumexp(log_prob, axis=1) - ops.log(num)
    nll = ops.negative(log_prob)
    return ops.where(valid, nll, ops.full_like(nll, math.nan))

