"""Runs a benchmark's worker once per Keras backend, each in its own process.

Shared by the benchmarks that time one thing on every backend
(`static_windows.py`, `evaluator_paths.py`): the script re-runs itself with
`--backends <one> --worker-output <file>` under `KERAS_BACKEND=<one>`, one
backend after the other, and the rows its worker wrote are gathered with the
load average before and after each (the figure that says whether the run
was quiet).
"""

import json
import os
import subprocess
import sys
import tempfile


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
