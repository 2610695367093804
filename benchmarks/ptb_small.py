"""The classic small PTB configuration with each cell, same budget.

Trains the `small` preset (Zaremba et al. 2014: 2 × 200, untied, plain
stacking, no dropout, batch 20, BPTT 20, uniform ±0.1, SGD at 1 halved every
epoch after the 4th, clip 5, 13 epochs; published test perplexity 114.5) with
the plain LSTM, then the same budget and settings with the Mogrifier LSTM and
the RLSTM in its place. Prints a table of validation/test perplexity and
training tokens/s, and writes it as JSON (updated after every cell, so a long
run can be read while it goes on).

    python benchmarks/ptb_small.py --data-dir ../shared/data/ptb \\
        --json benchmarks/results/ptb_small.json

On 2 CPU cores this takes hours: run it in the background.
"""

import os
import time

import _harness

_harness.environment()

from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.pipeline import run_experiment  # noqa: E402

CELLS = {
    "lstm": {"cell": "lstm"},
    "mogrifier_lstm": {"cell": "mogrifier_lstm", "mogrifier_rounds": 5},
    "rlstm": {"cell": "rlstm"},
}


def main():
    parser = _harness.argument_parser(__doc__, data_dir="required")
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--epochs", type=int, default=13)
    parser.add_argument("--max-tokens", type=int, help="cap tokens per epoch")
    parser.add_argument("--save-dir", help="save each trained model here as CELL.keras")
    parser.add_argument(
        "--halve-after", type=int,
        help="first epoch index (0-based) at the halved rate; default the preset's "
        "(Zaremba's max_epoch=4: epochs 1-5 at the base rate)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        help="save the model after every epoch (CELL/last.keras) so a cut-off run keeps it",
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="continue each cell from its checkpoint in --checkpoint-dir (where one exists)",
    )
    args = parser.parse_args()
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    corpus = load_corpus(args.data_dir)
    rows = []
    for name in args.cells:
        start = time.time()
        results = run_experiment(
            corpus,
            "small",
            model_overrides=CELLS[name],
            training_overrides={
                "epochs": args.epochs,
                "max_tokens": args.max_tokens,
                **({"halve_after_epoch": args.halve_after} if args.halve_after else {}),
            },
            checkpoint_dir=(
                os.path.join(args.checkpoint_dir, name) if args.checkpoint_dir else None
            ),
            resume=bool(args.resume) and os.path.exists(
                os.path.join(args.checkpoint_dir, name, "progress.json")
            ),
            dynamic=False,
            verbose=2,
        )
        if args.save_dir:
            os.makedirs(args.save_dir, exist_ok=True)
            results["model_object"].save(os.path.join(args.save_dir, f"{name}.keras"))
        rows.append(
            {
                "cell": name,
                "epochs": args.epochs,
                "parameters": int(results["model_object"].count_params()),
                "valid_perplexity": results["valid_perplexity"],
                "test_perplexity": results["test_perplexity"],
                "temperature": results["temperature"],
                # Like for like with Zaremba (main.lua run_valid / run_test):
                # τ = 1; validation on 20 streams, test on one stream.
                "valid_perplexity_tau1": results["valid_perplexity_tau1"],
                "valid_perplexity_tau1_one_stream": results[
                    "valid_perplexity_tau1_one_stream"
                ],
                "test_perplexity_tau1_one_stream": results[
                    "test_perplexity_tau1_one_stream"
                ],
                "valid_curve": results["valid_perplexity_curve"],
                "train_tokens_per_second": results["train_tokens_per_second"],
                "wall_seconds": time.time() - start,
            }
        )
        print_table(rows)
        if args.json:
            command = "python benchmarks/ptb_small.py " + " ".join(
                f"--{k.replace('_', '-')} {' '.join(v) if k == 'cells' else v}"
                for k, v in vars(args).items() if v is not None)
            _harness.write_json(args.json, {"command": command, "rows": rows})


def print_table(rows):
    print(
        "| cell | epochs | τ | valid ppl (τ) | test ppl (τ) | valid ppl (τ = 1) "
        "| test ppl (τ = 1, one stream) | train tokens/s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['cell']} | {r['epochs']} | {r['temperature']:.2f} | "
            f"{r['valid_perplexity']:.2f} | {r['test_perplexity']:.2f} | "
            f"{r['valid_perplexity_tau1']:.2f} | "
            f"{r['test_perplexity_tau1_one_stream']:.2f} | "
            f"{r['train_tokens_per_second']:.0f} |"
        )


if __name__ == "__main__":
    main()
