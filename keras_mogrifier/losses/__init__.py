"""Losses for language models."""

from keras_mogrifier.losses.chunked_log_softmax import chunked_target_log_softmax
from keras_mogrifier.losses.iwae_dropout_loss import IWAEDropoutLoss
from keras_mogrifier.losses.token_nll import token_nll

__all__ = ["IWAEDropoutLoss", "chunked_target_log_softmax", "token_nll"]
