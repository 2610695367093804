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

import argparse
import json
import math
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

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


class Clock:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def evaluator_for(model, corpus, segment_length, cache):
    if segment_length not in cache:
        evaluator = DynamicEvaluator(
            model.with_options(batch_size=100, samples=1), segment_length=segment_length
        )
        with Clock() as clock:
            evaluator.collect_gradient_statistics(corpus.train, batch_size=100)
        cache[segment_length] = (evaluator, clock)
    return cache[segment_length]


def run(evaluator, ids, learning_rate, epsilon, decay_rate):
    evaluator.learning_rate = learning_rate
    evaluator.epsilon = epsilon
    evaluator.decay_rate = decay_rate
    with Clock() as clock:
        try:
            perplexity = evaluator.evaluate(ids, verbose=0)["perplexity"]
        except DivergenceError:
            perplexity = math.inf
    return perplexity, clock


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model saved by the main job")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = {"machine": {"cpus": os.cpu_count(), "load_average_before": list(os.getloadavg())},
               "model": args.model}
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
                     "seconds": clock.wall, "cpu_seconds": clock.cpu})
        print(f"n {n:2d}  η {eta:g}  ε {eps:g}  λ {lam:g}: {perplexity:.2f} "
              f"({clock.cpu:.0f} s CPU)", flush=True)
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
            "seconds": clock.wall, "cpu_seconds": clock.cpu,
            "statistics_seconds": statistics.wall, "statistics_cpu_seconds": statistics.cpu,
        })
        print(f"test, n {n}: {perplexity:.2f} vs static {test_static:.2f} "
              f"({100 * (1 - perplexity / test_static):.1f} % lower; {clock.cpu:.0f} s CPU, "
              f"statistics {statistics.cpu:.0f} s CPU)", flush=True)
    slice_2000 = corpus.valid[:2001]
    evaluator, _ = evaluator_for(model, corpus, 10, cache)
    picks = {}
    for name, ids in (("2000", slice_2000), ("3000", slice_3000)):
        scores = {eta: run(evaluator, ids, eta, 1e-4, 2e-3)[0] for eta in (5e-5, 1e-4)}
        picks[name] = {"perplexities": {f"{k:g}": v for k, v in scores.items()},
                       "best_learning_rate": min(scores, key=scores.get)}
        print(f"tuning on valid[:{name}] (n 10, ε 1e-4): {picks[name]}", flush=True)
    results["tuning_slices"] = picks
    results["machine"]["load_average_after"] = list(os.getloadavg())
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
