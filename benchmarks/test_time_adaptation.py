"""Krause et al.'s ladder of test-time adaptation on a trained PTB model.

Every rung is tuned on the same validation slice the same way (one pass per
setting: the learning rate first, at the middle of the shared decay grid,
then the decay rate at the best learning rate, as Krause et al. do; every
learning rate at λ = 0 for the rungs without a prior; for the cache λ and θ
from one pass), then scores the **whole** test split as one stream (batch 1,
state carried):

| rung | rule | n |
| --- | --- | --- |
| static | no adaptation | 5 |
| traditional | `sgd`, λ = 0 (Mikolov's, described in Krause §4-5: n = 1 in eq. 2) | 1 |
| sgd n=5 | `sgd`, λ = 0 | 5 |
| sgd + global prior | `sgd` (eq. 4) | 5 |
| RMS + global prior | `rms_global_prior` (eq. 6) | 5 |
| RMS + RMS prior | `rms_rms_prior` (eq. 8, the default) | 5 |
| neural cache | `NeuralCache` (eq. 3), window 2000 | 5, as dynamic evaluation |

Rules that share a parameter search it on the same grid: one η grid for the
three SGD rungs, one for the two RMS rungs (their η differ in scale), one λ
grid for the three rungs with a prior (λ is the fraction of `θ_g − θ`
restored per segment in eq. 4 and 6, and for an element of average RMS in
eq. 8). A best value at either end of its grid is not a tuned value: the
grid is then widened in that direction by its end ratio, one value at a
time, until the best value is interior (at most `--max-widening` times;
the JSON records every value tried and whether the best ended interior).
The cache is scored in segments of the dynamic-evaluation length, so its
time per token compares like for like.

It prints a table (test perplexity, gain over static, seconds and ms per
token of the test pass), writes it as JSON, draws a bar chart, and the static
vs dynamic (eq. 8) loss along the test stream (moving average).

    python benchmarks/test_time_adaptation.py --model runs/ptb_small/lstm.keras \\
        --data-dir ../shared/data/ptb --json benchmarks/results/ladder.json \\
        --plots docs

Timings are wall-clock on whatever else the machine is doing (the JSON
records the load): run it on a quiet machine when the times matter (the
perplexities do not depend on it).
"""

import argparse
import math
import os
import sys
import time

import _harness

sys.path.insert(0, os.path.join(_harness.REPOSITORY, "examples"))
import _quiet  # noqa: E402,F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mogrifier as km  # noqa: E402
from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.evaluation import search_dynamic_evaluation  # noqa: E402

# Shared grids (see the docstring). The previous run's best values (SGD
# η 0.3 at the top, eq. 8 λ 1e-3 at the bottom, cache θ 1.0 at the top) are
# inside these.
SGD_LEARNING_RATES = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
RMS_LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
DECAY_RATES = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
CACHE_INTERPOLATIONS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4)
CACHE_FLATNESSES = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)

# The curves' keys in the --curves file.
CURVE_NAMES = {"static": "static", "rms_rms_prior": "RMS + RMS prior"}

RUNGS = [
    # name, update_rule (None: static / cache), segment_length, learning rates, decay rates
    ("static", None, 5, None, None),
    ("traditional (SGD, n=1)", "sgd", 1, SGD_LEARNING_RATES, (0.0,)),
    ("SGD, n=5", "sgd", 5, SGD_LEARNING_RATES, (0.0,)),
    ("SGD + global prior", "sgd", 5, SGD_LEARNING_RATES, DECAY_RATES),
    ("RMS + global prior", "rms_global_prior", 5, RMS_LEARNING_RATES, DECAY_RATES),
    ("RMS + RMS prior", "rms_rms_prior", 5, RMS_LEARNING_RATES, DECAY_RATES),
    ("neural cache", "cache", 5, None, None),
]


def widened(values, scores, max_widening, widenings):
    """The grid with one more value past its best end, or `None` when the best
    value is interior (or the widening budget is spent, or it cannot grow:
    a grid of one value, or a zero at its end)."""
    values = sorted(values)
    best = min(values, key=lambda v: scores[v])
    if len(values) < 2 or widenings >= max_widening:
        return None
    if best == values[0] and values[0] > 0:
        return [values[0] * values[0] / values[1]] + values
    if best == values[-1]:
        return values + [values[-1] * values[-1] / values[-2]]
    return None


def tune_axis(score, values, max_widening):
    """Scores every value (`score(v) -> loss`), widening the grid until the
    best value is interior. Returns `(best, scores, interior)`."""
    values, scores, widenings = sorted(values), {}, 0
    while True:
        for v in values:
            if v not in scores:
                scores[v] = score(v)
        grown = widened(values, scores, max_widening, widenings)
        if grown is None:
            break
        values, widenings = grown, widenings + 1
    best = min(values, key=lambda v: scores[v])
    interior = len(values) == 1 or best not in (values[0], values[-1])
    return best, scores, interior


def tune_rung(evaluator, tuning, learning_rates, decay_rates, max_widening):
    """Krause's order: η at the middle λ of the grid, then λ at the best η."""
    passes = []

    def score(learning_rate, decay_rate):
        try:
            result = search_dynamic_evaluation(
                evaluator, tuning, settings=[(learning_rate, decay_rate)]
            )["results"][0]
        except km.DivergenceError as error:  # the only setting tried diverged
            result = {"learning_rate": learning_rate, "decay_rate": decay_rate,
                      "loss": math.inf, "perplexity": math.inf, "diverged": error}
        passes.append({k: (str(v) if k == "diverged" else v) for k, v in result.items()})
        print(f"  η={learning_rate:g}, λ={decay_rate:g}: "
              + ("diverged" if "diverged" in result else f"perplexity {result['perplexity']:.2f}"),
              flush=True)
        return result["loss"]

    middle = sorted(decay_rates)[len(decay_rates) // 2]
    learning_rate, lr_scores, lr_interior = tune_axis(
        lambda v: score(v, middle), learning_rates, max_widening)
    decay_rate, decay_scores, decay_interior = tune_axis(
        lambda v: lr_scores[learning_rate] if v == middle else score(learning_rate, v),
        decay_rates, max_widening)
    loss = decay_scores[decay_rate]
    return {
        "learning_rate": learning_rate, "decay_rate": decay_rate,
        "valid_tuning_perplexity": math.exp(loss) if math.isfinite(loss) else math.inf,
        "learning_rates_tried": sorted(lr_scores), "decay_rates_tried": sorted(decay_scores),
        "learning_rate_interior": lr_interior, "decay_rate_interior": decay_interior,
        "settings_tried": len(passes),
        "settings_diverged": sum("diverged" in p for p in passes),
        "passes": passes,
    }


def parse_args():
    parser = _harness.argument_parser(
        __doc__, json_flag=False, data_dir="required",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="a trained LanguageModel (.keras)")
    parser.add_argument("--tuning-tokens", type=int, default=10_000,
                        help="validation tokens each setting is tuned on")
    parser.add_argument("--test-tokens", type=int, help="cap the test tokens (default: all)")
    parser.add_argument("--statistics-batch-size", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=2e-5)
    parser.add_argument("--cache-size", type=int, default=2000)
    parser.add_argument("--max-widening", type=int, default=4,
                        help="times a grid may grow past a best value at its end")
    parser.add_argument("--rungs", nargs="+", help="run only the rungs whose name starts so")
    parser.add_argument("--json", help="write the table here")
    parser.add_argument("--plots", help="directory for the bar chart and the loss curve (PNG)")
    parser.add_argument("--window", type=int, default=2000, help="moving average of the curve")
    parser.add_argument("--curves", help="write the static and eq. 8 token losses here (.npz)")
    parser.add_argument("--plot-only", action="store_true",
                        help="draw --plots from --json and --curves, measuring nothing")
    parser.add_argument("--device", default="cpu",
                        help="the machine, in words, stored in the JSON (e.g. 'one H200')")
    return parser.parse_args()


def main():
    args = parse_args()
    if args.plot_only:
        if not (args.json and args.plots):
            raise SystemExit("--plot-only draws --plots from --json (and --curves).")
        rows = _harness.read_json(args.json)["rows"]
        curves = {}
        if args.curves:
            with np.load(args.curves) as data:
                curves = {CURVE_NAMES[k]: data[k] for k in data.files}
        plot(rows, curves, args)
        return
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
            interpolations, flatnesses = list(CACHE_INTERPOLATIONS), list(CACHE_FLATNESSES)
            for widening in range(args.max_widening + 1):
                best = cache.search(tuning, interpolations=interpolations,
                                    flatnesses=flatnesses)
                losses = {}
                for (lam, theta), loss in best["losses"].items():
                    losses.setdefault("flatness", {})[theta] = min(
                        loss, losses.get("flatness", {}).get(theta, math.inf))
                    losses.setdefault("interpolation", {})[lam] = min(
                        loss, losses.get("interpolation", {}).get(lam, math.inf))
                grown_f = widened(flatnesses, losses["flatness"], args.max_widening, widening)
                grown_i = widened(interpolations, losses["interpolation"], args.max_widening,
                                  widening)
                if grown_i is not None:
                    grown_i = [v for v in grown_i if 0 < v < 1]
                    grown_i = None if len(grown_i) == len(interpolations) else grown_i
                if grown_f is None and grown_i is None:
                    break
                flatnesses = grown_f or flatnesses
                interpolations = grown_i or interpolations
            row.update(interpolation=best["interpolation"], flatness=best["flatness"],
                       valid_tuning_perplexity=best["perplexity"],
                       interpolations_tried=sorted(interpolations),
                       flatnesses_tried=sorted(flatnesses),
                       flatness_interior=best["flatness"] not in (min(flatnesses),
                                                                  max(flatnesses)),
                       interpolation_interior=best["interpolation"] not in (
                           min(interpolations), max(interpolations)))
            print(f"tuned: λ={best['interpolation']:g}, θ={best['flatness']:g}", flush=True)
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
                tuned = tune_rung(evaluator, tuning, learning_rates, decay_rates,
                                  args.max_widening)
                evaluator.learning_rate = tuned["learning_rate"]
                evaluator.decay_rate = tuned["decay_rate"]
                row.update(tuned)
                print(f"tuned: learning_rate={tuned['learning_rate']:g}, "
                      f"decay_rate={tuned['decay_rate']:g} ({tuned['settings_tried']} settings, "
                      f"{tuned['settings_diverged']} diverged; interior: "
                      f"{tuned['learning_rate_interior']}, {tuned['decay_rate_interior']})",
                      flush=True)
            # Compile (trace) before timing.
            evaluator.evaluate(test[: 2 * n + 2], verbose=0, adapt=rule is not None)
            start = time.time()
            result = evaluator.evaluate(
                test, verbose=0, adapt=rule is not None, return_token_losses=True
            )
            if rule in (None, "rms_rms_prior"):
                curves[name] = result["token_losses"][0]
                if args.curves:
                    os.makedirs(os.path.dirname(os.path.abspath(args.curves)), exist_ok=True)
                    np.savez_compressed(args.curves, **{
                        key: np.asarray(curves[value], dtype="float32")
                        for key, value in CURVE_NAMES.items() if value in curves})
        seconds = time.time() - start
        row.update(test_perplexity=result["perplexity"], test_tokens=result["num_tokens"],
                   test_seconds=seconds, ms_per_token=1000 * seconds / result["num_tokens"],
                   load_average=_harness.load_average())
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
        _harness.write_json(args.json, {
            "command": _harness.command_line(__file__), "backend": keras.backend.backend(),
            "device": args.device,
            "grids": {"sgd_learning_rates": SGD_LEARNING_RATES,
                      "rms_learning_rates": RMS_LEARNING_RATES,
                      "decay_rates": DECAY_RATES,
                      "cache_interpolations": CACHE_INTERPOLATIONS,
                      "cache_flatnesses": CACHE_FLATNESSES},
            "rows": rows}, default=str)


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
