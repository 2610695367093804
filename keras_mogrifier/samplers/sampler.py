"""The base class of the samplers: temperature, then one token per row."""

from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register


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

    Args:
        temperature: float. The logits are divided by it (> 0): below 1 the
            distribution sharpens (towards greedy as it goes to 0), above 1
            it flattens. Defaults to `1.0`.

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
        self.temperature = _validation.positive_float("temperature", temperature)

    def __call__(self, logits, uniform):
        """The next token of every row.

        Args:
            logits: float tensor `(batch, vocabulary)`.
            uniform: float32 tensor `(batch,)`, uniform in `[0, 1)`.

        Returns:
            An int32 tensor `(batch,)`.
        """
        probabilities = self.compute_probabilities(logits)
        return ops.cast(self.get_next_token(probabilities, uniform), "int32")

    def compute_probabilities(self, logits):
        """`softmax(logits / temperature)`, in float32."""
        logits = ops.cast(logits, "float32")
        return ops.softmax(logits / self.temperature, axis=-1)

    def get_next_token(self, probabilities, uniform):
        """The next token of every row (override this).

        Args:
            probabilities: float32 tensor `(batch, vocabulary)`.
            uniform: float32 tensor `(batch,)`, uniform in `[0, 1)`: the
                randomness of this step.

        Returns:
            An integer tensor `(batch,)`.
        """
        raise NotImplementedError

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
