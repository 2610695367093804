"""Losses for language models."""

from keras_mogrifier.losses.iwae_dropout_loss import IWAEDropoutLoss
from keras_mogrifier.losses.token_nll import token_nll

__all__ = ["IWAEDropoutLoss", "token_nll"]
