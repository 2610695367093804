"""Tune dynamic evaluation of a trained language model, then apply it to test.

Each trial is one dynamic-evaluation pass over a slice of the validation
split with a setting (learning rate, decay rate, epsilon, segment length)
from the ranges of the Mogrifier paper's Table 6, less the corner where
learning_rate / epsilon > 10 and passes diverge (see
`keras_mogrifier.tuning.DynamicEvaluationTuner`); the first trial is Krause
et al.'s setting, so the search ends with a result. A trial that diverges is
logged in one line and counted in the summary. No training happens in the
loop, and gradient statistics are gathered once per segment length. The
script prints the trials, the best setting, and static vs dynamic perplexity
on the test split. The same `--directory` resumes a search.

    python tuning/search_dyneval.py --model model.keras --max-trials 20
    python tuning/search_dyneval.py --max-trials 2 --epochs 1   # trains a small model

Without `--model` a small model (the pipeline's `tiny` preset) is trained
first and saved in the search's directory (reused when resuming). Without
`--data-dir` the package's embedded corpus is used (offline).
"""

import argparse
import json
import math
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import keras_mogrifier  # noqa: E402,F401  (registers the classes for loading)
from keras_mogrifier.data import load_ptb  # noqa: E402
from keras_mogrifier.tuning import SearchFailedError  # noqa: E402
from keras_mogrifier.tuning import best_configuration  # noqa: E402
from keras_mogrifier.tuning import search_summary  # noqa: E402
from keras_mogrifier.tuning.dynamic_evaluation_tuner import ADVICE  # noqa: E402
from keras_mogrifier.tuning.dynamic_evaluation_tuner import FAILED_AS  # noqa: E402
from keras_mogrifier.tuning import run_dynamic_evaluation_search  # noqa: E402
from keras_mogrifier.tuning import trial_rows  # noqa: E402
from keras_mogrifier.tuning import trials_table  # noqa: E402
from keras_mogrifier.tuning.searches import load_or_train_model  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data-dir", help="directory of ptb.{train,valid,test}.txt[.gz]")
    parser.add_argument("--download", action="store_true",
                        help="without --data-dir, try downloading PTB first")
    parser.add_argument("--model", help="a saved .keras LanguageModel to tune")
    parser.add_argument("--tuner", choices=("random", "bayesian"), default="random")
    parser.add_argument("--max-trials", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=2000,
                        help="validation tokens scored by each trial")
    parser.add_argument("--test-tokens", type=int,
                        help="test tokens of the final evaluation (default: all)")
    parser.add_argument("--statistics-tokens", type=int,
                        help="training tokens of the gradient statistics (default: all)")
    parser.add_argument("--statistics-batch-size", type=int, default=100)
    parser.add_argument("--segment-length", type=int,
                        help="fix the segment length instead of searching 1..--max-segment-length")
    parser.add_argument("--max-segment-length", type=int, default=20,
                        help="top of the segment-length range (Table 6: 20 word, 50 char)")
    parser.add_argument("--loss-reduction", choices=("mean", "sum"), default="mean",
                        help="units of the searched values: mean (the library's) or "
                             "sum (the Mogrifier paper's Table 6: epsilon is divided "
                             "by the segment length)")
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs of the small model trained without --model")
    parser.add_argument("--train-tokens", type=int,
                        help="training tokens per epoch of that small model")
    parser.add_argument("--directory", default="tuning_runs")
    parser.add_argument("--project-name", default="ptb_dynamic_evaluation")
    parser.add_argument("--overwrite", action="store_true", help="start afresh")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-json", help="write the results here")
    parser.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    corpus = load_ptb(args.data_dir, download=args.download)
    print(f"corpus: {corpus.source}, {len(corpus.train):,} training tokens, "
          f"vocabulary {len(corpus.vocabulary):,}")
    if args.model:
        model = keras.saving.load_model(args.model)
    else:
        path = os.path.join(args.directory, f"{args.project_name}_model.keras")
        if args.overwrite and os.path.exists(path):
            os.remove(path)
        model = load_or_train_model(
            corpus, path, epochs=args.epochs, max_tokens=args.train_tokens
        )
    fixed, ranges = {}, {}
    if args.segment_length:
        fixed["segment_length"] = args.segment_length
    else:
        ranges["segment_length"] = (1, args.max_segment_length)
    try:
        tuner, results = run_dynamic_evaluation_search(
            model,
            corpus,
            tuner=args.tuner,
            max_trials=args.max_trials,
            max_tokens=args.max_tokens,
            test_tokens=args.test_tokens,
            statistics_tokens=args.statistics_tokens,
            statistics_batch_size=args.statistics_batch_size,
            ranges=ranges,
            fixed=fixed,
            loss_reduction=args.loss_reduction,
            directory=args.directory,
            project_name=args.project_name,
            overwrite=args.overwrite,
            seed=args.seed,
            verbose=args.verbose,
        )
    except SearchFailedError as error:
        print(f"\nsearch failed: {error.summary}")
        raise SystemExit(1) from None
    print("\ntrials:")
    print(trials_table(tuner))
    print(search_summary(tuner, ADVICE, FAILED_AS))
    best = best_configuration(tuner)
    print(f"\nbest: trial {best['trial_id']}, val_dynamic_loss {best['score']:.4f}")
    print("searched values:", json.dumps(best["values"]))
    print("evaluator settings:", json.dumps(best["configuration"]))
    valid, static, dynamic = (
        results["valid_static"], results["test_static"], results["test_dynamic"]
    )
    print(f"validation slice ({valid['num_tokens']} tokens): static perplexity "
          f"{valid['perplexity']:.2f}, best dynamic "
          f"{math.exp(best['score']):.2f}")
    print(f"test ({dynamic['num_tokens']} tokens): static perplexity "
          f"{static['perplexity']:.2f}, dynamic {dynamic['perplexity']:.2f}")
    if args.results_json:
        with open(args.results_json, "w") as f:
            json.dump({"command": "python " + " ".join(sys.argv),
                       "backend": keras.backend.backend(),
                       "best": best, **results,
                       # Every trial, the failed ones with their error.
                       "trials": trial_rows(tuner)}, f, indent=2, default=str)
    return best, results


if __name__ == "__main__":
    main()
