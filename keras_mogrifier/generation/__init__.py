"""Generating and scoring text with a stateful `LanguageModel`.

`generate` continues prompts one compiled step per token through the
model's carried recurrent state; `score` gives the log-probabilities that
`evaluate` would; `Decoder` is the compiled step they share. Adaptive
generation: `DynamicEvaluator.adapt_to(document)` hands the model back
adapted to a document.
"""

from keras_mogrifier.generation.decoder import Decoder
from keras_mogrifier.generation.generate import generate
from keras_mogrifier.generation.score import score
from keras_mogrifier.generation.text import decode
from keras_mogrifier.generation.text import encode

__all__ = ["Decoder", "decode", "encode", "generate", "score"]
