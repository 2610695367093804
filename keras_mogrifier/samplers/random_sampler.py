"""Ancestral sampling from the whole distribution."""

from keras_mogrifier._export import register
from keras_mogrifier.samplers.sampler import Sampler
from keras_mogrifier.samplers.sampler import sample_from


@register
class RandomSampler(Sampler):
    """Draws the next token from `softmax(logits / temperature)`.

    As `keras_hub.samplers.RandomSampler`: every token can come out, with
    its (tempered) probability.

    Args:
        temperature: float. Defaults to `1.0`.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> logits = np.log(np.array([[0.2, 0.5, 0.3]], "float32"))
    >>> ops.convert_to_numpy(RandomSampler()(logits, np.array([0.6], "float32"))).tolist()
    [1]
    """

    def get_next_token(self, probabilities, uniform):
        return sample_from(probabilities, uniform)
