"""Reverse copy at CPU scale: which cell copies the longest, and with what embedding.

The analogue of the Mogrifier paper's Figure 4 (§4.3) that two CPU cores can
run: for each cell and each sequence length, KerasTuner searches the learning
rate, the L2 penalty and the embedding size with the parameter count held
fixed (the hidden size follows the embedding size, as in the paper, so every
model has about `--parameters` parameters); the best trial's model (by
validation cross-entropy) is scored on the test set. Writes the results as
JSON after every (cell, length) and draws test cross-entropy against length:

    python examples/reverse_copy_study.py --cells lstm mogrifier_lstm rlstm \\
        --lengths 5 10 15 20 --vocabulary-size 100 --parameters 100000 \\
        --train-examples 20000 --epochs 6 --trials 4 \\
        --results-json benchmarks/results/reverse_copy_study.json \\
        --figure docs/reverse_copy_study.png

`--resume` skips the (cell, length) pairs already in the JSON file, so a run
that was cut off goes on where it stopped. `--search grid` with short lists
(`--embedding-sizes 8 16 32 64 --learning-rates 1e-2 --l2 0`) sweeps one
hyperparameter fully; `--embedding-figure` then draws the best validation
cross-entropy at each embedding size.

Points are independent, so a machine with many cores (or one GPU) can run
them as separate processes, one `--cells C --lengths L --results-json
part_C_L.json` each, and gather them: `--merge part_*.json --results-json
all.json --figure fig.png` measures nothing, writes the points in the order
of `--lengths` and `--cells` with each part's command, and draws.
"""

import argparse
import json
import math
import os
import shlex
import sys
import time
import warnings

import _quiet  # noqa: F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402
import keras_tuner  # noqa: E402

import reverse_copy as example  # noqa: E402
from keras_mogrifier.data import reverse_copy  # noqa: E402

EMBEDDING_SIZES = (8, 16, 32, 64)
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
L2 = (0.0, 1e-6, 1e-5)


class ReverseCopyHyperModel(keras_tuner.HyperModel):
    """The encoder-decoder of `reverse_copy.py`, at a fixed parameter count."""

    def __init__(self, cell, vocabulary_size, parameters, rounds, rank,
                 embedding_sizes=EMBEDDING_SIZES, learning_rates=LEARNING_RATES, l2=L2,
                 length=None):
        super().__init__(name=f"reverse_copy_{cell}")
        self.cell, self.vocabulary_size, self.length = cell, vocabulary_size, length
        self.parameters, self.rounds, self.rank = parameters, rounds, rank
        self.choices = {"embedding_size": list(embedding_sizes),
                        "learning_rate": list(learning_rates), "l2": list(l2)}

    def units(self, embedding_size):
        return example.units_for_parameters(
            self.cell, self.parameters, self.vocabulary_size, embedding_size,
            self.rounds, self.rank)

    def build(self, hp):
        embedding_size = hp.Choice("embedding_size", self.choices["embedding_size"])
        units = self.units(embedding_size)
        rank = None if self.rank is None else min(self.rank, units, embedding_size)
        return example.build_model(
            self.cell, self.vocabulary_size, embedding_size, units, self.rounds, rank,
            l2=hp.Choice("l2", self.choices["l2"]),
            learning_rate=hp.Choice("learning_rate", self.choices["learning_rate"]),
            length=self.length,
        )


def _check_positive(parser, name, values, allow_zero=False):
    bad = [v for v in values if v < 0 or (v == 0 and not allow_zero)]
    if bad:
        kind = "non-negative" if allow_zero else "positive"
        parser.error(f"--{name.replace('_', '-')} must be {kind}; received {values}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--cells", nargs="+", choices=example.CELLS,
                        default=["lstm", "mogrifier_lstm", "rlstm"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[5, 10, 15, 20])
    parser.add_argument("--vocabulary-size", type=int, default=100)
    parser.add_argument("--parameters", type=int, default=100_000)
    parser.add_argument("--train-examples", type=int, default=20_000)
    parser.add_argument("--evaluation-examples", type=int, default=2_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--trials", type=int, default=4,
                        help="KerasTuner trials per point (random search)")
    parser.add_argument("--search", choices=("random", "grid"), default="random",
                        help="random: `--trials` draws (the same seed, so the same "
                        "draws, at every point); grid: every combination")
    parser.add_argument("--embedding-sizes", nargs="+", type=int, default=list(EMBEDDING_SIZES))
    parser.add_argument("--learning-rates", nargs="+", type=float,
                        default=list(LEARNING_RATES))
    parser.add_argument("--l2", nargs="+", type=float, default=list(L2))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--mogrifier-rounds", type=int, default=5)
    parser.add_argument("--mogrifier-rank", type=int, help="default: full rank")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tuner-dir", default="runs/reverse_copy_study")
    parser.add_argument("--results-json", default="runs/reverse_copy_study.json")
    parser.add_argument("--figure", help="draw test cross-entropy against length here")
    parser.add_argument("--embedding-figure",
                        help="draw the best validation cross-entropy per embedding size here")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="gather the points of these results files (one process "
                        "each) into --results-json and draw; measures nothing")
    args = parser.parse_args(argv)
    for name in ("embedding_sizes", "learning_rates", "l2", "lengths"):
        _check_positive(parser, name, getattr(args, name), allow_zero=name == "l2")
    return args


def study_point(args, cell, length):
    size = args.vocabulary_size
    train = reverse_copy(args.train_examples, length, size, seed=args.seed)
    valid = reverse_copy(args.evaluation_examples, length, size, seed=args.seed + 1)
    test = reverse_copy(args.evaluation_examples, length, size, seed=args.seed + 2)
    hypermodel = ReverseCopyHyperModel(cell, size, args.parameters, args.mogrifier_rounds,
                                       args.mogrifier_rank, args.embedding_sizes,
                                       args.learning_rates, args.l2, length=length)
    if args.search == "grid":
        tuner_class, max_trials = keras_tuner.GridSearch, (
            len(args.embedding_sizes) * len(args.learning_rates) * len(args.l2))
    else:
        tuner_class, max_trials = keras_tuner.RandomSearch, args.trials
    tuner = tuner_class(
        hypermodel,
        objective=keras_tuner.Objective("val_cross_entropy", "min"),
        max_trials=max_trials,
        seed=args.seed,
        directory=args.tuner_dir,
        project_name=f"{cell}_L{length}",
        overwrite=True,  # a point is searched afresh (`--resume` skips finished ones)
    )
    start = time.time()
    tuner.search(*train, validation_data=valid, batch_size=args.batch_size,
                 epochs=args.epochs, verbose=0)
    seconds = time.time() - start
    best = tuner.get_best_hyperparameters(1)[0]
    with warnings.catch_warnings():
        # The checkpoint holds the trained optimizer's slots, the rebuilt model
        # an unbuilt optimizer: only the weights matter for scoring.
        warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
        model = tuner.get_best_models(1)[0]
    logs = model.evaluate(*test, batch_size=256, verbose=0, return_dict=True)
    trials = []
    for trial in tuner.oracle.trials.values():
        trials.append({**trial.hyperparameters.values,
                       "val_cross_entropy": trial.score})
    return {
        "cell": cell,
        "length": length,
        "embedding_size": best.get("embedding_size"),
        "units": hypermodel.units(best.get("embedding_size")),
        "learning_rate": best.get("learning_rate"),
        "l2": best.get("l2"),
        "parameters": int(model.count_params()),
        "test_cross_entropy": float(logs["cross_entropy"]),
        "test_accuracy": float(logs["accuracy"]),
        "uniform_cross_entropy": math.log(size + 1),  # tokens and end of sequence
        "trials": trials,
        "search_seconds": seconds,
    }


def _axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6, 4))


def _save(fig, ax, path):
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def draw(rows, path, vocabulary_size):
    fig, ax = _axes()
    for index, cell in enumerate(dict.fromkeys(r["cell"] for r in rows)):
        points = sorted((r for r in rows if r["cell"] == cell), key=lambda r: r["length"])
        xs = [r["length"] for r in points]
        ys = [r["test_cross_entropy"] for r in points]
        (line,) = ax.plot(xs, ys, marker="o", label=cell)
        for r in points:
            # One label row per cell, so that close points stay readable.
            ax.annotate(f"e{r['embedding_size']}", (r["length"], r["test_cross_entropy"]),
                        textcoords="offset points", xytext=(-8, 8 + 9 * index), fontsize=7,
                        color=line.get_color())
    # The tokens and the end-of-sequence symbol (the rows' own figure).
    uniform = rows[0].get("uniform_cross_entropy", math.log(vocabulary_size + 1))
    highest = max(r["test_cross_entropy"] for r in rows)
    if highest > uniform / 3:
        ax.axhline(uniform, color="grey", linestyle=":", label="uniform guess")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(f"test cross-entropy (nats per token; uniform {uniform:.2f})")
    ax.set_title("Reverse copy, equal parameters (eN: best embedding size)", fontsize=9)
    _save(fig, ax, path)


def draw_embedding_sizes(rows, path):
    """Best validation cross-entropy found at each embedding size (over the
    other hyperparameters' trials), one line per (cell, length)."""
    fig, ax = _axes()
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    lengths = sorted({r["length"] for r in rows})
    styles = ("-", "--", ":", "-.")
    for r in rows:
        best = {}
        for t in r["trials"]:
            if t["val_cross_entropy"] is not None:
                e = t["embedding_size"]
                best[e] = min(best.get(e, math.inf), t["val_cross_entropy"])
        sizes = sorted(best)
        # Colour: the cell; line style: the length.
        ax.plot(sizes, [best[e] for e in sizes], marker="o", color=f"C{cells.index(r['cell'])}",
                linestyle=styles[lengths.index(r["length"]) % len(styles)],
                label=f"{r['cell']}, L = {r['length']}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("embedding size")
    ax.set_ylabel("best validation cross-entropy (nats per token)")
    ax.set_title("Reverse copy, equal parameters: embedding size", fontsize=9)
    _save(fig, ax, path)


def merge(args):
    """The points of several results files in one, ordered as the arguments say."""
    rows, commands, backends = [], [], set()
    for path in args.merge:
        with open(path) as f:
            part = json.load(f)
        for row in part["rows"]:
            rows.append({**row, "command": part["command"]})
        commands.append(part["command"])
        backends.add(part["backend"])
        settings = {k: v for k, v in part["settings"].items()
                    if k not in ("cells", "lengths", "tuner_dir", "results_json")}
    order = {(c, n): i for i, (n, c) in enumerate(
        (n, c) for n in args.lengths for c in args.cells)}
    missing = sorted(set(order) - {(r["cell"], r["length"]) for r in rows})
    rows = sorted((r for r in rows if (r["cell"], r["length"]) in order),
                  key=lambda r: order[(r["cell"], r["length"])])
    with open(args.results_json, "w") as f:
        json.dump({"command": "python reverse_copy_study.py " + shlex.join(sys.argv[1:]),
                   "commands": commands, "missing": missing,
                   "settings": {**settings, "cells": args.cells, "lengths": args.lengths},
                   "backend": "/".join(sorted(backends)), "rows": rows}, f, indent=2)
    print(f"{len(rows)} points gathered in {args.results_json}; missing: {missing or 'none'}")
    if args.figure and rows:
        draw(rows, args.figure, args.vocabulary_size)
    if args.embedding_figure and rows:
        draw_embedding_sizes(rows, args.embedding_figure)
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        return merge(args)
    keras.utils.set_random_seed(args.seed)
    rows = []
    if args.resume and os.path.exists(args.results_json):
        with open(args.results_json) as f:
            rows = json.load(f)["rows"]
    done = {(r["cell"], r["length"]) for r in rows}
    for length in args.lengths:
        for cell in args.cells:
            if (cell, length) in done:
                continue
            row = study_point(args, cell, length)
            rows.append(row)
            print(f"{cell:>15} L={length:<4} test cross-entropy "
                  f"{row['test_cross_entropy']:.4f} (accuracy {row['test_accuracy']:.3f}); "
                  f"embedding {row['embedding_size']}, {row['units']} units, "
                  f"lr {row['learning_rate']:g}, l2 {row['l2']:g}; "
                  f"{row['search_seconds']:.0f} s", flush=True)
            os.makedirs(os.path.dirname(os.path.abspath(args.results_json)), exist_ok=True)
            with open(args.results_json, "w") as f:
                json.dump({"command": "python reverse_copy_study.py " + shlex.join(
                               sys.argv[1:] if argv is None else argv),
                           "settings": {k: v for k, v in vars(args).items()
                                        if k not in ("resume",)},
                           "backend": keras.backend.backend(), "rows": rows}, f, indent=2)
    if args.figure:
        draw(rows, args.figure, args.vocabulary_size)
    if args.embedding_figure:
        draw_embedding_sizes(rows, args.embedding_figure)
    return rows


if __name__ == "__main__":
    main()
