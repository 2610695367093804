"""Quality check of multi-sample dropout: D = 4 against D = 1 on Penn Treebank.

Trains the same small model (preset `tiny`: a 2 × 128 Mogrifier LSTM with
dropout, batch 32, BPTT 35, Adam) twice for the same number of epochs and the
same training tokens per epoch (`--max-tokens`), once with the ordinary loss
(D = 1) and once with `IWAEDropoutLoss` over D = 4 dropout samples per
sequence, and reports the validation perplexity after every epoch and at the
end (after the softmax temperature search), and the test perplexity. No
dynamic evaluation. The JSON is rewritten after each run, so a long run can
be read while it goes on.

    python benchmarks/multisample_quality.py --data-dir ../shared/data/ptb \\
        --epochs 4 --max-tokens 120000 --json benchmarks/results/multisample_quality.json

On 2 shared CPU cores each run takes several minutes per 100k tokens and
epoch (the D = 4 run about four times the D = 1 run): run it in the
background.
"""

import argparse
import time

import _harness

_harness.environment()

import keras  # noqa: E402

from keras_mogrifier.data import load_ptb  # noqa: E402
from keras_mogrifier.pipeline import run_experiment  # noqa: E402


def main(argv=None):
    parser = _harness.argument_parser(
        __doc__, data_dir="required", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=120_000,
                        help="training tokens per epoch")
    parser.add_argument("--softmax-chunk-size", type=int,
                        help="chunked softmax in training (same objective)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    corpus = load_ptb(args.data_dir, download=False, fallback=False)
    command = _harness.command_line(__file__, argv)
    rows = []
    for samples in args.samples:
        keras.utils.set_random_seed(args.seed)
        start = time.time()
        model = {"samples": samples, "seed": args.seed}
        if args.softmax_chunk_size:
            model["softmax_chunk_size"] = args.softmax_chunk_size
        results = run_experiment(
            corpus,
            args.preset,
            model_overrides=model,
            training_overrides={"epochs": args.epochs, "max_tokens": args.max_tokens},
            dynamic=False,
            verbose=2,
        )
        rows.append(
            {
                "samples": samples,
                "epochs": args.epochs,
                "train_tokens_per_epoch": results["train_tokens_per_epoch"],
                "valid_curve": results["valid_perplexity_curve"],
                "temperature": results["temperature"],
                "valid_perplexity": results["valid_perplexity"],
                "test_perplexity": results["test_perplexity"],
                "train_seconds": results["train_seconds"],
                "wall_seconds": time.time() - start,
            }
        )
        print_table(rows)
        if args.json:
            _harness.write_json(args.json, {"command": command, "preset": args.preset,
                                            "corpus": corpus.source, "rows": rows})
    return rows


def print_table(rows):
    print("\n| D | epochs | tokens/epoch | valid ppl per epoch (τ = 1) "
          "| τ | valid ppl | test ppl | train time (s) |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        curve = ", ".join(f"{p:.1f}" for p in r["valid_curve"])
        print(f"| {r['samples']} | {r['epochs']} | {r['train_tokens_per_epoch']:,} "
              f"| {curve} | {r['temperature']:.2f} | {r['valid_perplexity']:.2f} "
              f"| {r['test_perplexity']:.2f} | {r['train_seconds']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
