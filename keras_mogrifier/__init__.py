"""keras_mogrifier: strong recurrent language models for Keras 3."""

__version__ = "0.1.0"
