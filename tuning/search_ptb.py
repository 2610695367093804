"""Search the papers' hyperparameter space for a language model on Penn Treebank.

Each trial trains a `LanguageModel` (the hyperparameters of the Mogrifier
paper's Table 4, Circling Back §7 and the Dual paper's Table 1, see
`keras_mogrifier.tuning.LANGUAGE_MODEL_SEARCH_SPACE`) and scores validation
perplexity; the script prints a table of the trials and the best
configuration. Run it again with the same `--directory` to resume: finished
trials are kept, only the remaining ones run (`--overwrite` starts afresh).

    python tuning/search_ptb.py --max-trials 2 --epochs 1 --max-tokens 20000
    python tuning/search_ptb.py --data-dir ../shared/data/ptb --tuner bayesian \\
        --max-trials 50 --epochs 10 --units 650

Without `--data-dir` the package's embedded corpus is used (offline; its
perplexities are not comparable with PTB results). The logic lives in
`keras_mogrifier.tuning`; this script only reads flags.
"""

import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_mogrifier.data import load_ptb  # noqa: E402
from keras_mogrifier.tuning import SearchFailedError  # noqa: E402
from keras_mogrifier.tuning import best_configuration  # noqa: E402
from keras_mogrifier.tuning import search_summary  # noqa: E402
from keras_mogrifier.tuning.searches import LANGUAGE_MODEL_ADVICE  # noqa: E402
from keras_mogrifier.tuning import run_language_model_search  # noqa: E402
from keras_mogrifier.tuning import trials_table  # noqa: E402
from keras_mogrifier.tuning.tuners import TUNERS  # noqa: E402


def _list(kind):
    def parse(text):
        return [kind(item) for item in text.split(",") if item]

    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data-dir", help="directory of ptb.{train,valid,test}.txt[.gz]")
    parser.add_argument("--download", action="store_true",
                        help="without --data-dir, try downloading PTB first")
    parser.add_argument("--tuner", choices=TUNERS, default="random")
    parser.add_argument("--max-trials", type=int, default=4,
                        help="trials (random and bayesian; hyperband sizes itself)")
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs per trial (hyperband: the most per trial)")
    parser.add_argument("--max-tokens", type=int, help="training tokens per epoch")
    parser.add_argument("--max-validation-tokens", type=int,
                        help="validation tokens scored per epoch")
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--bptt", type=int, default=35, help="window length T")
    parser.add_argument("--samples", type=int, default=1, help="dropout samples D")
    parser.add_argument("--cells", type=_list(str),
                        help="comma-separated cells to search (default: the space's)")
    parser.add_argument("--dual-units", type=_list(int),
                        help="comma-separated Dual widths (default: the Dual paper's "
                        "400,850 scaled by units/850)")
    parser.add_argument("--no-jit-compile", action="store_true",
                        help="no XLA (faster to start on CPU for small models)")
    parser.add_argument("--directory", default="tuning_runs")
    parser.add_argument("--project-name", default="ptb_language_model")
    parser.add_argument("--overwrite", action="store_true", help="start afresh")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-json", help="write the best configuration here")
    parser.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    corpus = load_ptb(args.data_dir, download=args.download)
    print(f"corpus: {corpus.source}, {len(corpus.train):,} training tokens, "
          f"vocabulary {len(corpus.vocabulary):,}")
    fixed = {"units": args.units, "num_layers": args.layers, "samples": args.samples}
    if args.no_jit_compile:
        fixed["jit_compile"] = False
    dual_units = args.dual_units or sorted(
        {max(1, round(args.units * 400 / 850)), args.units}
    )
    ranges = {"dual_units": dual_units}
    if args.cells:
        ranges["cell"] = args.cells
    try:
        tuner = run_language_model_search(
            corpus,
            tuner=args.tuner,
            max_trials=args.max_trials,
            epochs=args.epochs,
            max_tokens=args.max_tokens,
            max_validation_tokens=args.max_validation_tokens,
            batch_size=args.batch_size,
            sequence_length=args.bptt,
            fixed=fixed,
            ranges=ranges,
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
    print(search_summary(tuner, LANGUAGE_MODEL_ADVICE))
    best = best_configuration(tuner)
    print(f"\nbest: trial {best['trial_id']}, val_perplexity {best['score']:.2f}")
    print(json.dumps(best["configuration"], indent=2, default=str))
    if args.results_json:
        with open(args.results_json, "w") as f:
            json.dump(best, f, indent=2, default=str)
    return best


if __name__ == "__main__":
    main()
