"""Train and evaluate a language model: on Penn Treebank, or on your own text.

The library's main job, from a checkout: the package's `train` command
(`keras_mogrifier.cli`; installed, it is `keras-mogrifier train` or
`python -m keras_mogrifier train`), with the same flags. It trains a
`LanguageModel` with stateful truncated BPTT, prints per-epoch validation
perplexity, tunes the softmax temperature, reports static and dynamic test
perplexity, and ends with a sample: a prompt from the test text, continued
by the model.

    python examples/ptb_word.py                              # tiny preset
    python examples/ptb_word.py --data-dir ../shared/data/ptb --preset small
    python examples/ptb_word.py --text my_notes.txt --level byte   # your own text
    python examples/ptb_word.py --preset paper --data-dir DIR   # GPU scale

`--text` reads one file (split into train / valid / test runs of whole
lines), a directory of `{train,valid,test}.txt` (or the PTB or WikiText
names), at `--level` word, char or byte (`keras_mogrifier.data.load_text`).
Without `--data-dir` or `--text` the standard PTB files are downloaded into
Keras's cache; with `--no-download` (or offline) the package's embedded
synthetic corpus is used instead. All the logic lives in
`keras_mogrifier.pipeline`; `keras_mogrifier.cli` only reads flags.
"""

import sys

import _quiet  # noqa: F401  (first: a quiet TensorFlow start)

from keras_mogrifier import cli  # noqa: E402
from keras_mogrifier.cli import overrides  # noqa: E402,F401
from keras_mogrifier.cli import parse_args  # noqa: E402

# The default vocabulary of --text at word level (Penn Treebank's 10k words),
# as `load` below applies it: a test lowers it here.
DEFAULT_MAX_WORDS = cli.DEFAULT_MAX_WORDS


def load(args):
    """The corpus the flags name (`keras_mogrifier.cli.load`)."""
    return cli.load(args, max_words=DEFAULT_MAX_WORDS)


def main(argv=None, level="word", default_preset="tiny"):
    """Runs the job on these flags (no command name); returns its results."""
    return cli.train(parse_args(argv, level, default_preset))


if __name__ == "__main__":
    main(sys.argv[1:])
