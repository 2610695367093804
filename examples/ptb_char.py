"""Train and evaluate a character-level language model on Penn Treebank.

The same pipeline as `ptb_word.py`, on characters (untied embeddings, bits
per character reported, dynamic-evaluation segments of 20 characters):

    python examples/ptb_char.py --data-dir ../shared/data/ptb --epochs 2

The word-level PTB files are read character by character (see
`keras_mogrifier.data.load_corpus(level="char")`).
"""

import sys

from ptb_word import main

if __name__ == "__main__":
    args = sys.argv[1:]
    # Characters need their own embedding and output: untie them.
    main(args, level="char", default_preset="tiny")
