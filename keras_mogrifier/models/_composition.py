"""How `LanguageModel` joins a `RecurrentBackbone` and a `LanguageModelHead`."""

from keras_mogrifier.layers.language_model_head import LanguageModelHead
from keras_mogrifier.models.recurrent_backbone import RecurrentBackbone

# What the task reads from its head (the rest comes from the backbone).
HEAD_ATTRIBUTES = (
    "tie_embeddings", "output_dropout", "dual", "dual_units", "dual_dropout",
    "dual_embedding_dropout", "dual_hidden_dropout", "mixture_of_softmaxes",
    "temperature",
)
# The task's own arguments, beside `backbone=` and `head=`.
TASK_ARGUMENTS = ("samples", "softmax_chunk_size", "vocabulary", "backbone", "head")


class Parts:
    """The backbone and the head, held where Keras neither tracks nor saves
    them (their layers are tracked by the model itself)."""

    def __init__(self, backbone, head):
        self.backbone = backbone
        self.head = head


def check_parts(backbone, head, arguments, defaults):
    """Raises a `ValueError` unless `backbone` and `head` make one model.

    `arguments`: the `LanguageModel` constructor's arguments, `defaults`
    their defaults (`{name: default}`, from its signature: passed in, so that
    this module need not import the task); the architecture is the parts',
    so none of its flat arguments may be set.
    """
    if not isinstance(backbone, RecurrentBackbone) or not isinstance(
        head, LanguageModelHead
    ):
        raise ValueError(
            "Expected `backbone=` a `RecurrentBackbone` and `head=` a "
            "`LanguageModelHead`, both or neither. Received: "
            f"backbone={type(backbone).__name__}, head={type(head).__name__}"
        )
    changed = [
        f"{name}={arguments[name]!r}"
        for name, default in defaults.items()
        if name in arguments
        and name not in TASK_ARGUMENTS
        and name not in ("self", "kwargs", "vocabulary_size")
        and arguments[name] != default
    ]
    size = arguments.get("vocabulary_size")
    if size is not None and size != backbone.vocabulary_size:
        changed.insert(0, f"vocabulary_size={size!r}")
    if changed:
        raise ValueError(
            "Expected the architecture from `backbone=` and `head=` only "
            "(with them, a LanguageModel takes `samples`, "
            "`softmax_chunk_size` and `vocabulary`). Received: "
            + ", ".join(changed)
        )
    width = backbone.embedding.output_dim
    mismatches = []
    if head.vocabulary_size != backbone.vocabulary_size:
        mismatches.append(
            f"head vocabulary_size={head.vocabulary_size}, backbone "
            f"vocabulary_size={backbone.vocabulary_size}"
        )
    if head.units != backbone.units:
        mismatches.append(
            f"head units={head.units}, backbone units={backbone.units}"
        )
    if (head.embedding_dim or head.units) != width:
        mismatches.append(
            f"head embedding_dim={head.embedding_dim or head.units}, backbone "
            f"embedding width={width}"
        )
    if head.tie_embeddings and head.embedding not in (None, backbone.embedding):
        mismatches.append(
            "a tied head reading another embedding than the backbone's "
            f"({head.embedding.name!r})"
        )
    if mismatches:
        raise ValueError(
            "Expected a head that reads the backbone's features: the same "
            "vocabulary, `units` equal to the backbone's, its embedding "
            "width, and (tied) the backbone's embedding. Received: "
            + "; ".join(mismatches)
        )
    if head.tie_embeddings and head.embedding is None:
        head.tie_to(backbone.embedding)


def override_parts(config, overrides):
    """A composed model's config with `with_options` overrides applied.

    Each override goes to the part whose argument it is (`seed` and `l2` to
    both), the others (`samples`, `softmax_chunk_size`, `name`) to the task.
    """
    config = dict(config)
    parts = {}
    for part in ("backbone", "head"):
        parts[part] = dict(config[part])
        parts[part]["config"] = dict(parts[part]["config"])
    for key, value in overrides.items():
        placed = False
        for part in ("backbone", "head"):
            if key in parts[part]["config"] and key not in ("name", "trainable", "dtype"):
                parts[part]["config"][key] = value
                placed = True
        if not placed:
            config[key] = value
    config.update(parts)
    return config
