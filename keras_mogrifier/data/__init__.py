"""Corpora, vocabularies and stateful batching for language models."""

from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.data.batching import batchify
from keras_mogrifier.data.corpus import Corpus
from keras_mogrifier.data.corpus import load_corpus
from keras_mogrifier.data.corpus import read_lines
from keras_mogrifier.data.corpus import tokenize_line
from keras_mogrifier.data.ptb import load_ptb
from keras_mogrifier.data.reverse_copy import reverse_copy
from keras_mogrifier.data.synthetic import synthetic_corpus
from keras_mogrifier.data.synthetic import synthetic_lines
from keras_mogrifier.data.vocabulary import Vocabulary
from keras_mogrifier.data.wikitext2 import load_wikitext2

__all__ = [
    "Corpus",
    "StreamDataset",
    "Vocabulary",
    "batchify",
    "load_corpus",
    "load_ptb",
    "load_wikitext2",
    "read_lines",
    "reverse_copy",
    "synthetic_corpus",
    "synthetic_lines",
    "tokenize_line",
]
