import keras
from keras import activations
from keras import constraints
from keras import initializers
from keras import ops
from keras import regularizers

from keras_mogrifier import _validation
from keras_mogrifier._export import register


@register
class DualOutput(keras.layers.Layer):
    """The dual connection: the output sees the current input directly.

    Given the input embeddings `e_t` and the recurrent outputs `h_t`, computes

    ```
    d_t = activation(e_t @ W_de + h_t @ W_dh + b_d)
    ```

    so the output layer of a language model (`softmax(d_t @ W_yd + b_y)`) is
    not only a function of the recurrent state but also of the token just
    read, skipping the recurrence. Dropout is applied to each input — the
    embedding path `e_t` (`embedding_dropout`) and the recurrent path `h_t`
    (`hidden_dropout`), both `dropout` unless given — and to `d_t`
    (`output_dropout`), a new mask at every time step. The Dual paper tunes
    the two paths separately (its Table 1: "Dual input dropout" before the
    dual layer and "Rec. output dropout" after the last recurrent layer);
    `dropout` is the shorthand for one rate on both.

    Args:
        units: int. Width of `d_t`. With tied embeddings it equals the
            embedding width.
        activation: activation function. Defaults to `"relu"`.
        dropout: float in [0, 1). Dropout rate of both inputs, unless
            `embedding_dropout` / `hidden_dropout` say otherwise. Defaults to
            `0.0`.
        output_dropout: float in [0, 1). Dropout rate of the output. Defaults
            to `0.0`.
        embedding_dropout: float in [0, 1) or None. Dropout rate of the
            embeddings `e_t`; `None` is `dropout`. Defaults to `None`.
        hidden_dropout: float in [0, 1) or None. Dropout rate of the
            recurrent outputs `h_t`; `None` is `dropout`. Defaults to
            `None`.
        use_bias: bool. Whether to add `b_d`. Defaults to `True`.
        kernel_initializer: initializer of `embedding_kernel` (`W_de`) and
            `state_kernel` (`W_dh`). Defaults to `"glorot_uniform"`.
        bias_initializer: initializer of `bias`. Defaults to `"zeros"`.
        kernel_regularizer: regularizer of both kernels. Defaults to `None`.
        bias_regularizer: regularizer of `bias`. Defaults to `None`.
        kernel_constraint: constraint of both kernels. Defaults to `None`.
        bias_constraint: constraint of `bias`. Defaults to `None`.
        seed: int or None. Seed of the dropout masks. Defaults to `None`.
        **kwargs: base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: a list `[embeddings, recurrent_outputs]` of tensors of shapes
            `(batch, time, e)` and `(batch, time, n)` (or `(batch, e)` and
            `(batch, n)`).
        training: bool. Whether dropout is applied.
        mask: optional; the mask of the inputs is passed through.

    Example:

    >>> import numpy as np
    >>> dual = DualOutput(8)
    >>> tuple(dual([np.ones((2, 5, 8)), np.ones((2, 5, 16))]).shape)
    (2, 5, 8)

    Reference:
        - The Importance of the Current Input in Sequence Modeling (ICLR 2022
          submission), equations 4–7.
    """

    def __init__(
        self,
        units,
        activation="relu",
        dropout=0.0,
        output_dropout=0.0,
        embedding_dropout=None,
        hidden_dropout=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        **kwargs,
    ):
        units = _validation.positive_int("units", units)
        dropout = _validation.rate("dropout", dropout)
        output_dropout = _validation.rate("output_dropout", output_dropout)
        if embedding_dropout is not None:
            embedding_dropout = _validation.rate("embedding_dropout", embedding_dropout)
        if hidden_dropout is not None:
            hidden_dropout = _validation.rate("hidden_dropout", hidden_dropout)
        super().__init__(**kwargs)
        self.units = units
        self.activation = activations.get(activation)
        self.dropout = dropout
        self.output_dropout = output_dropout
        self.embedding_dropout = embedding_dropout
        self.hidden_dropout = hidden_dropout
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.bias_constraint = constraints.get(bias_constraint)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def build(self, input_shape):
        e_shape, h_shape = _split_shapes(input_shape)
        self.embedding_kernel = self.add_weight(
            shape=(e_shape[-1], self.units),
            name="embedding_kernel",
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        self.state_kernel = self.add_weight(
            shape=(h_shape[-1], self.units),
            name="state_kernel",
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        self.bias = (
            self.add_weight(
                shape=(self.units,),
                name="bias",
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )
            if self.use_bias
            else None
        )
        ndim = len(e_shape)
        self.input_spec = [
            keras.InputSpec(ndim=ndim, axes={-1: e_shape[-1]}),
            keras.InputSpec(ndim=ndim, axes={-1: h_shape[-1]}),
        ]

    @property
    def embedding_dropout_rate(self):
        """The dropout rate of the embedding path in use."""
        return self.dropout if self.embedding_dropout is None else self.embedding_dropout

    @property
    def hidden_dropout_rate(self):
        """The dropout rate of the recurrent path in use."""
        return self.dropout if self.hidden_dropout is None else self.hidden_dropout

    def _dropout(self, x, rate, training):
        if training and rate > 0.0:
            return keras.random.dropout(x, rate, seed=self.seed_generator)
        return x

    def call(self, inputs, training=False, mask=None):
        e, h = inputs
        e = self._dropout(e, self.embedding_dropout_rate, training)
        h = self._dropout(h, self.hidden_dropout_rate, training)
        d = ops.matmul(e, self.embedding_kernel) + ops.matmul(
            h, self.state_kernel
        )
        if self.bias is not None:
            d = d + self.bias
        return self._dropout(self.activation(d), self.output_dropout, training)

    def compute_mask(self, inputs, mask=None):
        if mask is None:
            return None
        masks = [m for m in mask if m is not None]
        if not masks:
            return None
        out = masks[0]
        for m in masks[1:]:
            out = ops.logical_and(out, m)
        return out

    def compute_output_shape(self, input_shape):
        e_shape, _ = _split_shapes(input_shape)
        return tuple(e_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "activation": activations.serialize(self.activation),
                "dropout": self.dropout,
                "output_dropout": self.output_dropout,
                "embedding_dropout": self.embedding_dropout,
                "hidden_dropout": self.hidden_dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": initializers.serialize(
                    self.kernel_initializer
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
                "seed": self.seed,
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
            "Expected DualOutput to be called on a list of two tensors "
            f"[embeddings, recurrent_outputs]. Received: input_shape={input_shape}"
        )
    e_shape, h_shape = (tuple(s) for s in input_shape)
    if len(e_shape) != len(h_shape) or len(e_shape) not in (2, 3):
        raise ValueError(
            "Expected embeddings and recurrent outputs to be both of shape "
            "(batch, time, features) or both (batch, features). "
            f"Received: shapes {e_shape} and {h_shape}"
        )
    if e_shape[:-1] != h_shape[:-1] and None not in e_shape[:-1] + h_shape[:-1]:
        raise ValueError(
            "Expected embeddings and recurrent outputs to agree in all but "
            f"the last dimension. Received: shapes {e_shape} and {h_shape}"
        )
    return e_shape, h_shape
