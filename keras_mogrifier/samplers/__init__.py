"""Samplers for `LanguageModel.generate`, named as in `keras_hub.samplers`."""

from keras_mogrifier.samplers.beam_sampler import BeamSampler
from keras_mogrifier.samplers.greedy_sampler import GreedySampler
from keras_mogrifier.samplers.random_sampler import RandomSampler
from keras_mogrifier.samplers.sampler import Sampler
from keras_mogrifier.samplers.sampler import sample_from
from keras_mogrifier.samplers.top_k_sampler import TopKSampler
from keras_mogrifier.samplers.top_p_sampler import TopPSampler

_BY_NAME = {
    "beam": BeamSampler,
    "greedy": GreedySampler,
    "random": RandomSampler,
    "top_k": TopKSampler,
    "top_p": TopPSampler,
}


def get(identifier, **kwargs):
    """A sampler from a name (`"greedy"`, `"top_k"`, `"top_p"`, `"random"`, `"beam"`).

    Args:
        identifier: str or `Sampler`. A name, or a sampler (returned as it
            is; `kwargs` must then be empty).
        **kwargs: the sampler's arguments (`k`, `p`, `num_beams`,
            `temperature`); `None` values are left to the sampler's defaults.

    Returns:
        A `Sampler`.
    """
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    if isinstance(identifier, Sampler):
        if kwargs:
            raise ValueError(
                "Expected sampler settings (`k`, `p`, `num_beams`, `temperature`) only with "
                "a sampler name; a sampler object carries its own. Received: "
                f"sampler={identifier!r} and {kwargs}"
            )
        return identifier
    if not isinstance(identifier, str) or identifier not in _BY_NAME:
        raise ValueError(
            f"Expected `sampler` to be one of {sorted(_BY_NAME)} or a "
            f"`keras_mogrifier.samplers.Sampler`. Received: sampler={identifier!r}"
        )
    cls = _BY_NAME[identifier]
    accepted = {"temperature"} | {
        "top_k": {"k"}, "top_p": {"p", "k"}, "beam": {"num_beams"}
    }.get(identifier, set())
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ValueError(
            f"Expected only {sorted(accepted)} for sampler={identifier!r}. "
            f"Received: {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}"
        )
    return cls(**kwargs)


__all__ = [
    "BeamSampler",
    "GreedySampler",
    "RandomSampler",
    "Sampler",
    "TopKSampler",
    "TopPSampler",
    "get",
    "sample_from",
]
