"""Krause et al.'s ladder of test-time adaptation on a trained PTB model.

Every rung is tuned on the same validation slice the same way (one pass per
setting: the learning rate first, at the middle of the rung's decay grid,
then the decay rate, as Krause et al. do; every learning rate at λ = 0 for
the rungs without a prior;
for the cache λ and θ from one pass), then scores the **whole** test split as
one stream (batch 1, state carried):

| rung | rule | n |
| --- | --- | --- |
| static | no adaptation | 5 |
| traditional | `sgd`, λ = 0 (Mikolov's, described in Krause §4-5: n = 1 in eq. 2) | 1 |
| sgd n=5 | `sgd`, λ = 0 | 5 |
| sgd + global prior | `sgd` (eq. 4) | 5 |
| RMS + global prior | `rms_global_prior` (eq. 6) | 5 |
| RMS + RMS prior | `rms_rms_prior` (eq. 8, the default) | 5 |
| neural cache | `NeuralCache` (eq. 3), window 2000 | 35 per pass |

It prints a table (test perplexity, gain over static, seconds and ms per
token of the test pass), writes it as JSON, draws a bar chart, and the static
vs dynamic (eq. 8) loss along the test stream (moving average).

    python benchmarks/test_time_adaptation.py --model runs/ptb_small/lstm.keras \\
        --data-dir ../shared/data/ptb --json benchmarks/results/ladder.json \\
        --plots docs

Timings are wall-clock on whatever else the machine is doing: run it on a
quiet machine when the times matter (the perplexities do not depend on it).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import _quiet  # noqa: E402,F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mogrifier as km  # noqa: E402
from keras_mogrifier.data import load_corpus  # noqa: E402

RUNGS = [
    # name, update_rule (None: static / cache), segment_length, learning rates, decay rates
    ("static", None, 5, None, None),
    ("traditional (SGD, n=1)", "sgd", 1, (0.003, 0.01, 0.03, 0.1, 0.3), (0.0,)),
    ("SGD, n=5", "sgd", 5, (0.003, 0.01, 0.03, 0.1, 0.3), (0.0,)),
    ("SGD + global prior", "sgd", 5, (0.003, 0.01, 0.03, 0.1, 0.3), (1e-4, 1e-3, 1e-2, 3e-2)),
    ("RMS + global prior", "rms_global_prior", 5, (1e-5, 3e-5, 1e-4, 3e-4), (1e-4, 1e-3, 1e-2, 3e-2)),
    ("RMS + RMS prior", "rms_rms_prior", 5, (1e-5, 3e-5, 1e-4, 3e-4), (1e-3, 2e-3, 1e-2, 3e-2)),
    ("neural cache", "cache", 35, None, None),
]


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="a trained LanguageModel (.keras)")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--tuning-tokens", type=int, default=10_000,
                        help="validation tokens each setting is tuned on")
    parser.add_argument("--test-tokens", type=int, help="cap the test tokens (default: all)")
    parser.add_argument("--statistics-batch-size", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=2e-5)
    parser.add_argument("--cache-size", type=int, default=2000)
    parser.add_argument("--rungs", nargs="+", help="run only the rungs whose name starts so")
    parser.add_argument("--json", help="write the table here")
    parser.add_argument("--plots", help="directory for the bar chart and the loss curve (PNG)")
    parser.add_argument("--window", type=int, default=2000, help="moving average of the curve")
    return parser.parse_args()


def main():
    args = parse_args()
    corpus = load_corpus(args.data_dir)
    trained = keras.saving.load_model(args.model)
    model = trained.with_options(batch_size=args.statistics_batch_size, samples=1)
    test = corpus.test if args.test_tokens is None else corpus.test[: args.test_tokens + 1]
    tuning = corpus.valid[: args.tuning_tokens + 1]
    rows, curves = [], {}
    statistics = {}
    for name, rule, n, learning_rates, decay_rates in RUNGS:
        if args.rungs and not any(name.startswith(r) for r in args.rungs):
            continue
        print(f"\n== {name}", flush=True)
        row = {"rung": name, "segment_length": n}
        if rule == "cache":
            cache = km.NeuralCache(model, cache_size=args.cache_size, segment_length=n)
            best = cache.search(tuning)
            row.update(interpolation=best["interpolation"], flatness=best["flatness"],
                       valid_tuning_perplexity=best["perplexity"])
            cache.evaluate(test[: 2 * n + 2], verbose=0)  # compile before timing
            start = time.time()
            result = cache.evaluate(test, verbose=0)
        else:
            evaluator = km.DynamicEvaluator(
                model, segment_length=n, epsilon=args.epsilon,
                update_rule=rule or "rms_rms_prior",
            )
            if rule is not None and km.evaluation.update_rules.NEEDS_STATISTICS[rule]:
                if n not in statistics:
                    start = time.time()
                    evaluator.collect_gradient_statistics(
                        corpus.train, batch_size=args.statistics_batch_size
                    )
                    statistics[n] = evaluator.gradient_statistics
                    print(f"gradient statistics (n={n}) in {time.time() - start:.0f} s", flush=True)
                evaluator.gradient_statistics = statistics[n]
            if rule is not None:
                # One λ (0 for the rungs without a prior): every η at it.
                # Otherwise Krause's order, η first at the grid's middle λ,
                # then λ at the best η — so no setting leaves the rung's grid.
                evaluator.decay_rate = decay_rates[len(decay_rates) // 2]
                best = km.search_dynamic_evaluation(
                    evaluator, tuning, learning_rates=list(learning_rates),
                    decay_rates=list(decay_rates),
                    strategy="grid" if len(decay_rates) == 1 else "sequential",
                )
                evaluator.learning_rate = best["learning_rate"]
                evaluator.decay_rate = best["decay_rate"]
                diverged = sum("diverged" in r for r in best["results"])
                row.update(learning_rate=best["learning_rate"], decay_rate=best["decay_rate"],
                           valid_tuning_perplexity=best["perplexity"],
                           settings_tried=len(best["results"]), settings_diverged=diverged)
                print(f"tuned: learning_rate={best['learning_rate']:g}, "
                      f"decay_rate={best['decay_rate']:g} ({len(best['results'])} settings, "
                      f"{diverged} diverged)", flush=True)
            # Compile (trace) before timing.
            evaluator.evaluate(test[: 2 * n + 2], verbose=0, adapt=rule is not None)
            start = time.time()
            result = evaluator.evaluate(
                test, verbose=0, adapt=rule is not None, return_token_losses=True
            )
            if rule in (None, "rms_rms_prior"):
                curves[name] = result["token_losses"][0]
        seconds = time.time() - start
        row.update(test_perplexity=result["perplexity"], test_tokens=result["num_tokens"],
                   test_seconds=seconds, ms_per_token=1000 * seconds / result["num_tokens"])
        rows.append(row)
        print(f"test perplexity {result['perplexity']:.2f} ({seconds:.0f} s)", flush=True)
        report(rows, args)
    if args.plots:
        plot(rows, curves, args)


def report(rows, args):
    static = next((r["test_perplexity"] for r in rows if r["rung"] == "static"), None)
    static_ms = next((r["ms_per_token"] for r in rows if r["rung"] == "static"), None)
    print("\n| rung | n | setting | test ppl | vs static | ms/token | × static time |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "interpolation" in r:
            setting = f"λ={r['interpolation']:g}, θ={r['flatness']:g}"
        elif "learning_rate" in r:
            setting = f"η={r['learning_rate']:g}, λ={r['decay_rate']:g}"
        else:
            setting = "—"
        gain = "" if static is None else f"{100 * (r['test_perplexity'] / static - 1):+.1f} %"
        ratio = "" if static_ms is None else f"{r['ms_per_token'] / static_ms:.2f}"
        r["gain_percent"] = None if static is None else 100 * (r["test_perplexity"] / static - 1)
        print(f"| {r['rung']} | {r['segment_length']} | {setting} | "
              f"{r['test_perplexity']:.2f} | {gain} | {r['ms_per_token']:.2f} | {ratio} |")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": "python " + " ".join(sys.argv), "backend":
                       keras.backend.backend(), "rows": rows}, f, indent=2)


def plot(rows, curves, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.plots, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [r["rung"] for r in rows]
    values = [r["test_perplexity"] for r in rows]
    bars = ax.barh(names[::-1], values[::-1], color="#4c72b0")
    for bar, value in zip(bars, values[::-1]):
        ax.text(value, bar.get_y() + bar.get_height() / 2, f" {value:.1f}", va="center")
    ax.set_xlabel("PTB test perplexity (lower is better)")
    ax.set_xlim(0, max(values) * 1.15)
    ax.set_title("Test-time adaptation ladder (Krause et al. Table 1)")
    fig.tight_layout()
    fig.savefig(os.path.join(args.plots, "test_time_adaptation_ladder.png"), dpi=120)
    plt.close(fig)
    if "static" in curves and "RMS + RMS prior" in curves:
        window = args.window
        kernel = np.ones(window) / window
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for name, label in (("static", "static"), ("RMS + RMS prior", "dynamic (eq. 8)")):
            smooth = np.convolve(curves[name], kernel, mode="valid")
            ax.plot(np.arange(window, window + len(smooth)), smooth, label=label)
        ax.set_xlabel("tokens of the PTB test stream")
        ax.set_ylabel(f"loss (nats), moving average of {window}")
        ax.legend()
        ax.set_title("Static vs dynamic evaluation along the test stream")
        fig.tight_layout()
        fig.savefig(os.path.join(args.plots, "dynamic_evaluation_curve.png"), dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    main()
