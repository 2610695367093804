"""Static vs dynamic loss along the test stream (Figure 2 of Krause et al.).

Scores the first `--tokens` tokens of the test split twice with the same
model, statically and with dynamic evaluation, and shows the loss as a
function of the number of tokens seen: the mean over windows of `--window`
tokens and the running mean from the start. With `--streams S` the slice is
cut into S independent streams, each adapted from the trained weights, and
the curves are averaged over streams position by position (as the paper
averages 500 sequences of the Hutter Prize test set).

    python examples/plot_dynamic_eval.py --data-dir ../shared/data/ptb
    python examples/plot_dynamic_eval.py --model trained.keras --tokens 20000
    python examples/plot_dynamic_eval.py --streams 4 --tokens 8000 --out runs/curve

Without `--model` it first trains a small 2-layer LSTM `LanguageModel` for
`--train-steps` steps (a few minutes on CPU), so the numbers are only
illustrative. Writes `OUT.csv` always, `OUT.png` when matplotlib is
installed (it is optional; `pip install matplotlib`), and with `--json` the
same table, the settings and the perplexities as JSON (with the command).
"""

import argparse
import csv
import json
import os
import sys

import _quiet  # noqa: E402,F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.data import StreamDataset  # noqa: E402
from keras_mogrifier.data import load_ptb  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402
from keras_mogrifier.evaluation import search_dynamic_evaluation  # noqa: E402
from keras_mogrifier.models import LanguageModel  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data-dir", help="directory of ptb.{train,valid,test}.txt[.gz]")
    parser.add_argument("--no-download", action="store_true",
                        help="without --data-dir, use the embedded synthetic corpus")
    parser.add_argument("--model", help="a trained LanguageModel (.keras); else train one")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=5000, help="test tokens scored")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--window", type=int, default=250)
    parser.add_argument("--segment-length", type=int, default=5)
    parser.add_argument("--statistics-batches", type=int, default=100)
    parser.add_argument("--tune-tokens", type=int, default=2000,
                        help="validation tokens to tune the learning and decay rates; 0: defaults")
    parser.add_argument("--out", default="runs/dynamic_eval_curve", help="output path prefix")
    parser.add_argument("--json", help="also write the table and the settings here")
    return parser.parse_args()


def train_small_model(corpus, args):
    keras.utils.set_random_seed(0)
    model = LanguageModel(
        vocabulary_size=len(corpus.vocabulary), units=args.units, num_layers=2,
        cell="lstm", batch_size=32, input_dropout=0.2, cell_output_dropout=0.2,
        output_dropout=0.2,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3, clipnorm=5.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    data = StreamDataset(corpus.train, batch_size=32, sequence_length=35,
                         max_batches=args.train_steps)
    model.fit(data, epochs=1, verbose=2)
    return model


def curves(token_losses, window):
    """Per-position mean over streams; window means and running means."""
    per_position = token_losses.mean(axis=0)
    positions = np.arange(1, per_position.size + 1)
    running = np.cumsum(per_position) / positions
    windows = per_position[: per_position.size // window * window].reshape(-1, window)
    return running, windows.mean(axis=1)


def main():
    args = parse_args()
    corpus = load_ptb(args.data_dir, download=not args.no_download)
    print(f"corpus: {corpus.source}, vocabulary {len(corpus.vocabulary)}")
    model = keras.saving.load_model(args.model) if args.model else train_small_model(corpus, args)
    # One stream per batch row, room for the statistics batches of 100.
    model = model.with_options(batch_size=100, samples=1)

    evaluator = DynamicEvaluator(model, segment_length=args.segment_length)
    evaluator.collect_gradient_statistics(
        corpus.train, steps=args.statistics_batches, batch_size=100
    )
    if args.tune_tokens:
        best = search_dynamic_evaluation(
            evaluator, corpus.valid[: args.tune_tokens + 1],
            learning_rates=[1e-5, 3e-5, 1e-4, 3e-4, 1e-3], decay_rates=[1e-3, 2e-3, 1e-2],
            strategy="sequential",
        )
        evaluator.learning_rate = best["learning_rate"]
        evaluator.decay_rate = best["decay_rate"]
    print(f"learning_rate={evaluator.learning_rate:g} decay_rate={evaluator.decay_rate:g}")

    length = args.tokens // args.streams + 1
    x = np.asarray(corpus.test[: args.streams * length]).reshape(args.streams, length)
    static = evaluator.evaluate(x, adapt=False, verbose=0, return_token_losses=True)
    dynamic = evaluator.evaluate(x, verbose=0, return_token_losses=True)
    print(f"static perplexity {static['perplexity']:.2f}, "
          f"dynamic perplexity {dynamic['perplexity']:.2f} "
          f"on {dynamic['num_tokens']} test tokens")

    static_running, static_windows = curves(static["token_losses"], args.window)
    dynamic_running, dynamic_windows = curves(dynamic["token_losses"], args.window)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tokens_seen", "static_window_loss", "dynamic_window_loss",
                         "static_running_loss", "dynamic_running_loss"])
        for i in range(static_windows.size):
            end = (i + 1) * args.window
            writer.writerow([end, static_windows[i], dynamic_windows[i],
                             static_running[end - 1], dynamic_running[end - 1]])
    print(f"wrote {args.out}.csv")
    if args.json:
        rows = [
            {"tokens_seen": (i + 1) * args.window,
             "static_window_loss": float(static_windows[i]),
             "dynamic_window_loss": float(dynamic_windows[i]),
             "static_running_loss": float(static_running[(i + 1) * args.window - 1]),
             "dynamic_running_loss": float(dynamic_running[(i + 1) * args.window - 1])}
            for i in range(static_windows.size)
        ]
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": "python " + " ".join(sys.argv),
                       "backend": keras.backend.backend(),
                       "learning_rate": evaluator.learning_rate,
                       "decay_rate": evaluator.decay_rate,
                       "static_perplexity": static["perplexity"],
                       "dynamic_perplexity": dynamic["perplexity"],
                       "num_tokens": dynamic["num_tokens"], "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    seen = np.arange(1, static_windows.size + 1) * args.window
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(seen, static_windows, label="static")
    ax.plot(seen, dynamic_windows, label="dynamic")
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(f"mean loss over {args.window} tokens (nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.png")


if __name__ == "__main__":
    main()
