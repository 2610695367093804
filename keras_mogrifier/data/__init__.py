"""Corpora, vocabularies and stateful batching for language models."""

from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.data.batching import batchify
from keras_mogrifier.data.corpus import Corpus
from keras_mogrifier.data.corpus import load_corpus
from keras_mogrifier.data.enwik8 import load_enwik8
from keras_mogrifier.data.load_text import load_text
from keras_mogrifier.data.ptb import load_ptb
from keras_mogrifier.data.reader import read_lines
from keras_mogrifier.data.reader import tokenize_line
from keras_mogrifier.data.reverse_copy import reverse_copy
from keras_mogrifier.data.synthetic import synthetic_corpus
from keras_mogrifier.data.synthetic import synthetic_lines
from keras_mogrifier.data.text8 import load_text8
from keras_mogrifier.data.vocabulary import Vocabulary
from keras_mogrifier.data.wikitext2 import load_wikitext2

__all__ = [
    "Corpus",
    "StreamDataset",
    "Vocabulary",
    "batchify",
    "load_corpus",
    "load_enwik8",
    "load_ptb",
    "load_text",
    "load_text8",
    "load_wikitext2",
    "read_lines",
    "reverse_copy",
    "synthetic_corpus",
    "synthetic_lines",
    "tokenize_line",
]
