"""Greedy decoding: the most probable token."""

from keras import ops

from keras_mogrifier._export import register
from keras_mogrifier.samplers.sampler import Sampler


@register
class GreedySampler(Sampler):
    """Picks the most probable token (`keras_hub.samplers.GreedySampler`).

    Deterministic; the temperature does not change the result.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> logits = np.array([[0.1, 2.0, 0.3]], "float32")
    >>> ops.convert_to_numpy(GreedySampler()(logits, np.zeros(1, "float32"))).tolist()
    [1]
    """

    def get_next_token(self, probabilities, uniform):
        del uniform
        return ops.argmax(probabilities, axis=-1)
