"""Train and evaluate a word-level language model on Penn Treebank.

The library's main job in one command: trains a `LanguageModel` with
stateful truncated BPTT, prints per-epoch validation perplexity, tunes the
softmax temperature, and reports static and dynamic validation and test
perplexity.

    python examples/ptb_word.py                              # tiny preset
    python examples/ptb_word.py --data-dir ../shared/data/ptb --preset small
    python examples/ptb_word.py --preset paper --data-dir DIR   # GPU scale

Without `--data-dir` the standard PTB files are downloaded into Keras's cache;
when that is impossible (offline) the package's embedded synthetic corpus is
used instead, and the script says so. All the logic lives in
`keras_mogrifier.pipeline`; this script only reads flags.
"""

import argparse
import os
import sys

import _quiet  # noqa: F401  (first: a quiet TensorFlow start)

from keras_mogrifier.data import load_ptb  # noqa: E402
from keras_mogrifier.models.language_model import CELLS  # noqa: E402
from keras_mogrifier.pipeline import PRESETS  # noqa: E402
from keras_mogrifier.pipeline import generation_sample  # noqa: E402
from keras_mogrifier.pipeline import run_experiment  # noqa: E402
from keras_mogrifier.pipeline import save_language_model  # noqa: E402
from keras_mogrifier.pipeline import write_results  # noqa: E402


def parse_args(argv=None, level="word", default_preset="tiny"):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data-dir", help="directory of ptb.{train,valid,test}.txt[.gz]")
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
    parser.add_argument("--segment-length", type=int, default=5 if level == "word" else 20,
                        help="dynamic evaluation segment length")
    parser.add_argument("--dynamic-tuning-tokens", type=int, default=10_000,
                        help="validation tokens used to tune dynamic evaluation")
    parser.add_argument("--dynamic-statistics-batches", type=int,
                        help="cap the training batches of gradient statistics")
    parser.add_argument("--dynamic-learning-rates", type=float, nargs="+",
                        default=[1e-5, 3e-5, 1e-4, 3e-4, 1e-3],
                        help="candidate dynamic-evaluation learning rates η")
    parser.add_argument("--dynamic-decay-rates", type=float, nargs="+",
                        default=[1e-3, 2e-3, 1e-2],
                        help="candidate dynamic-evaluation decay rates λ")
    parser.add_argument("--checkpoint-dir", help="save the model after every epoch here")
    parser.add_argument("--resume", action="store_true",
                        help="continue training from --checkpoint-dir")
    parser.add_argument("--results-json", help="write the results to this JSON file")
    parser.add_argument("--save-model",
                        help="save the trained model (with its vocabulary) to this .keras file")
    parser.add_argument("--verbose", default="auto", choices=("auto", "0", "1", "2"),
                        help="1: progress bars; 2: one line per epoch and phase (for "
                             "logs); auto: 1 on a terminal, 2 otherwise")
    parser.add_argument("--plot", metavar="PNG",
                        help="draw the learning curves and static vs dynamic loss "
                             "along the test text to this file (needs matplotlib)")
    return parser.parse_args(argv)


def overrides(args):
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


def main(argv=None, level="word", default_preset="tiny"):
    args = parse_args(argv, level, default_preset)
    corpus = load_ptb(args.data_dir, level=level, download=not args.no_download)
    model_overrides, training_overrides = overrides(args)
    results = run_experiment(
        corpus,
        preset=args.preset,
        model_overrides=model_overrides,
        training_overrides=training_overrides,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        dynamic=not args.no_dynamic,
        dynamic_options={
            "segment_length": args.segment_length,
            "tuning_tokens": args.dynamic_tuning_tokens,
            "statistics_batches": args.dynamic_statistics_batches,
            "learning_rates": args.dynamic_learning_rates,
            "decay_rates": args.dynamic_decay_rates,
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
    print(f"\nsample: {generation_sample(model, corpus)}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
