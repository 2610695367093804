"""The base class of the samplers: temperature, then one token per row."""

import contextlib
import threading

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register

# Below this the division by the temperature leaves float32's normal range
# (compiled code flushes subnormal numbers to zero): refused. Every
# temperature above it samples exactly (towards greedy as it shrinks),
# because the logits are shifted by their maximum before the division.
MIN_TEMPERATURE = 1e-30


def stable_logits(logits, temperature):
    """`(logits − max) / temperature`, float32: the same softmax as
    `logits / temperature`, and finite for every temperature ≥
    `MIN_TEMPERATURE` (the most probable tokens get 0, the others a large
    negative number, or −inf: the greedy limit)."""
    logits = ops.cast(logits, "float32")
    shifted = logits - ops.max(logits, axis=-1, keepdims=True)
    return shifted / temperature


def check_temperature(temperature):
    temperature = _validation.positive_float("temperature", temperature)
    if temperature < MIN_TEMPERATURE:
        raise ValueError(
            f"Expected `temperature` ≥ {MIN_TEMPERATURE:g} (below it float32 "
            "cannot divide the logits by it reliably; any temperature that "
            "small is greedy decoding: use `GreedySampler`). Received: "
            f"temperature={temperature!r}"
        )
    return temperature


@register
class Sampler:
    """Picks the next token of every row from the model's logits.

    The samplers have the names, arguments and meanings of
    `keras_hub.samplers`: the logits are divided by `temperature`, turned
    into probabilities, and `get_next_token` picks one token per row from
    them. Unlike keras-hub's, a sampler here holds no random state: each
    decoding step hands it one uniform number in `[0, 1)` per row, drawn on
    the host from `generate`'s `seed`. A random sampler turns it into a
    token by inverting the cumulative distribution (`sample_from`), so the
    same seed gives the same text on every backend, and the compiled
    decoding step stays a pure function.

    A sampler is called inside the compiled decoding step: write
    `get_next_token` with `keras.ops` only.

    Called directly with concrete values (eagerly), a sampler checks them:
    logits of shape `(batch, vocabulary)` without NaN (−inf is allowed: a
    token that cannot come out), uniforms of shape `(batch,)` in `[0, 1)`;
    inside a compiled step it checks the shapes (the decoding loop checks
    the uniforms on the host).

    Args:
        temperature: float. The logits are divided by it (at least
            `MIN_TEMPERATURE`, 1e-30): below 1 the distribution sharpens
            (the greedy choice in the limit, exactly: the logits are shifted
            by their maximum first), above 1 it flattens. Defaults to `1.0`.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> class NeverTheFirst(Sampler):
    ...     # Greedy, except that token 0 is never picked.
    ...     def get_next_token(self, probabilities, uniform):
    ...         probabilities = ops.slice_update(
    ...             probabilities, (0, 0), ops.zeros((ops.shape(probabilities)[0], 1)))
    ...         return ops.argmax(probabilities, axis=-1)
    >>> logits = np.array([[3.0, 1.0, 2.0]], "float32")
    >>> int(NeverTheFirst()(logits, np.zeros(1, "float32"))[0])
    2
    """

    def __init__(self, temperature=1.0):
        self.temperature = check_temperature(temperature)

    def __call__(self, logits, uniform):
        """The next token of every row.

        Args:
            logits: float tensor `(batch, vocabulary)`.
            uniform: float32 tensor `(batch,)`, uniform in `[0, 1)`.

        Returns:
            An int32 tensor `(batch,)`.

        Raises:
            ValueError: for logits that are not `(batch, vocabulary)` or hold
                NaN, or uniforms that are not `(batch,)` in `[0, 1)`.
        """
        if not hasattr(logits, "shape"):
            logits = np.asarray(logits, "float32")
        if not hasattr(uniform, "shape"):
            uniform = np.asarray(uniform)
        _check_inputs(logits, uniform)
        probabilities = self.compute_probabilities(logits)
        return ops.cast(self.get_next_token(probabilities, uniform), "int32")

    def compute_probabilities(self, logits):
        """`softmax(logits / temperature)`, in float32."""
        return ops.softmax(stable_logits(logits, self.temperature), axis=-1)

    def get_next_token(self, probabilities, uniform):
        """The next token of every row (override this).

        Args:
            probabilities: float32 tensor `(batch, vocabulary)`.
            uniform: float32 tensor `(batch,)`, uniform in `[0, 1)`: the
                randomness of this step.

        Returns:
            An integer tensor `(batch,)`.
        """
        raise NotImplementedError(
            f"`{type(self).__name__}` must override `get_next_token(self, "
            "probabilities, uniform)`: return one token id per row (an int "
            "tensor of shape (batch,)) from the tempered probabilities "
            "(batch, vocabulary) and one uniform number in [0, 1) per row, "
            "with `keras.ops`. `Sampler` itself picks no token."
        )

    def get_config(self):
        return {"temperature": self.temperature}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        settings = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({settings})"


def sample_from(weights, uniform):
    """One index per row, drawn in proportion to `weights` (inverse CDF).

    Row `i` gets the first index whose cumulative weight exceeds
    `uniform[i] × total weight`: index `j` with probability
    `weights[j] / Σ weights`. Only indices of positive weight can come out
    (rounding in the cumulative sum cannot pick a zero-weight one).

    Args:
        weights: float tensor `(batch, n)`, non-negative, a positive sum per
            row (unnormalised probabilities).
        uniform: float tensor `(batch,)` in `[0, 1)`.

    Returns:
        An int32 tensor `(batch,)`.
    """
    weights = ops.cast(weights, "float32")
    cumulative = ops.cumsum(weights, axis=-1)
    threshold = ops.cast(uniform, "float32")[:, None] * cumulative[:, -1:]
    positive = ops.greater(weights, 0.0)
    chosen = ops.logical_and(ops.greater(cumulative, threshold), positive)
    first = ops.argmax(ops.cast(chosen, "int32"), axis=-1)
    # `uniform` close to 1 can round the threshold up to the total: take the
    # last index of positive weight then.
    n = ops.shape(weights)[-1]
    last = n - 1 - ops.argmax(ops.cast(ops.flip(positive, axis=-1), "int32"), axis=-1)
    found = ops.any(chosen, axis=-1)
    return ops.cast(ops.where(found, first, last), "int32")


class _Trusted(threading.local):
    depth = 0


_TRUSTED = _Trusted()


@contextlib.contextmanager
def inputs_checked():
    """Inside it, samplers check shapes but not values: the decoding step's
    uniforms were checked on the host and its logits come from the model."""
    _TRUSTED.depth += 1
    try:
        yield
    finally:
        _TRUSTED.depth -= 1


def _check_inputs(logits, uniform):
    """Shapes always; values when they are concrete (an eager call)."""
    from keras_mogrifier.backend import get_backend_module

    logits_shape = tuple(logits.shape)
    uniform_shape = tuple(uniform.shape)
    if len(logits_shape) != 2:
        raise ValueError(
            "Expected `logits` of shape (batch, vocabulary). Received: "
            f"logits.shape={logits_shape}"
        )
    if len(uniform_shape) != 1 or (
        uniform_shape[0] is not None
        and logits_shape[0] is not None
        and uniform_shape[0] != logits_shape[0]
    ):
        raise ValueError(
            f"Expected `uniform` of shape ({logits_shape[0]},), one number "
            f"per row of the logits. Received: uniform.shape={uniform_shape}"
        )
    concrete = get_backend_module().is_concrete
    if _TRUSTED.depth or not (concrete(logits) and concrete(uniform)):
        return
    values = np.asarray(_validation.to_host(logits), "float32")
    if np.isnan(values).any() or np.isposinf(values).any():
        row = int(np.argwhere(np.isnan(values) | np.isposinf(values))[0][0])
        raise ValueError(
            "Expected finite logits (or −inf for a token that cannot come "
            f"out). Received: NaN or +inf in row {row}"
        )
    if np.isneginf(values).all(axis=-1).any():
        row = int(np.flatnonzero(np.isneginf(values).all(axis=-1))[0])
        raise ValueError(
            f"Expected at least one finite logit per row. Received: row {row} "
            "all −inf"
        )
    u = np.asarray(_validation.to_host(uniform))
    if not np.issubdtype(u.dtype, np.floating) or not np.all((u >= 0) & (u < 1)):
        raise ValueError(
            "Expected `uniform` to hold floats in [0, 1). Received: "
            f"dtype {u.dtype}, min {u.min() if u.size else None}, max "
            f"{u.max() if u.size else None}"
        )
