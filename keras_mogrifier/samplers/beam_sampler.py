"""Beam search."""

from keras_mogrifier import _validation
from keras_mogrifier._export import register
from keras_mogrifier.samplers.sampler import Sampler


@register
class BeamSampler(Sampler):
    """Beam search: the most probable continuation among `num_beams` kept.

    As `keras_hub.samplers.BeamSampler`: each prompt keeps the `num_beams`
    continuations of highest total log-probability (of the tempered
    distribution); at every step each is extended by every token and the
    best `num_beams` of the `num_beams × vocabulary` candidates are kept;
    the best one is returned. With recurrent decoding each beam is a row of
    the model's carried state, and the rows are reordered when beams are
    (`LanguageModel.generate` runs it; a prompt takes `num_beams` rows). A
    beam that has produced a stop token is finished: it keeps its score and
    is returned up to that token. Deterministic.

    Args:
        num_beams: int. Defaults to `5`.
        temperature: float. Defaults to `1.0`.
    """

    def __init__(self, num_beams=5, temperature=1.0):
        super().__init__(temperature=temperature)
        self.num_beams = _validation.positive_int("num_beams", num_beams)

    def get_next_token(self, probabilities, uniform):
        raise ValueError(
            "Expected `BeamSampler` to run through `LanguageModel.generate`, "
            "which keeps one carried state per beam. Received: a direct call"
        )

    def get_config(self):
        return {**super().get_config(), "num_beams": self.num_beams}
