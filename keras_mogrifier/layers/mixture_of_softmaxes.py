import numbers

import keras
from keras import constraints
from keras import initializers
from keras import ops
from keras import regularizers

from keras_mogrifier import _validation
from keras_mogrifier._export import register


@register
class MixtureOfSoftmaxes(keras.layers.Layer):
    """The contexts and mixture weights of a Mixture of Softmaxes.

    Given the vectors `h` that a language model's softmax would read,
    computes `K` component contexts and the mixture's log-weights

    ```
    c_k = tanh(h @ W_p + b_p)[k·e : (k+1)·e]     # k = 0 … K−1, width e each
    log π = log_softmax(h @ W_π)                  # no bias
    ```

and, in training, drops out the contexts `c_k` at rate `dropout` (Yang et
al.'s `dropoutl` on the latent contexts, zihangdai/mos `model.py` lines
96-97; lamb's `downprojected_output_dropout` on each component's input to
the output layer, `lamb/lm.py` lines 215-218). The mask is drawn anew for
every position and component, as lamb draws it (its `shared_mask_dropout`
is off in the released configurations); zihangdai/mos shares one mask over
the time steps of a sequence (`LockedDropout`).

    Each context then goes through the model's one output layer (shared by
    every component: `z_k = c_k @ E_outᵀ + b`) and `mix` combines the
    components in the log domain,

    ```
    log p(w | h) = logsumexp_k (log π_k + log_softmax(z_k)_w)
    ```

    which is `log Σ_k π_k softmax(z_k)_w`, computed without leaving the log
    domain (as deepmind/lamb `utils.py` `mixture_of_softmaxes`, its
    log-domain branch). A single softmax's matrix of log-probabilities over
    many contexts has rank at most `e + 1`; a mixture's is not so bounded
    (the "softmax bottleneck" of Yang et al.). With `components=1` the layer
    is a `tanh` projection before one softmax (π = 1), as lamb allows.

    Args:
        components: int. Number of components `K` (at least 1).
        context_units: int. Width `e` of each context: the output layer's
            input width (the embedding width with tied embeddings).
        kernel_initializer: initializer of `projection_kernel` (`W_p`) and
            `weights_kernel` (`W_π`). Defaults to `"glorot_uniform"`.
        bias_initializer: initializer of `projection_bias` (`b_p`).
            Defaults to `"zeros"`.
        kernel_regularizer: regularizer of both kernels. Defaults to `None`.
        bias_regularizer: regularizer of `b_p`. Defaults to `None`.
        kernel_constraint: constraint of both kernels. Defaults to `None`.
        bias_constraint: constraint of `b_p`. Defaults to `None`.
        dropout: float in `[0, 1)`. Dropout rate of the contexts in
            training. Defaults to `0.0`.
        seed: int or None. Seed of the dropout masks. Defaults to `None`.
        **kwargs: base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: float tensor `(..., width)`: the vectors `h`.
        training: bool. Drop out the contexts. Defaults to `False`.

    Returns:
        A tuple `(contexts, log_weights)`: `(..., K, e)` and `(..., K)`.

    Example:

    >>> import numpy as np
    >>> mos = MixtureOfSoftmaxes(components=3, context_units=4)
    >>> contexts, log_weights = mos(np.ones((2, 5, 8), "float32"))
    >>> tuple(contexts.shape), tuple(log_weights.shape)
    ((2, 5, 3, 4), (2, 5, 3))
    >>> logits = np.zeros((2, 5, 3, 10), "float32")  # c_k @ W + b
    >>> log_p = mos.mix(logits, log_weights)
    >>> bool(np.allclose(np.exp(log_p).sum(-1), 1.0, atol=1e-5))
    True

    Reference:
        - [Yang et al., 2018](https://arxiv.org/abs/1711.03953), Breaking
          the Softmax Bottleneck: A High-Rank RNN Language Model.
        - [Melis et al., 2020](https://arxiv.org/abs/1909.01792), Mogrifier
          LSTM (K = 2 on Wikitext-2).
    """

    def __init__(
        self,
        components,
        context_units,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        dropout=0.0,
        seed=None,
        **kwargs,
    ):
        components = check_components(components, minimum=1, name="components")
        dropout = _validation.rate("dropout", dropout)
        if (
            not isinstance(context_units, numbers.Integral)
            or isinstance(context_units, bool)
            or context_units <= 0
        ):
            raise ValueError(
                "Expected `context_units` to be a positive integer. "
                f"Received: context_units={context_units!r}"
            )
        super().__init__(**kwargs)
        self.components = components
        self.context_units = int(context_units)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.bias_constraint = constraints.get(bias_constraint)
        self.dropout = dropout
        self.seed = seed
        self.dropout_layer = keras.layers.Dropout(dropout, seed=seed, name="dropout")

    def build(self, input_shape):
        width = input_shape[-1]
        self.projection_kernel = self.add_weight(
            shape=(width, self.components * self.context_units),
            name="projection_kernel",
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        self.projection_bias = self.add_weight(
            shape=(self.components * self.context_units,),
            name="projection_bias",
            initializer=self.bias_initializer,
            regularizer=self.bias_regularizer,
            constraint=self.bias_constraint,
        )
        self.weights_kernel = self.add_weight(
            shape=(width, self.components),
            name="weights_kernel",
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )

    def call(self, inputs, training=False):
        contexts = ops.tanh(
            ops.matmul(inputs, self.projection_kernel) + self.projection_bias
        )
        shape = tuple(ops.shape(inputs)[:-1]) + (self.components, self.context_units)
        contexts = ops.reshape(contexts, shape)
        if self.dropout > 0:
            contexts = self.dropout_layer(contexts, training=training)
        log_weights = ops.log_softmax(
            ops.cast(ops.matmul(inputs, self.weights_kernel), "float32"), axis=-1
        )
        return contexts, log_weights

    def mix(self, component_logits, log_weights):
        """`log Σ_k π_k softmax(z_k)`, in the log domain.

        Args:
            component_logits: float tensor `(..., K, vocab)`: `z_k`, the
                output layer applied to each context (temperature included).
            log_weights: float tensor `(..., K)`: `log π`, from `call`.

        Returns:
            A float32 tensor `(..., vocab)` of normalised log-probabilities
            (its `logsumexp` over the last axis is 0).
        """
        log_p = ops.log_softmax(ops.cast(component_logits, "float32"), axis=-1)
        log_weights = ops.expand_dims(ops.cast(log_weights, "float32"), -1)
        return ops.logsumexp(log_p + log_weights, axis=-2)

    def compute_output_spec(self, inputs, training=False):
        lead = tuple(inputs.shape[:-1])
        return (
            keras.KerasTensor(
                lead + (self.components, self.context_units), dtype=self.compute_dtype
            ),
            keras.KerasTensor(lead + (self.components,), dtype="float32"),
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "components": self.components,
                "context_units": self.context_units,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer),
                "kernel_regularizer": regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": regularizers.serialize(self.bias_regularizer),
                "kernel_constraint": constraints.serialize(self.kernel_constraint),
                "bias_constraint": constraints.serialize(self.bias_constraint),
                "dropout": self.dropout,
                "seed": self.seed,
            }
        )
        return config


def check_components(value, minimum=0, name="mixture_of_softmaxes"):
    """`K` as an int ≥ `minimum`, or a ValueError saying what was expected."""
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, bool)
        or value < minimum
    ):
        what = (
            "a non-negative integer (0: one softmax; K ≥ 1: a mixture of K "
            "softmaxes)"
            if minimum == 0
            else f"an integer ≥ {minimum}"
        )
        raise ValueError(f"Expected `{name}` to be {what}. Received: {name}={value!r}")
    return int(value)
