"""The config of `LanguageModel`: `get_config`, `from_config`, `with_options`."""

import keras
from keras import ops

from keras_mogrifier.data.vocabulary import Vocabulary
from keras_mogrifier.models import _composition
from keras_mogrifier.models._saving import _local_path

# What `with_options` may change: none of these changes a trained weight.
WITH_OPTIONS = (
    "input_dropout", "cell_output_dropout", "state_dropout", "output_dropout",
    "dual_dropout", "dual_embedding_dropout", "dual_hidden_dropout",
    "mixture_dropout", "samples", "softmax_chunk_size", "temperature", "stateful",
    "batch_size", "l2", "drop_state_probability", "seed", "adaptation_units",
    "adaptation_streams", "adaptation_layer", "name",
)


class ConfigMixin:
    """The flat config (or the parts' configs) and copies with new options."""

    def get_config(self):
        config = super().get_config()
        if self._composed:
            # Made of given parts: their configs (a flat model keeps the
            # flat config every saved file has).
            config.update(
                {
                    "backbone": keras.saving.serialize_keras_object(self.backbone),
                    "head": keras.saving.serialize_keras_object(self.head),
                    "samples": self.samples,
                    "softmax_chunk_size": self.softmax_chunk_size,
                    "vocabulary": (
                        None if self.vocabulary is None else self.vocabulary.get_config()
                    ),
                }
            )
            return config
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "units": self.units,
                "num_layers": self.num_layers,
                "embedding_dim": self.embedding_dim,
                "cell": self.cell,
                "mogrifier_rounds": self.mogrifier_rounds,
                "mogrifier_rank": self.mogrifier_rank,
                "capped_input_gate": self.capped_input_gate,
                "chrono_t_max": self.chrono_t_max,
                "unit_forget_bias": self.unit_forget_bias,
                "residual": self.residual,
                "skip_connections": self.skip_connections,
                "chrono_input_bias": self.chrono_input_bias,
                "tie_embeddings": self.tie_embeddings,
                "input_dropout": self.input_dropout,
                "cell_output_dropout": self.cell_output_dropout,
                "state_dropout": self.state_dropout,
                "output_dropout": self.output_dropout,
                "dual": self.dual,
                "dual_units": self.dual_units,
                "dual_dropout": self.dual_dropout,
                "dual_embedding_dropout": self.dual_embedding_dropout,
                "dual_hidden_dropout": self.dual_hidden_dropout,
                "samples": self.samples,
                "softmax_chunk_size": self.softmax_chunk_size,
                "temperature": self.temperature,
                "stateful": self.stateful,
                "batch_size": self.batch_size,
                "l2": self.l2,
                "drop_state_probability": self.drop_state_probability,
                "initializer": (
                    None
                    if self.initializer is None
                    else keras.initializers.serialize(self.initializer)
                ),
                "adaptation_units": self.adaptation_units,
                "adaptation_streams": self.adaptation_streams,
                "adaptation_layer": self.adaptation_layer,
                "seed": self.seed,
                "vocabulary": (
                    None if self.vocabulary is None else self.vocabulary.get_config()
                ),
                "mixture_of_softmaxes": self.mixture_of_softmaxes,
                "mixture_dropout": self.mixture_dropout,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "backbone" in config:
            for part in ("backbone", "head"):
                config[part] = keras.saving.deserialize_keras_object(config[part])
            return cls(**config)
        if config.get("mixture_of_softmaxes") and "mixture_dropout" not in config:
            # Saved before the option: trained without it, and kept so.
            config["mixture_dropout"] = 0.0
        return cls(**config)

    @property
    def effective_mixture_dropout(self):
        """The dropout rate of the mixture's contexts (0 without a mixture)."""
        if not self.mixture_of_softmaxes:
            return 0.0
        if self.mixture_dropout is None:
            return self.cell_output_dropout
        return self.mixture_dropout

    def with_options(self, **overrides):
        """A new model of the same weights with some arguments changed.

        For instance `model.with_options(batch_size=1, samples=1)` for
        evaluation on one stream, or
        `model.with_options(adaptation_units=500)` for sparse dynamic
        evaluation (the adaptation matrix starts at zero). Weights are copied
        by name; the new model's recurrent state starts at zero.

        Only arguments that change no trained weight may be overridden:
        the dropout rates (the Dual head's and the mixture's included),
        `samples`, `softmax_chunk_size`, `temperature`, `stateful`,
        `batch_size`, `l2`, `drop_state_probability`, `seed`, the
        `adaptation_*` arguments and `name` (see `WITH_OPTIONS`). Others (`units`,
        `num_layers`, `vocabulary_size`, `embedding_dim`, `cell`,
        `mogrifier_rounds`, `mogrifier_rank`, `dual`, ...) would make a
        model of other weights: build a new `LanguageModel` for that.

        Raises:
            ValueError: for an argument not in `WITH_OPTIONS`.
        """
        refused = sorted(set(overrides) - set(WITH_OPTIONS))
        if refused:
            shown = ", ".join(f"{k}={overrides[k]!r}" for k in refused)
            raise ValueError(
                "Expected `with_options` to override only arguments that "
                f"keep every trained weight: {sorted(WITH_OPTIONS)}; build a "
                "new LanguageModel to change the architecture. Received: "
                f"{shown}"
            )
        config = self.get_config()
        for key in ("name", "trainable", "dtype"):
            config.pop(key, None)
        if self._composed:
            config = _composition.override_parts(config, overrides)
        else:
            config.update(overrides)
        clone = self.__class__.from_config(config)
        batch = clone.batch_size
        if batch is None and clone.stateful:
            capacity = getattr(self, "state_capacity", None)
            batch = capacity // self.samples if capacity else 1
        clone.build((batch, None))
        if self.built:
            source = {_local_path(v): v for v in self.weights}
            for variable in clone.weights:
                key = _local_path(variable)
                if key.startswith("state_") or key not in source:
                    continue
                if key == "temperature" and "temperature" in overrides:
                    continue  # the new value, set by the constructor
                if tuple(source[key].shape) == tuple(variable.shape):
                    # A copy: on JAX, two variables must not share a buffer.
                    variable.assign(ops.copy(source[key]))
        return clone


def as_vocabulary(vocabulary, vocabulary_size):
    """`vocabulary` (a Vocabulary, its config or a token list) as a Vocabulary."""
    if vocabulary is None or isinstance(vocabulary, Vocabulary):
        pass
    elif isinstance(vocabulary, dict):
        vocabulary = Vocabulary.from_config(vocabulary)
    elif isinstance(vocabulary, (list, tuple)):
        vocabulary = Vocabulary(vocabulary)
    else:
        raise ValueError(
            "Expected `vocabulary` to be a `keras_mogrifier.data.Vocabulary`, "
            f"a list of tokens or None. Received: {type(vocabulary).__name__}"
        )
    if vocabulary is not None and len(vocabulary) != vocabulary_size:
        raise ValueError(
            f"Expected a vocabulary of `vocabulary_size` = {vocabulary_size} "
            f"tokens. Received: a vocabulary of {len(vocabulary)} tokens"
        )
    return vocabulary
