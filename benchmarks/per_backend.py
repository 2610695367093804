"""Runs a benchmark's worker once per Keras backend, each in its own process.

Shared by the benchmarks that time one thing on every backend
(`static_windows.py`, `evaluator_paths.py`): the script re-runs itself with
`--backends <one> --worker-output <file>` under `KERAS_BACKEND=<one>`, one
backend after the other, and the rows its worker wrote are gathered with the
load average before and after each (the figure that says whether the run
was quiet).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

BACKENDS = ("tensorflow", "jax", "torch")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_arguments(description, cells, repeats, json_name):
    """The options these benchmarks share: backends, cells, the model's size,
    the stream, the repeats, the JSON file (under `benchmarks/results/`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--cells", nargs="+", default=list(cells), choices=list(cells))
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--json", default=os.path.join(RESULTS, json_name))
    parser.add_argument("--worker-output", help=argparse.SUPPRESS)
    return parser.parse_args()


def worker_or_each_backend(script, args, worker):
    """In a worker process (`--worker-output`), writes `worker(args)` and
    returns `None`; otherwise runs the workers (`run_each_backend`)."""
    if args.worker_output:
        with open(args.worker_output, "w") as f:
            json.dump(worker(args), f)
        return None
    return run_each_backend(script, args.backends)


def run_each_backend(script, backends):
    """`{"command", "backends": {backend: {load averages, "rows"}}}`."""
    results = {"command": "python " + " ".join(sys.argv), "backends": {}}
    for backend in backends:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            before = os.getloadavg()
            subprocess.run(
                [sys.executable, os.path.abspath(script), *sys.argv[1:],
                 "--backends", backend, "--worker-output", out.name],
                env={**os.environ, "KERAS_BACKEND": backend}, check=True,
            )
            with open(out.name) as f:
                rows = json.load(f)
        results["backends"][backend] = {
            "load_average_before": before, "load_average_after": os.getloadavg(),
            "rows": rows,
        }
    return results


def zipf_stream(args):
    """The stream these benchmarks score: `args.tokens + 1` Zipf ids, seed 0."""
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.zipf(1.2, size=args.tokens + 1) % args.vocabulary).astype("int32")


def scoring_model(args, options):
    """A built 2-layer `LanguageModel` for batch 1 (seed 0), `options` its cell's."""
    import keras

    from keras_mogrifier import LanguageModel

    keras.utils.set_random_seed(0)
    model = LanguageModel(
        args.vocabulary, units=args.units, num_layers=2, batch_size=1, **options
    )
    model.build((1, 5))
    return model


def rows_by_cell(results, cells):
    """`(cell, backend, row)` in table order: cells, then backends."""
    for cell in cells:
        for backend, result in results["backends"].items():
            for row in result["rows"]:
                if row["cell"] == cell:
                    yield cell, backend, row


def write_json(results, path):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {path}")
