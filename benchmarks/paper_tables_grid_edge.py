"""Dynamic evaluation of a finished study row with its grid widened at the edge (issue 28).

`benchmarks/paper_tables.py` tunes each seed's dynamic evaluation on a fixed
grid on the first 10,000 validation tokens: η 1e-5, 3e-5, 1e-4, 3e-4, 1e-3
at the evaluator's default λ 2e-3, then λ 1e-3, 2e-3, 1e-2 at the best η
(the study checkout's `search_dynamic_evaluation`; the study's log lists
the eight passes). Where the chosen values sit on the grid's
edge — the `mogrifier_rlstm+dual` row picked η 1e-5 and λ 1e-3, both the
smallest — the grid may have cut the search short. This re-runs the same
tuning (the package's `dynamic_evaluation`, with the study's statistics,
tuning slice, ε and segments) on the row's trained models, with the grid
extended downwards (η scanned at the first λ given, then the other λ at
the best η), and evaluates the test stream with the best setting: a check of
how much the edge costs, written to its own JSON (the study's JSON is the
running study's).

It needs the row's per-epoch checkpoints (`last.keras` under
`runs/paper_tables/checkpoints/<row>/seed<N>/`, written by the study on the
machine that trained the row; not in the repository).

    KERAS_BACKEND=jax python benchmarks/paper_tables_grid_edge.py \\
        --data-dir ../shared/data/ptb --row mogrifier_rlstm+dual
"""

import os
import time

import _harness

import keras  # noqa: E402

from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.pipeline.language_modeling import dynamic_evaluation  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STUDY = os.path.join(HERE, "results", "paper_tables", "ptb_word.json")
OUTPUT = os.path.join(HERE, "results", "paper_tables", "dynamic_grid_edge.json")
WORK = os.path.join(HERE, "..", "runs", "paper_tables", "checkpoints")


def main():
    parser = _harness.argument_parser(__doc__, data_dir="required", json_default=OUTPUT)
    parser.add_argument("--row", required=True)
    parser.add_argument("--checkpoints", default=WORK)
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[3e-6, 1e-5, 3e-5])
    # The first is the λ the learning rates are tried at (the study's 1e-3).
    parser.add_argument("--decay-rates", type=float, nargs="+", default=[1e-3, 3e-4, 1e-4])
    args = parser.parse_args()
    study = _harness.read_json(STUDY)
    rows = {row["name"]: row for row in study["rows"]}
    if args.row not in rows or not rows[args.row]["complete"]:
        raise ValueError(f"Expected a complete row of {STUDY}. Received: --row {args.row!r}")
    row = rows[args.row]
    settings = study["settings"]["dynamic_evaluation"]
    corpus = load_corpus(args.data_dir)
    output = {"command": _harness.command_line(__file__), "row": args.row,
              "grid": {"learning_rates": args.learning_rates,
                       "decay_rates": args.decay_rates},
              "study_grid": {"learning_rates": settings["learning_rates"],
                             "decay_rates": settings["decay_rates"]},
              "seeds": []}
    for recorded in row["seeds"]:
        path = os.path.join(args.checkpoints, args.row, f"seed{recorded['seed']}", "last.keras")
        if not os.path.exists(path):
            raise ValueError(f"Expected the seed's trained model at {path}: not found")
        model = keras.saving.load_model(path)
        # The study's dynamic evaluation ran at the tuned temperature.
        model.set_temperature(recorded["static"]["temperature"])
        start = time.time()
        result = dynamic_evaluation(
            model, corpus, segment_length=settings["segment_length"],
            learning_rates=tuple(args.learning_rates), decay_rates=tuple(args.decay_rates),
            epsilon=None, tuning_tokens=settings["tuning_tokens"],
            statistics_batches=settings["statistics_batches"],
            log=_harness.log,
        )
        output["seeds"].append({
            "seed": recorded["seed"],
            "recorded": recorded["dynamic"],
            "tuning": result["results"],
            "learning_rate": result["learning_rate"],
            "decay_rate": result["decay_rate"],
            "test": result["test"]["perplexity"],
            "seconds": time.time() - start,
        })
        _harness.write_json(args.json, output, indent=1)
        print(f"seed {recorded['seed']}: best η {result['learning_rate']:g}, λ "
              f"{result['decay_rate']:g}, test {result['test']['perplexity']:.2f} "
              f"(recorded {recorded['dynamic']['test']:.2f})", flush=True)


if __name__ == "__main__":
    main()
