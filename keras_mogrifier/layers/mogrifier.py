import math

import keras
from keras import constraints
from keras import initializers
from keras import ops
from keras import regularizers

from keras_mogrifier import _validation
from keras_mogrifier._export import register


@register
class MogrifierFactorInitializer(keras.initializers.Initializer):
    """The authors' initialiser for the mogrifier's matrices.

    A truncated normal with standard deviation `(1 / (fan_in * rank)) ** (1/4)`
    for each low-rank factor, so that the product `A @ B` of two factors has a
    variance of about `1 / fan_in`; for a full-rank matrix (`rank=None`) the
    standard deviation is `sqrt(1 / fan_in)`, the same target variance.

    Args:
        fan_in: int. The size of the vector the matrix (or the product of
            factors) is applied to.
        rank: int or None. The rank of the factorisation, `None` for a
            full-rank matrix. Defaults to `None`.
        seed: int or None. Random seed. Defaults to `None`.
    """

    def __init__(self, fan_in, rank=None, seed=None):
        self.fan_in = _validation.positive_int("fan_in", fan_in)
        self.rank = _validation.optional_positive_int("rank", rank)
        self.seed = seed
        self._init = keras.initializers.TruncatedNormal(
            stddev=self.stddev, seed=seed
        )

    @property
    def stddev(self):
        if self.rank is None:
            return math.sqrt(1.0 / self.fan_in)
        return (1.0 / (self.fan_in * self.rank)) ** 0.25

    def __call__(self, shape, dtype=None):
        return self._init(shape, dtype=dtype)

    def get_config(self):
        return {"fan_in": self.fan_in, "rank": self.rank, "seed": self.seed}


@register
class Mogrifier(keras.layers.Layer):
    """Mutual gating of an input and a state vector (the "mogrifier").

    Before an LSTM step, the Mogrifier LSTM lets the input `x` and the previous
    state `h` gate each other for `rounds` rounds, each round using the latest
    value of the other vector. With `x⁻¹ = x` and `h⁰ = h`:

    - odd round `i`:  `xⁱ = 2σ(hⁱ⁻¹ @ Qⁱ + bⁱ) ⊙ xⁱ⁻²`, `Qⁱ` of shape `(n, m)`;
    - even round `i`: `hⁱ = 2σ(xⁱ⁻¹ @ Rⁱ + bⁱ) ⊙ hⁱ⁻²`, `Rⁱ` of shape `(m, n)`.

    So `x` is gated first. Every round has its own matrix. With `rank=k` each
    matrix is the product of two factors, applied as `(h @ A) @ B`, never
    materialised. Because `2σ(0) = 1`, all-zero weights make the layer the
    identity.

    Weights are created round by round, in order: the round's matrix (source ×
    target), or its two factors in the order they are applied
    (source × rank, then rank × target), then its bias. `get_weights()` lists
    them in that order.

    Args:
        rounds: int. The number of gating rounds `r`, at least 1 (a cell with
            zero rounds has no mogrifier).
        rank: int or None. The rank `k` of the factorised matrices; `None` for
            full rank. Must not exceed `min(m, n)`. Defaults to `None`.
        use_bias: bool. Whether each round has a bias (the authors' code adds
            one, initialised to zero; the paper omits it). Defaults to `True`.
        kernel_initializer: initializer for the matrices or factors. `None`
            uses the authors' scheme, `MogrifierFactorInitializer`: a
            truncated normal with stddev `(1/(fan_in·k))^(1/4)` per factor.
            Defaults to `None`.
        bias_initializer: initializer for the biases. Defaults to `"zeros"`.
        kernel_regularizer: regularizer for the matrices. Defaults to `None`.
        bias_regularizer: regularizer for the biases. Defaults to `None`.
        kernel_constraint: constraint for the matrices. Defaults to `None`.
        bias_constraint: constraint for the biases. Defaults to `None`.
        **kwargs: base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: a list `[x, h]` of tensors of shapes `(batch, m)` and
            `(batch, n)`.

    Returns:
        The list `[x_out, h_out]`, of the same shapes.

    Example:

    >>> import numpy as np
    >>> mogrifier = Mogrifier(rounds=5, rank=4)
    >>> x_out, h_out = mogrifier([np.ones((2, 8)), np.ones((2, 16))])
    >>> tuple(x_out.shape), tuple(h_out.shape)
    ((2, 8), (2, 16))

    Reference:
        - [Melis et al., 2020](https://arxiv.org/abs/1909.01792), Mogrifier
          LSTM, ICLR 2020.
    """

    def __init__(
        self,
        rounds,
        rank=None,
        use_bias=True,
        kernel_initializer=None,
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.rounds = _validation.positive_int("rounds", rounds)
        self.rank = _validation.optional_positive_int("rank", rank)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = (
            None
            if kernel_initializer is None
            else initializers.get(kernel_initializer)
        )
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.bias_constraint = constraints.get(bias_constraint)

    def build(self, input_shape):
        x_shape, h_shape = _split_shapes(input_shape)
        m, n = x_shape[-1], h_shape[-1]
        if m is None or n is None:
            raise ValueError(
                "Expected the last dimension of both Mogrifier inputs to be "
                f"known. Received: input_shape={input_shape}"
            )
        if self.rank is not None and self.rank > min(m, n):
            raise ValueError(
                "Expected `rank` to be at most min(input size, state size) = "
                f"min({m}, {n}) = {min(m, n)}, the largest rank of the "
                f"matrices it factors. Received: rank={self.rank}"
            )
        self.input_spec = [
            keras.InputSpec(shape=(None, m)),
            keras.InputSpec(shape=(None, n)),
        ]
        # Per round: a list of matrices applied in sequence, and a bias.
        self._round_kernels = []
        self._round_biases = []
        for i in range(1, self.rounds + 1):
            source, target = (n, m) if i % 2 == 1 else (m, n)
            if self.rank is None:
                shapes = [(source, target)]
                suffixes = [""]
            else:
                shapes = [(source, self.rank), (self.rank, target)]
                suffixes = ["_a", "_b"]
            kernels = []
            for shape, suffix in zip(shapes, suffixes):
                kernels.append(
                    self.add_weight(
                        shape=shape,
                        name=f"round_{i}_kernel{suffix}",
                        initializer=self.kernel_initializer
                        or MogrifierFactorInitializer(source, self.rank),
                        regularizer=self.kernel_regularizer,
                        constraint=self.kernel_constraint,
                    )
                )
            self._round_kernels.append(kernels)
            self._round_biases.append(
                self.add_weight(
                    shape=(target,),
                    name=f"round_{i}_bias",
                    initializer=self.bias_initializer,
                    regularizer=self.bias_regularizer,
                    constraint=self.bias_constraint,
                )
                if self.use_bias
                else None
            )

    def call(self, inputs):
        x, h = inputs
        return list(self.mogrify(self.round_weights(), x, h))

    def round_weights(self, dtype=None):
        """The rounds' weights as tensors: a list of `(matrices, bias)`.

        Read once and passed to `mogrify`, so that a recurrent layer can
        read them once per sequence instead of once per time step. `dtype`
        (default: the compute dtype) is the dtype they are cast to.
        """
        dtype = dtype or self.compute_dtype
        return [
            (
                [ops.cast(kernel, dtype) for kernel in kernels],
                None if bias is None else ops.cast(bias, dtype),
            )
            for kernels, bias in zip(self._round_kernels, self._round_biases)
        ]

    @staticmethod
    def fold_doubling(weights):
        """Moves each round's doubling into the matrices that read its output.

        `2σ(z) ⊙ v` doubles `v`; the next round reads `v` only through a
        matrix product, so `(2v) @ Q = v @ (2Q)`. Given `weights` from
        `round_weights`, returns `(folded, x_scale, h_scale)`: the rounds'
        weights with each round's first matrix multiplied by the product of
        the doublings its input has skipped, and the powers of two by which
        the outputs of `mogrify(folded, x, h, doubled=False)` fall short of
        `mogrify(weights, x, h)` (a cell multiplies the matrices that read
        them). Scaling by a power of two is exact in floating point, so the
        products are the same numbers; the doublings then cost one product
        per matrix per sequence instead of an addition per round per step.
        """
        scales = {"x": 1.0, "h": 1.0}
        folded = []
        for i, (kernels, bias) in enumerate(weights, start=1):
            source, target = ("h", "x") if i % 2 == 1 else ("x", "h")
            if scales[source] != 1.0:
                kernels = [kernels[0] * scales[source]] + list(kernels[1:])
            folded.append((kernels, bias))
            scales[target] *= 2.0
        return folded, scales["x"], scales["h"]

    @staticmethod
    def mogrify(weights, x, h, doubled=True):
        """The rounds on `x` and `h` with `weights` from `round_weights`.

        Returns the tuple `(x, h)` after the last round. With
        `doubled=False` the factor 2 of every round is left out (for weights
        from `fold_doubling`).
        """
        for i, (kernels, bias) in enumerate(weights, start=1):
            z = h if i % 2 == 1 else x
            for kernel in kernels:
                z = ops.matmul(z, kernel)
            if bias is not None:
                # `ops.add` with a bias vector is TensorFlow's BiasAdd, whose
                # gradient is one reduction (`+` also builds a reshape).
                z = ops.add(z, bias)
            # 2σ(z) ⊙ v computed as y + y with y = σ(z) ⊙ v: the same numbers
            # (doubling is exact in floating point), but no product with a
            # constant (TensorFlow would also compute the constant's
            # gradient) and no tensor kept for the backward pass besides the
            # ones it needs anyway.
            if i % 2 == 1:
                x = ops.sigmoid(z) * x
                if doubled:
                    x = x + x
            else:
                h = ops.sigmoid(z) * h
                if doubled:
                    h = h + h
        return x, h

    def compute_output_shape(self, input_shape):
        return list(_split_shapes(input_shape))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "rounds": self.rounds,
                "rank": self.rank,
                "use_bias": self.use_bias,
                "kernel_initializer": (
                    None
                    if self.kernel_initializer is None
                    else initializers.serialize(self.kernel_initializer)
                ),
                "bias_initializer": initializers.serialize(
                    self.bias_initializer
                ),
                "kernel_regularizer": regularizers.serialize(
                    self.kernel_regularizer
                ),
                "bias_regularizer": regularizers.serialize(
                    self.bias_regularizer
                ),
                "kernel_constraint": constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": constraints.serialize(self.bias_constraint),
            }
        )
        return config


def _split_shapes(input_shape):
    if (
        not isinstance(input_shape, (list, tuple))
        or len(input_shape) != 2
        or not all(isinstance(s, (list, tuple)) for s in input_shape)
    ):
        raise ValueError(
            "Expected the Mogrifier to be called on a list of two tensors "
            f"[x, h]. Received: input_shape={input_shape}"
        )
    x_shape, h_shape = (tuple(s) for s in input_shape)
    if len(x_shape) != 2 or len(h_shape) != 2:
        raise ValueError(
            "Expected x and h to be rank-2 tensors of shapes (batch, m) and "
            f"(batch, n). Received: x.shape={x_shape}, h.shape={h_shape}"
        )
    if (
        x_shape[0] is not None
        and h_shape[0] is not None
        and x_shape[0] != h_shape[0]
    ):
        raise ValueError(
            "Expected x and h to have the same batch size. "
            f"Received: x.shape={x_shape}, h.shape={h_shape}"
        )
    return x_shape, h_shape
