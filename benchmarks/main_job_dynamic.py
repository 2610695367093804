"""How the main job's dynamic evaluation was chosen: settings, segments, tuning slice.

On a model the main job saved (`runs/main/model.keras`: the `tiny` preset
trained on the embedded corpus), with `DynamicEvaluator` directly:

1. a grid of `(segment length, η, ε, λ)` on the first 3,000 validation
   tokens, beside the static perplexity of the same tokens (one stream, the
   model's τ);
2. the whole test stream with the best setting at segments of 5 and 10
   tokens (wall and CPU seconds of each pass, gradient statistics included);
3. which η a 2,000-token tuning slice picks, against the 3,000-token one.

    python benchmarks/main_job_dynamic.py --model runs/main/model.keras \\
        --json benchmarks/results/main_job_dynamic.json

The machine's load average is recorded: wall seconds on a shared machine
are noise, CPU seconds less so.
"""

import math
import os

import _harness

_harness.environment(log_level="3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.data import synthetic_corpus  # noqa: E402
from keras_mogrifier.evaluation import DivergenceError  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402
from keras_mogrifier.pipeline import static_stream_losses  # noqa: E402

GRID = [  # (segment length, η, ε, λ)
    (5, 1e-4, 2e-5, 2e-3),  # Krause's ε
    (5, 5e-5, 5e-5, 2e-3),
    (5, 1e-4, 1e-4, 2e-3),
    (5, 2e-4, 1e-4, 2e-3),
    (5, 1e-4, 3e-4, 2e-3),
    (5, 3e-4, 3e-4, 2e-3),
    (5, 1e-4, 1e-4, 1e-2),
    (5, 1e-4, 1e-4, 5e-4),
    (10, 5e-5, 1e-4, 2e-3),
    (10, 1e-4, 1e-4, 2e-3),
]


def evaluator_for(model, corpus, segment_length, cache):
    if segment_length not in cache:
        evaluator = DynamicEvaluator(
            model.with_options(batch_size=100, samples=1), segment_length=segment_length
        )
        clock = _harness.Timing()
        with clock.measure():
            evaluator.collect_gradient_statistics(corpus.train, batch_size=100)
        cache[segment_length] = (evaluator, clock)
    return cache[segment_length]


def run(evaluator, ids, learning_rate, epsilon, decay_rate):
    evaluator.learning_rate = learning_rate
    evaluator.epsilon = epsilon
    evaluator.decay_rate = decay_rate
    clock = _harness.Timing()
    with clock.measure():
        try:
            perplexity = evaluator.evaluate(ids, verbose=0)["perplexity"]
        except DivergenceError:
            perplexity = math.inf
    return perplexity, clock


def main(argv=None):
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--model", required=True, help="a model saved by the main job")
    args = parser.parse_args(argv)
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    results = {"machine": {"cpus": os.cpu_count(), "load_average_before": quiet["load_average"]},
               "quiet_machine": quiet, "model": args.model}
    model = keras.saving.load_model(args.model)
    corpus = synthetic_corpus()
    results["temperature"] = float(model.temperature)
    cache = {}
    slice_3000 = corpus.valid[:3001]
    static = float(np.exp(static_stream_losses(model, slice_3000).mean()))
    results["valid_3000_static_perplexity"] = static
    print(f"valid[:3000], static (τ {model.temperature:.2f}, 1 stream): {static:.2f}", flush=True)
    grid = []
    for n, eta, eps, lam in GRID:
        evaluator, _ = evaluator_for(model, corpus, n, cache)
        perplexity, clock = run(evaluator, slice_3000, eta, eps, lam)
        grid.append({"segment_length": n, "learning_rate": eta, "epsilon": eps,
                     "decay_rate": lam, "perplexity": perplexity,
                     "seconds": clock.median, "cpu_seconds": clock.cpu_median})
        print(f"n {n:2d}  η {eta:g}  ε {eps:g}  λ {lam:g}: {perplexity:.2f} "
              f"({clock.cpu_median:.0f} s CPU)", flush=True)
    results["grid_valid_3000"] = grid
    best = min((g for g in grid if g["segment_length"] == 5), key=lambda g: g["perplexity"])
    test_static = float(np.exp(static_stream_losses(model, corpus.test).mean()))
    results["test_static_perplexity"] = test_static
    results["test"] = []
    for n in (5, 10):
        evaluator, statistics = evaluator_for(model, corpus, n, cache)
        perplexity, clock = run(
            evaluator, corpus.test, best["learning_rate"], best["epsilon"], best["decay_rate"]
        )
        results["test"].append({
            "segment_length": n, "learning_rate": best["learning_rate"],
            "epsilon": best["epsilon"], "decay_rate": best["decay_rate"],
            "perplexity": perplexity, "gain": 1 - perplexity / test_static,
            "seconds": clock.median, "cpu_seconds": clock.cpu_median,
            "statistics_seconds": statistics.median,
            "statistics_cpu_seconds": statistics.cpu_median,
        })
        print(f"test, n {n}: {perplexity:.2f} vs static {test_static:.2f} "
              f"({100 * (1 - perplexity / test_static):.1f} % lower; "
              f"{clock.cpu_median:.0f} s CPU, statistics {statistics.cpu_median:.0f} s CPU)",
              flush=True)
    slice_2000 = corpus.valid[:2001]
    evaluator, _ = evaluator_for(model, corpus, 10, cache)
    picks = {}
    for name, ids in (("2000", slice_2000), ("3000", slice_3000)):
        scores = {eta: run(evaluator, ids, eta, 1e-4, 2e-3)[0] for eta in (5e-5, 1e-4)}
        picks[name] = {"perplexities": {f"{k:g}": v for k, v in scores.items()},
                       "best_learning_rate": min(scores, key=scores.get)}
        print(f"tuning on valid[:{name}] (n 10, ε 1e-4): {picks[name]}", flush=True)
    results["tuning_slices"] = picks
    results["machine"]["load_average_after"] = _harness.load_average()
    if args.json:
        _harness.write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
