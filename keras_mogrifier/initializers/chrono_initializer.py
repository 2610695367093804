import keras
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register


@register
class ChronoInitializer(keras.initializers.Initializer):
    """Chrono initialisation of a forget-gate bias (Tallec & Ollivier, 2018).

    Draws `b ~ ln U(1, t_max - 1)`, so that the forget gates start with
    characteristic memory times spread between 1 and `t_max` steps. The
    original method also sets the input-gate bias to `-b`; every cell of this
    package (`MogrifierLSTMCell`, `RLSTMCell`) does that when given
    `chrono_t_max`, unless built with `chrono_input_bias=False` (forget bias
    only, as Circling Back §3 words it).

    Args:
        t_max: float. The longest dependency expected, in time steps; must be
            larger than 2. The Circling Back paper tunes it in `[e², e⁵]`.
        seed: int or None. Random seed. Defaults to `None`.

    Example:

    >>> init = ChronoInitializer(t_max=50.0, seed=1)
    >>> b = init(shape=(4,))
    >>> bool(((b >= 0) & (b <= 3.9)).numpy().all())
    True

    Reference:
        - [Tallec & Ollivier, 2018](https://arxiv.org/abs/1804.11188), Can
          recurrent neural networks warp time?
    """

    def __init__(self, t_max, seed=None):
        t_max = _validation.positive_float("t_max", t_max)
        if t_max <= 2.0:
            raise ValueError(
                "Expected `t_max` to be larger than 2, so that U(1, t_max - 1) "
                f"is not empty. Received: t_max={t_max}"
            )
        self.t_max = t_max
        self.seed = seed
        self._uniform = keras.initializers.RandomUniform(
            minval=1.0, maxval=t_max - 1.0, seed=seed
        )

    def __call__(self, shape, dtype=None):
        return ops.log(self._uniform(shape, dtype=dtype))

    def get_config(self):
        return {"t_max": self.t_max, "seed": self.seed}
