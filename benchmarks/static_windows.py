"""Static scoring in windows of many segments against a call per segment (issue 29).

`DynamicEvaluator.evaluate(..., adapt=False)` on a stateful `LanguageModel`
scores a call's segments as one window (one model call of up to 64 × n
tokens); before, each segment of n tokens was a call of its own inside the
compiled loop. This script times both paths in one process, interleaved
(the module switch `_dynamic_pass.WHOLE_WINDOW`), on each backend in its
own process, one after the other: the `backends.py` setting (2 × 256 units,
V = 10k, batch 1, segments of 5, 1,500 tokens of Zipf-like ids), for each
cell of `--cells`. It reports the median wall and CPU milliseconds per token
of `--repeats` passes of each path, their ratio, and the largest difference
between the two paths' token losses.

    python benchmarks/static_windows.py                  # all backends, quiet machine
    python benchmarks/static_windows.py --backends torch --cells rlstm --repeats 3

Measure on a quiet machine: the load average before and after each backend
is stored with the results (`benchmarks/results/static_windows.json`).
"""

import _harness
import per_backend  # benchmarks/per_backend.py, beside this script

CELLS = {
    "lstm": {"cell": "lstm"},
    "rlstm": {"cell": "rlstm"},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
}


def worker(args):
    import keras
    import numpy as np

    from keras_mogrifier import DynamicEvaluator
    from keras_mogrifier.evaluation import _dynamic_pass

    stream = per_backend.zipf_stream(args)
    rows = []
    for name in args.cells:
        model = per_backend.scoring_model(args, CELLS[name])
        evaluator = DynamicEvaluator(model, segment_length=5)

        def score(whole, **kwargs):
            _dynamic_pass.WHOLE_WINDOW = whole
            return evaluator.evaluate(stream, adapt=False, verbose=0, **kwargs)

        # Warm-up: builds every call length.
        losses = {whole: score(whole, return_token_losses=True)["token_losses"]
                  for whole in (False, True)}
        times = _harness.time_interleaved(
            {"segments": lambda: score(False), "windows": lambda: score(True)},
            rounds=args.repeats,
        )
        _dynamic_pass.WHOLE_WINDOW = True
        row = {"cell": name}
        for key, timing in times.items():
            row[f"{key}_ms_per_token"] = timing.per(args.tokens)
            row[f"{key}_cpu_ms_per_token"] = timing.cpu_per(args.tokens)
            row[f"{key}_ms_per_token_all"] = timing.all_per(args.tokens)
        row["windows_over_segments"] = row["windows_ms_per_token"] / row["segments_ms_per_token"]
        row["max_abs_loss_difference"] = float(np.max(np.abs(losses[True] - losses[False])))
        rows.append(row)
        print(f"{keras.backend.backend()} {name}: {row['segments_ms_per_token']:.3f} -> "
              f"{row['windows_ms_per_token']:.3f} ms/token", flush=True)
    return rows


def main():
    args = per_backend.parse_arguments(
        __doc__.splitlines()[0], CELLS, repeats=3, json_name="static_windows.json"
    )
    results = per_backend.run(__file__, args, worker)
    print("| cell | backend | a call per segment (ms/token) | windows (ms/token) | "
          "windows / segments | CPU ms/token (segments → windows) | max |Δ loss| |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    for cell, backend, row in per_backend.rows_by_cell(results, args.cells):
        print(f"| {cell} | {backend} | {row['segments_ms_per_token']:.3f} | "
              f"{row['windows_ms_per_token']:.3f} | "
              f"{row['windows_over_segments']:.2f} | "
              f"{row['segments_cpu_ms_per_token']:.3f} → "
              f"{row['windows_cpu_ms_per_token']:.3f} | "
              f"{row['max_abs_loss_difference']:.1e} |")
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
