"""The error `LanguageModel.fit` raises when a training loss is not finite."""


class NonFiniteLossError(FloatingPointError):
    """Training stopped: the loss of a step was NaN or infinite.

    `LanguageModel.fit` (with `stop_on_non_finite=True`, the default, and no
    `DivergenceRecovery` among the callbacks) raises it after the step
    whose loss was not finite. That step's update was not applied and its
    change of the carried recurrent state was undone, so the model holds the
    weights, optimizer state and recurrent state of the last finite step (or
    those it had before `fit` when the first step was not finite).

    Attributes:
        epoch: int. The epoch of that step (0-based, as Keras counts).
        batch: int. Its batch index within the epoch.
        loss: float. The loss Keras logged after it (the epoch's running
            mean, non-finite from that step on).
    """

    def __init__(self, message, epoch=None, batch=None, loss=None):
        super().__init__(message)
        self.epoch = epoch
        self.batch = batch
        self.loss = loss
