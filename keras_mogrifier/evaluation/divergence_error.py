"""The error dynamic evaluation raises when its loss is not finite."""


class DivergenceError(FloatingPointError):
    """Dynamic evaluation diverged: a loss was not finite, or beyond any.

    `DynamicEvaluator.evaluate` (with `stop_on_divergence=True`, the default)
    raises it at the first segment with a token loss that is NaN, infinite
    or above 709.78 nats (the log of float64's largest number: a perplexity
    no float can hold, which only diverged weights produce), after the
    trained weights and the recurrent state have been restored; the
    attributes locate the divergence. `search_dynamic_evaluation` raises it
    when every setting it tried diverged (its message lists them; the
    attributes are those of the last one).

    Attributes:
        stream: int. The stream (row of `x`) that diverged.
        token: int. Position in that stream of the first token whose loss is
            not finite or too large (position 0 is context only, never
            scored).
        segment: int. Index of that token's segment within the stream.
        loss: float. That token's loss (NaN, inf or above 709.78).
        settings: dict. The evaluator's `learning_rate`, `decay_rate`,
            `epsilon`, `segment_length` and `normalizer`.
        tokens_scored: int. Predicted tokens scored before that segment.
    """

    def __init__(self, message, stream=None, token=None, segment=None,
                 loss=None, settings=None, tokens_scored=None):
        super().__init__(message)
        self.stream = stream
        self.token = token
        self.segment = segment
        self.loss = loss
        self.settings = dict(settings or {})
        self.tokens_scored = tokens_scored

    @classmethod
    def at(cls, stream, token, segment, loss, settings, tokens_scored):
        """The error of one pass that diverged at `token` of `stream`."""
        shown = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in settings.items()
        )
        return cls(
            f"Dynamic evaluation diverged at token {token} of stream {stream} "
            f"(segment {segment}, after {tokens_scored} scored tokens): loss "
            f"{loss} with {shown}. The trained weights and the recurrent "
            "state were restored. Try a smaller learning_rate or a larger "
            "epsilon.",
            stream=stream, token=token, segment=segment, loss=loss,
            settings=settings, tokens_scored=tokens_scored,
        )
