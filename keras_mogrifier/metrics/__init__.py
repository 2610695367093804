"""Keras metrics for language models."""

from keras_mogrifier.metrics.bits_per_character import BitsPerCharacter
from keras_mogrifier.metrics.perplexity import Perplexity

__all__ = ["BitsPerCharacter", "Perplexity"]
