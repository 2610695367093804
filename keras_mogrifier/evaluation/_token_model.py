"""Any Keras language model as the `ids -> logits` model dynamic evaluation runs.

`DynamicEvaluator` runs a model that maps token ids `(batch, time)` to logits
`(batch, time, vocabulary)`. Most Keras language models do, and run as they
are. A keras-hub `CausalLM` takes `{"token_ids", "padding_mask"}` instead,
and a bare keras-hub backbone returns hidden states: `token_model` wraps
either in `TokenLogits`, a model that calls it on unpadded ids (and, for a
backbone, projects the hidden states back through its token embedding, the
tied or separate output matrix of its `ReversibleEmbedding`). The wrapper
owns no variable: its variables are the wrapped model's own objects, so
what is adapted and restored is the user's model itself.

keras-hub is recognised by the classes' names and modules, without
importing it: it stays an optional extra.
"""

import numbers

import keras
from keras import ops


def _keras_hub_class(model, name):
    return any(
        cls.__name__ == name and cls.__module__.startswith("keras_hub")
        for cls in type(model).__mro__
    )


def is_causal_lm(model):
    """Whether `model` is a keras-hub `CausalLM` (GPT-2, OPT, Llama, ...)."""
    return _keras_hub_class(model, "CausalLM")


def is_backbone(model):
    """Whether `model` is a keras-hub `Backbone` with a token embedding."""
    return _keras_hub_class(model, "Backbone") and hasattr(model, "token_embedding")


class TokenLogits(keras.Model):
    """A keras-hub causal LM or backbone as an `ids -> logits` model.

    Args:
        wrapped: a keras-hub `CausalLM`, or a `Backbone` whose
            `token_embedding` is a `ReversibleEmbedding` (its `reverse=True`
            call gives the logits: the tied embedding or the separate
            output matrix).
    """

    def __init__(self, wrapped, **kwargs):
        super().__init__(name=f"token_logits_{wrapped.name}", **kwargs)
        self.wrapped = wrapped
        self.built = True

    @property
    def backbone(self):
        # Not an attribute: the backbone would be tracked twice.
        return self.wrapped if is_backbone(self.wrapped) else self.wrapped.backbone

    @property
    def vocabulary_size(self):
        return int(self.backbone.vocabulary_size)

    @property
    def max_sequence_length(self):
        return maximum_length(self.wrapped)

    def call(self, token_ids, training=False):
        inputs = {
            "token_ids": token_ids,
            "padding_mask": ops.ones_like(token_ids, dtype="int32"),
        }
        if self.wrapped is self.backbone:
            hidden = self.backbone(inputs, training=training)
            return self.backbone.token_embedding(hidden, reverse=True)
        return self.wrapped(inputs, training=training)

    def compute_output_spec(self, token_ids):
        return keras.KerasTensor(
            tuple(token_ids.shape) + (self.vocabulary_size,),
            dtype=self.backbone.token_embedding.compute_dtype,
        )


def token_model(model):
    """The `ids -> logits` model dynamic evaluation runs for `model`."""
    if is_causal_lm(model):
        if getattr(model, "backbone", None) is None or not hasattr(
            model.backbone, "token_embedding"
        ):
            raise ValueError(
                "Expected a keras-hub `CausalLM` with a `backbone` that has a "
                f"`token_embedding`. Received: {type(model).__name__} without one"
            )
        return TokenLogits(model)
    if is_backbone(model):
        embedding = model.token_embedding
        if "reverse" not in _call_arguments(embedding):
            raise ValueError(
                "Expected a keras-hub backbone whose `token_embedding` can "
                "project hidden states back to logits (a "
                "`ReversibleEmbedding`). Received: a "
                f"{type(embedding).__name__} in {type(model).__name__}"
            )
        return TokenLogits(model)
    return model


def _call_arguments(layer):
    import inspect

    try:
        return inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        return {}


def maximum_length(model):
    """The most tokens `model` reads at once, or `None` when it has no limit.

    A keras-hub model's backbone `max_sequence_length` (learned position
    embeddings: GPT-2, OPT); the model's own `max_sequence_length`
    otherwise. Rotary models (Llama) have none.
    """
    for owner in (model, getattr(model, "backbone", None)):
        length = getattr(owner, "max_sequence_length", None)
        if isinstance(length, numbers.Integral) and not isinstance(length, bool):
            return int(length)
    return None
