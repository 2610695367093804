"""The command line: `keras-mogrifier train`, or `python -m keras_mogrifier train`.

The library's main job in one command: trains a `LanguageModel` with
stateful truncated BPTT, prints per-epoch validation perplexity, tunes the
softmax temperature, reports static and dynamic test perplexity, and ends
with a sample: a prompt from the test text, continued by the model.

    keras-mogrifier train --no-download                      # tiny preset, embedded corpus
    keras-mogrifier train --text my_notes.txt --level byte   # your own text
    keras-mogrifier train --data-dir ../shared/data/ptb --preset small
    keras-mogrifier train --preset paper --data-dir DIR      # GPU scale

`--text` reads one file (split into train / valid / test runs of whole
lines), a directory of `{train,valid,test}.txt` (or the PTB or WikiText
names), at `--level` word, char or byte (`keras_mogrifier.data.load_text`).
Without `--data-dir` or `--text` the standard PTB files are downloaded into
Keras's cache; with `--no-download` (or offline) the package's embedded
synthetic corpus is used instead. All the logic lives in
`keras_mogrifier.pipeline`; this module only reads flags.
`examples/ptb_word.py` (and `scripts/main.sh`) run the same job from a
checkout.
"""

import argparse

import keras
import numpy as np

from keras_mogrifier._version import __version__
from keras_mogrifier.data import load_ptb
from keras_mogrifier.data import load_text
from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.models.language_model import CELLS
from keras_mogrifier.pipeline import PRESETS
from keras_mogrifier.pipeline import format_sample
from keras_mogrifier.pipeline import run_experiment
from keras_mogrifier.pipeline import save_language_model
from keras_mogrifier.pipeline import write_results
from keras_mogrifier.pipeline.language_modeling import DYNAMIC_DECAY_RATES
from keras_mogrifier.pipeline.language_modeling import DYNAMIC_EPSILON
from keras_mogrifier.pipeline.language_modeling import DYNAMIC_LEARNING_RATES

# The default vocabulary of --text at word level: Penn Treebank's 10k words.
DEFAULT_MAX_WORDS = 10_000

TRAIN_DESCRIPTION = "Train and evaluate a language model: on Penn Treebank, or on your own text."


def main(argv=None, prog=None):
    """Runs the command line (`keras-mogrifier COMMAND ...`); returns 0.

    Args:
        argv: list of str. The arguments after the program's name. Defaults
            to `sys.argv[1:]`.
        prog: str. The program's name in usage and errors. Defaults to the
            name it was started by (`keras-mogrifier`).
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description="keras_mogrifier's main job from the command line: "
                    "`train` trains and evaluates a language model (static and "
                    "dynamic evaluation) and ends with a sample of its text.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    train_parser = commands.add_parser(
        "train",
        help="train and evaluate a language model on Penn Treebank, your own "
             "text (--text FILE) or the embedded corpus (--no-download)",
        description=TRAIN_DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_train_arguments(train_parser)
    args = parser.parse_args(argv)
    train(args)
    return 0


def parse_args(argv=None, level="word", default_preset="tiny"):
    """The `train` command's flags, parsed (as `examples/ptb_word.py` reads them)."""
    parser = argparse.ArgumentParser(
        description=TRAIN_DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_train_arguments(parser, level, default_preset)
    return parser.parse_args(argv)


def add_train_arguments(parser, level="word", default_preset="tiny"):
    """Adds the `train` command's flags to an `argparse` parser.

    `level` and `default_preset` are the defaults of `--level` and `--preset`
    (`examples/ptb_char.py` sets `"char"`).
    """
    corpus = parser.add_mutually_exclusive_group()
    corpus.add_argument("--data-dir", help="directory of ptb.{train,valid,test}.txt[.gz]")
    corpus.add_argument("--text", metavar="PATH",
                        help="your own text: one file (cut into train/valid/test "
                             "runs of lines), or a directory of "
                             "{train,valid,test}.txt")
    parser.add_argument("--level", choices=("word", "char", "byte"), default=level,
                        help="tokens of --text (and of the PTB files): words, "
                             "characters or bytes")
    parser.add_argument("--min-count", type=int, default=1,
                        help="--text: words seen fewer times in training become <unk>")
    parser.add_argument("--max-size", type=int,
                        help="--text: keep at most this many tokens (the most frequent; "
                             "the rest read as <unk>); 0: every token. Default: "
                             f"{DEFAULT_MAX_WORDS:,} at word level (Penn Treebank's "
                             "size: the softmax in proportion to a small model), "
                             "no cap for characters and bytes")
    parser.add_argument("--encoding", default="utf-8", help="--text: the file's encoding")
    parser.add_argument("--no-download", action="store_true",
                        help="never try the network; without --data-dir use the embedded corpus")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=default_preset)
    parser.add_argument("--cell", choices=CELLS, help="override the preset's cell")
    parser.add_argument("--units", type=int, help="override the preset's units")
    parser.add_argument("--layers", type=int, help="override the number of layers")
    parser.add_argument("--samples", type=int, help="dropout samples D per sequence")
    parser.add_argument("--softmax-chunk-size", type=int,
                        help="compute the training loss this many tokens at a "
                             "time without materialising the logits (0: off)")
    parser.add_argument("--chrono-t-max", type=float, help="Chrono initialisation T_max")
    parser.add_argument("--dual", action="store_true", help="add the Dual head")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--bptt", type=int, help="window length T")
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--optimizer", choices=("sgd", "adam", "radam"))
    parser.add_argument("--max-tokens", type=int,
                        help="cap the training tokens per epoch (smoke runs)")
    parser.add_argument("--data-parallel", action="store_true",
                        help="train data-parallel over all visible devices "
                             "(TensorFlow: MirroredStrategy; JAX: "
                             "keras.distribution.DataParallel); see docs/scaling.md")
    parser.add_argument("--no-dynamic", action="store_true",
                        help="skip dynamic evaluation")
    parser.add_argument("--segment-length", type=int,
                        help="dynamic evaluation segment length (default: 10 "
                             "words, 20 characters or bytes)")
    parser.add_argument("--dynamic-tuning-tokens", type=int, default=2_000,
                        help="validation tokens used to tune dynamic evaluation")
    parser.add_argument("--dynamic-statistics-batches", type=int,
                        help="cap the training batches of gradient statistics")
    parser.add_argument("--dynamic-learning-rates", type=float, nargs="+",
                        default=list(DYNAMIC_LEARNING_RATES),
                        help="candidate dynamic-evaluation learning rates η")
    parser.add_argument("--dynamic-decay-rates", type=float, nargs="+",
                        default=list(DYNAMIC_DECAY_RATES),
                        help="candidate dynamic-evaluation decay rates λ (the "
                             "first is used while η is tuned)")
    parser.add_argument("--dynamic-epsilon", type=float, default=DYNAMIC_EPSILON,
                        help="ε of dynamic evaluation")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights' initialisation, dropout and "
                             "sampling (keras.utils.set_random_seed): the same run "
                             "twice gives the same figures on one machine and backend")
    parser.add_argument("--checkpoint-dir",
                        help="keep a training checkpoint here (every epoch's end, and "
                             "every --checkpoint-every steps); the model as last.keras")
    parser.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                        help="also checkpoint every STEPS training steps within an epoch")
    parser.add_argument("--resume", action="store_true",
                        help="continue training from --checkpoint-dir where it stopped "
                             "(any step): it ends as the uninterrupted run would")
    parser.add_argument("--results-json", help="write the results to this JSON file")
    parser.add_argument("--save-model",
                        help="save the trained model (with its vocabulary) to this .keras file")
    parser.add_argument("--verbose", default="auto", choices=("auto", "0", "1", "2"),
                        help="1: progress bars; 2: one line per epoch and phase (for "
                             "logs); auto: 1 on a terminal, 2 otherwise")
    parser.add_argument("--plot", metavar="PNG",
                        help="draw the learning curves and static vs dynamic loss "
                             "along the test text to this file (needs matplotlib)")


def overrides(args):
    """The preset's model and training settings that the flags override."""
    model = {
        "cell": args.cell,
        "units": args.units,
        "num_layers": args.layers,
        "samples": args.samples,
        "chrono_t_max": args.chrono_t_max,
        "dual": True if args.dual else None,
    }
    if args.units:
        model["embedding_dim"] = args.units
    training = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "eval_batch_size": args.batch_size,
        "sequence_length": args.bptt,
        "learning_rate": args.learning_rate,
        "optimizer": args.optimizer,
        "max_tokens": args.max_tokens,
        "data_parallel": True if args.data_parallel else None,
    }
    drop_none = lambda d: {k: v for k, v in d.items() if v is not None}  # noqa: E731
    model = drop_none(model)
    if args.softmax_chunk_size is not None:
        model["softmax_chunk_size"] = args.softmax_chunk_size or None
    return model, drop_none(training)


def load(args, max_words=None):
    """The corpus the flags name.

    `max_words` is the vocabulary cap of `--text` at word level when
    `--max-size` is not given; defaults to `DEFAULT_MAX_WORDS`.
    """
    if args.text:
        max_size = args.max_size
        if max_size is None and args.level == "word":
            max_size = DEFAULT_MAX_WORDS if max_words is None else max_words
        corpus = load_text(
            args.text, args.level, min_count=args.min_count,
            max_size=max_size or None, encoding=args.encoding,
        )
        if args.max_size is None and max_size:
            unk = corpus.vocabulary.unk_id
            unknown = 0.0 if unk is None else float(np.mean(corpus.train == unk))
            if unknown:
                print(
                    f"vocabulary: the {max_size:,} most frequent words of the "
                    f"training text ({100 * unknown:.1f}% of its tokens read as "
                    "<unk>); --max-size N to change it, --max-size 0 for every word",
                    flush=True,
                )
        return corpus
    if args.data_dir is None and args.no_download:
        return synthetic_corpus(level=args.level)
    return load_ptb(args.data_dir, level=args.level, download=not args.no_download)


def train(args):
    """Runs the `train` command on its parsed flags; returns the results.

    The results are `run_experiment`'s dict (the trained model as
    `"model_object"`).
    """
    keras.utils.set_random_seed(args.seed)
    corpus = load(args)
    model_overrides, training_overrides = overrides(args)
    segment_length = args.segment_length or (10 if corpus.level == "word" else 20)
    results = run_experiment(
        corpus,
        preset=args.preset,
        model_overrides=model_overrides,
        training_overrides=training_overrides,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        checkpoint_every_steps=args.checkpoint_every,
        dynamic=not args.no_dynamic,
        dynamic_options={
            "segment_length": segment_length,
            "tuning_tokens": args.dynamic_tuning_tokens,
            "statistics_batches": args.dynamic_statistics_batches,
            "learning_rates": args.dynamic_learning_rates,
            "decay_rates": args.dynamic_decay_rates,
            "epsilon": args.dynamic_epsilon,
        },
        verbose=args.verbose if args.verbose == "auto" else int(args.verbose),
        plot_path=args.plot,
    )
    if args.results_json:
        write_results(results, args.results_json)
        print(f"results written to {args.results_json}")
    model = results["model_object"]
    if args.save_model:
        save_language_model(model, args.save_model)
        print(f"model saved to {args.save_model}")
    print()
    print(format_sample(results["sample"]))
    return results

