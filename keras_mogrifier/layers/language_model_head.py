import keras
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier import backend
from keras_mogrifier._export import register
from keras_mogrifier.layers.dual_output import DualOutput
from keras_mogrifier.layers.mixture_of_softmaxes import MixtureOfSoftmaxes
from keras_mogrifier.layers.mixture_of_softmaxes import check_components
from keras_mogrifier.losses.chunked_log_softmax import chunked_target_log_softmax

DEFAULT_CHUNK_SIZE = 1024


@register
class LanguageModelHead(keras.layers.Layer):
    """The output of a language model: features to next-token logits.

    Reads features `h` `(..., units)` (and, with the Dual head, the input
    embeddings `e` of the same positions) and computes

    ```
    s = Dual(e, h) or h ⊙ M_out          # the Dual head, or output dropout
    s = s @ W_p   (tied, width ≠ embedding width, no mixture)
    logits = τ · (s @ E_outᵀ + b_out)     # τ only at inference
    ```

    With tied embeddings `E_out` is the table of the `embedding` layer it is
    given (the backbone's); otherwise the head owns a `Dense` output layer.
    With `mixture_of_softmaxes = K ≥ 1` the output is
    `log Σ_k π_k softmax(τ z_k)`, a `MixtureOfSoftmaxes` on `s` through the
    same output layer (normalised log-probabilities).
    `target_log_probabilities` computes `log p(target)` from `s` a chunk of
    tokens at a time, never forming the `(tokens, vocabulary)` logits.

    Args:
        vocabulary_size: int. Number of token ids.
        units: int. Width of the features it reads.
        embedding_dim: int or None. Width of the input embeddings (the tied
            table's width and the Dual head's embedding path); `None` is
            `units`. Defaults to `None`.
        embedding: `keras.layers.Embedding` or None. With
            `tie_embeddings=True`, the layer whose table is the output
            layer's kernel (a `LanguageModel` attaches its backbone's).
            Not part of the config. Defaults to `None`.
        tie_embeddings: bool. Share the input and output embeddings.
            Defaults to `True`.
        output_dropout: float. Dropout before the output layer (or of the
            Dual head's output). Defaults to `0.0`.
        dual: bool. Add the Dual head. Defaults to `False`.
        dual_units: int or None. Width of the Dual head; `None` is the
            embedding width when tied, else `units`. Defaults to `None`.
        dual_dropout: float. Dropout of both inputs of the Dual head.
            Defaults to `0.0`.
        dual_embedding_dropout: float or None. Of its embedding path; `None`
            is `dual_dropout`. Defaults to `None`.
        dual_hidden_dropout: float or None. Of its recurrent path; `None` is
            `dual_dropout`. Defaults to `None`.
        mixture_of_softmaxes: int. `K` components; `0` is the single
            softmax. Defaults to `0`.
        mixture_dropout: float. Dropout of the mixture's contexts in
            training. Defaults to `0.0`.
        temperature: float. Softmax temperature τ (logits × τ at
            inference). Defaults to `1.0`.
        l2: float. L2 coefficient of every weight it owns. Defaults to `0.0`.
        initializer: initializer or None. For every kernel and bias it owns;
            `None` keeps each layer's default. Defaults to `None`.
        seed: int or None. Seed of the dropout masks. Defaults to `None`.
        **kwargs: base layer keyword arguments, such as `name`.

    Call arguments:
        features: float tensor `(..., units)`.
        embedded: float tensor `(..., embedding_dim)`, the input embeddings
            (only with `dual=True`).
        training: bool. Dropout on, temperature off.

    Example:

    >>> import numpy as np
    >>> head = LanguageModelHead(30, units=8, tie_embeddings=False)
    >>> tuple(head(np.zeros((2, 5, 8), "float32")).shape)
    (2, 5, 30)

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2211.01848), Circling Back to
          Recurrent Models of Language (the Dual head, §3).
        - [Yang et al., 2018](https://arxiv.org/abs/1711.03953), Breaking the
          Softmax Bottleneck (the mixture of softmaxes).
    """

    def __init__(
        self,
        vocabulary_size,
        units,
        embedding_dim=None,
        embedding=None,
        tie_embeddings=True,
        output_dropout=0.0,
        dual=False,
        dual_units=None,
        dual_dropout=0.0,
        dual_embedding_dropout=None,
        dual_hidden_dropout=None,
        mixture_of_softmaxes=0,
        mixture_dropout=0.0,
        temperature=1.0,
        l2=0.0,
        initializer=None,
        seed=None,
        **kwargs,
    ):
        v = _validation
        vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
        units = v.positive_int("units", units)
        embedding_dim = v.optional_positive_int("embedding_dim", embedding_dim)
        output_dropout = v.rate("output_dropout", output_dropout)
        dual_dropout = v.rate("dual_dropout", dual_dropout)
        if dual_embedding_dropout is not None:
            dual_embedding_dropout = v.rate("dual_embedding_dropout", dual_embedding_dropout)
        if dual_hidden_dropout is not None:
            dual_hidden_dropout = v.rate("dual_hidden_dropout", dual_hidden_dropout)
        dual_units = v.optional_positive_int("dual_units", dual_units)
        mixture_of_softmaxes = check_components(mixture_of_softmaxes)
        mixture_dropout = v.rate("mixture_dropout", mixture_dropout)
        temperature = v.positive_float("temperature", temperature)
        l2 = v.non_negative_float("l2", l2)
        if embedding is not None and not isinstance(embedding, keras.layers.Embedding):
            raise ValueError(
                "Expected `embedding` to be a `keras.layers.Embedding` (the "
                "table of tied output embeddings) or None. Received: "
                f"embedding={embedding!r}"
            )
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.units = units
        self.embedding_dim = embedding_dim
        self.tie_embeddings = bool(tie_embeddings)
        self.output_dropout = output_dropout
        self.dual = bool(dual)
        self.dual_units = dual_units
        self.dual_dropout = dual_dropout
        self.dual_embedding_dropout = dual_embedding_dropout
        self.dual_hidden_dropout = dual_hidden_dropout
        self.mixture_of_softmaxes = mixture_of_softmaxes
        self.mixture_dropout = mixture_dropout
        self.temperature = temperature
        self.l2 = l2
        self.initializer = (
            None if initializer is None else keras.initializers.get(initializer)
        )
        self.seed = seed
        # Not tracked: the embedding belongs to the backbone.
        self._tied = _Reference(embedding)

        # === Layers === (created in this order: their seeds are drawn so)
        width = embedding_dim or units
        regularizer = keras.regularizers.L2(l2) if l2 > 0 else None
        dense_init = {} if self.initializer is None else {
            "kernel_initializer": self.initializer,
            "bias_initializer": self.initializer,
        }
        if self.dual:
            self.dual_layer = DualOutput(
                dual_units or (width if self.tie_embeddings else units),
                dropout=dual_dropout,
                output_dropout=output_dropout,
                embedding_dropout=dual_embedding_dropout,
                hidden_dropout=dual_hidden_dropout,
                kernel_regularizer=regularizer,
                bias_regularizer=regularizer,
                seed=seed,
                name="dual_output",
                **dense_init,
            )
            head_width = self.dual_layer.units
        else:
            self.dual_layer = None
            head_width = units
        self.output_dropout_layer = keras.layers.Dropout(
            output_dropout, seed=seed, name="output_dropout"
        )
        self.projection = (
            keras.layers.Dense(
                width, use_bias=False, kernel_regularizer=regularizer,
                name="projection", **dense_init,
            )
            if self.tie_embeddings and head_width != width and not mixture_of_softmaxes
            else None
        )
        # With a mixture, its projection W_p maps the head's output straight
        # to K contexts of the output layer's width (lamb: no downprojection).
        self.mixture = (
            MixtureOfSoftmaxes(
                mixture_of_softmaxes,
                width if self.tie_embeddings else head_width,
                kernel_regularizer=regularizer,
                bias_regularizer=regularizer,
                dropout=mixture_dropout,
                seed=None if seed is None else seed + 200,
                name="mixture_of_softmaxes",
                **dense_init,
            )
            if mixture_of_softmaxes
            else None
        )
        self.output_layer = (
            None
            if self.tie_embeddings
            else keras.layers.Dense(
                vocabulary_size,
                kernel_regularizer=regularizer,
                bias_regularizer=regularizer,
                name="output",
                **dense_init,
            )
        )

    @property
    def embedding(self):
        """The `Embedding` layer whose table the tied output layer reads."""
        return self._tied.value

    def tie_to(self, embedding):
        """Reads the output embeddings from `embedding`'s table (before build)."""
        if self.built:
            raise ValueError(
                "Expected an unbuilt head to tie to an embedding. Received: "
                f"the built head {self.name!r}"
            )
        self._tied = _Reference(embedding)

    # === Build ===

    def build(self, input_shape):
        self._build_layers(input_shape)

    def _build_layers(self, input_shape):
        # Builds in the caller's name scope: a `LanguageModel` builds its
        # head from its own `build`, so the weights keep the paths that
        # files saved before this class existed record.
        width = self.embedding_dim or self.units
        if self.tie_embeddings:
            if self.embedding is None:
                raise ValueError(
                    "Expected a tied head to be given the `embedding` layer "
                    "whose table it reads (`embedding=` or `tie_to`). "
                    "Received: embedding=None"
                )
            if self.embedding.output_dim != width:
                raise ValueError(
                    f"Expected an embedding of width `embedding_dim` = {width} "
                    "for the tied head. Received: an embedding of width "
                    f"{self.embedding.output_dim}"
                )
        head = self.units
        if self.dual_layer is not None:
            self.dual_layer.build([(None, None, width), (None, None, self.units)])
            head = self.dual_layer.units
        if self.projection is not None:
            self.projection.build((None, None, head))
            head = width
        self.softmax_width = head
        if self.mixture is not None:
            self.mixture.build((None, None, head))
            head = self.mixture.context_units
        if self.output_layer is not None:
            self.output_layer.build((None, None, head))
            self.output_bias = None
        else:
            self.output_bias = _variable(
                "output_bias", (self.vocabulary_size,), self.variable_dtype,
                self.initializer or "zeros", trainable=True,
                regularizer=keras.regularizers.L2(self.l2) if self.l2 > 0 else None,
            )
        self.temperature_variable = _variable(
            "temperature", (), self.variable_dtype,
            keras.initializers.Constant(self.temperature),
            trainable=False,
        )
        self.built = True

    # === Forward pass ===

    def call(self, features, embedded=None, training=False):
        return self.logits(self.softmax_features(features, embedded, training), training)

    def softmax_features(self, features, embedded=None, training=False):
        """The vectors the output layer reads, `(..., softmax_width)`."""
        if self.dual_layer is not None:
            if embedded is None:
                raise ValueError(
                    "Expected the input embeddings (`embedded=`) for the Dual "
                    "head. Received: embedded=None"
                )
            x = self.dual_layer([embedded, features], training=training)
        elif training is False:
            x = features  # the dropout layer's output at inference, without its call
        else:
            x = self.output_dropout_layer(features, training=training)
        if self.projection is not None:
            x = self.projection(x)
        return x

    def logits(self, features, training=False):
        """Logits (log-probabilities with a mixture) from `softmax_features`."""
        if self.mixture is not None:
            # log Σ_k π_k softmax(τ z_k): τ multiplies each component's logits.
            contexts, log_weights = self.mixture(features, training=training)
            return self.mixture.mix(self._output(contexts, training), log_weights)
        return self._output(features, training)

    def _output(self, features, training):
        bias = None
        if self.output_layer is not None:
            logits = self.output_layer(features)
        else:
            table = ops.cast(self.embedding.embeddings, features.dtype)
            logits = backend.tied_logits(features, table)
            bias = self.output_bias
        temperature = None if training else self.temperature_variable
        return backend.output_logits(logits, bias, temperature)

    def set_temperature(self, temperature):
        """Sets the softmax temperature τ used at inference."""
        temperature = _validation.positive_float("temperature", temperature)
        self.temperature = temperature
        if self.built:
            self.temperature_variable.assign(temperature)

    # === Chunked softmax ===

    def softmax_weights(self):
        """The output layer's `(kernel, bias)`: kernel `(width, vocabulary)`.

        With tied embeddings the kernel is the transposed embedding table.
        """
        if self.output_layer is not None:
            bias = self.output_layer.bias
            if bias is None:
                bias = ops.zeros((self.vocabulary_size,))
            return self.output_layer.kernel, bias
        return ops.transpose(self.embedding.embeddings), self.output_bias

    def target_log_probabilities(
        self, features, targets, chunk_size=None, temperature=1.0, training=False
    ):
        """Log-probability of every target, from the softmax features.

        The logits `features @ kernel + bias` are computed `chunk_size`
        tokens at a time and never stored, in the forward or the backward
        pass (see `chunked_target_log_softmax`).

        Args:
            features: float tensor `(batch, [samples,] time, softmax_width)`.
            targets: int tensor `(batch, time)`. The target ids.
            chunk_size: int or None. Tokens per chunk; `None` is 1024.
            temperature: float, or a list / tuple of them. Softmax
                temperature τ: the logits are multiplied by it. With several,
                the result has a last axis of one entry per τ (the
                features, and a mixture's contexts, computed once). Defaults
                to `1.0`.
            training: bool. With a mixture of softmaxes, drop out its
                contexts, with the masks an unchunked training call draws.
                Defaults to `False`.

        Returns:
            A float32 tensor, `features.shape[:-1]` (plus one axis of
            temperatures for a sequence of them): `log p(target)`.
        """
        features = ops.convert_to_tensor(features)
        targets = ops.cast(targets, "int32")
        if len(features.shape) == len(targets.shape) + 2:
            targets = ops.broadcast_to(
                ops.expand_dims(targets, 1), ops.shape(features)[:-1]
            )
        elif len(features.shape) != len(targets.shape) + 1:
            raise ValueError(
                "Expected features of shape `(batch, [samples,] time, "
                "width)` for targets of shape `(batch, time)`. Received: "
                f"features.shape={tuple(features.shape)}, "
                f"targets.shape={tuple(targets.shape)}"
            )
        chunk_size = chunk_size or DEFAULT_CHUNK_SIZE
        several = isinstance(temperature, (list, tuple))
        temperatures = list(temperature) if several else [temperature]
        if self.mixture is not None:
            # The contexts (and their dropout masks) once, for every τ.
            contexts, log_weights = self._mixture_of_features(features, training)
        results = []
        for tau in temperatures:
            kernel, bias = self.softmax_weights()
            if tau != 1.0:
                # logits × τ = features @ (τ·kernel) + τ·bias
                kernel = ops.cast(kernel, "float32") * tau
                bias = ops.cast(bias, "float32") * tau
            if self.mixture is None:
                results.append(
                    chunked_target_log_softmax(features, kernel, bias, targets, chunk_size)
                )
                continue
            # One chunked target log-softmax per component (never a full
            # (tokens, vocab) block), then logsumexp_k(log π_k + log p_k).
            per_component = [
                chunked_target_log_softmax(
                    contexts[..., k, :], kernel, bias, targets, chunk_size
                )
                for k in range(self.mixture_of_softmaxes)
            ]
            results.append(
                ops.logsumexp(
                    ops.stack(per_component, axis=-1)
                    + ops.cast(log_weights, "float32"),
                    axis=-1,
                )
            )
        return ops.stack(results, axis=-1) if several else results[0]

    def _mixture_of_features(self, features, training):
        if not (training and len(features.shape) == 4):
            return self.mixture(features, training=training)
        # (B, D, T, W) → the copy-major rows (D·B, T, W) that a multi-sample
        # training call feeds the mixture, so that its dropout masks match.
        shape = ops.shape(features)
        rows = ops.reshape(
            ops.transpose(features, (1, 0, 2, 3)), (-1, shape[2], shape[3])
        )
        contexts, log_weights = self.mixture(rows, training=training)
        contexts = ops.reshape(
            contexts, (shape[1], shape[0]) + tuple(ops.shape(contexts)[1:])
        )
        log_weights = ops.reshape(
            log_weights, (shape[1], shape[0]) + tuple(ops.shape(log_weights)[1:])
        )
        return (
            ops.transpose(contexts, (1, 0, 2, 3, 4)),
            ops.transpose(log_weights, (1, 0, 2, 3)),
        )

    # === Config ===

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "units": self.units,
                "embedding_dim": self.embedding_dim,
                "tie_embeddings": self.tie_embeddings,
                "output_dropout": self.output_dropout,
                "dual": self.dual,
                "dual_units": self.dual_units,
                "dual_dropout": self.dual_dropout,
                "dual_embedding_dropout": self.dual_embedding_dropout,
                "dual_hidden_dropout": self.dual_hidden_dropout,
                "mixture_of_softmaxes": self.mixture_of_softmaxes,
                "mixture_dropout": self.mixture_dropout,
                "temperature": self.temperature,
                "l2": self.l2,
                "initializer": (
                    None
                    if self.initializer is None
                    else keras.initializers.serialize(self.initializer)
                ),
                "seed": self.seed,
            }
        )
        return config


class _Reference:
    """Holds a layer without Keras tracking (or saving) it here."""

    def __init__(self, value):
        self.value = value


def _variable(name, shape, dtype, initializer, trainable, regularizer=None):
    """A variable in the current name scope, not the layer's own.

    (`add_weight` would put it under the layer's name; built from a
    `LanguageModel`, these must keep the model-level paths of saved files.)
    """
    variable = keras.Variable(
        initializer=keras.initializers.get(initializer),
        shape=shape,
        dtype=dtype,
        trainable=trainable,
        name=name,
    )
    variable.regularizer = regularizer
    return variable
