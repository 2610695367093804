"""TensorFlow's XLA evaluator and PyTorch's in-place update, each against its former path (issue 29).

Two changes to the evaluator's compiled steps, each timed against the path
it replaced, in one process per backend, interleaved:

- TensorFlow: `jit_compile="auto"` now compiles the evaluator's loops with
  XLA on CPU too (`backend.tensorflow.default_jit_compile`); before, only
  with a GPU. Former path: `DynamicEvaluator(..., jit_compile=False)`.
- PyTorch: the update rule runs as two fused in-place operations per
  adapted variable (`backend.torch.in_place_update`); before, the
  `keras.ops` rule ran eagerly, about ten passes over every weight and a
  copy. Former path: the same evaluator with `in_place_update` switched off.

JAX, unchanged, is timed beside them as the reference. The setting is
`backends.py`'s: a 2 × 256 `LanguageModel`, V = 10k, batch 1, segments of
5, 1,500 tokens of Zipf-like ids, the default rule (`rms_rms_prior`) with
gradient statistics from the same stream. Reported: median wall and CPU
milliseconds per token of static (`adapt=False`) and dynamic evaluation,
former and new path, and the largest difference of their token losses.

    python benchmarks/evaluator_paths.py        # quiet machine; ~6 minutes
    python benchmarks/evaluator_paths.py --backends torch --cells rlstm --repeats 1

Measure on a quiet machine: the load average before and after each backend
is stored with the results (`benchmarks/results/evaluator_paths.json`).
"""

import _harness
import per_backend  # benchmarks/per_backend.py, beside this script

CELLS = {
    "rlstm": {"cell": "rlstm"},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
}


def worker(args):
    import keras
    import numpy as np

    from keras_mogrifier import DynamicEvaluator

    backend = keras.backend.backend()
    stream = per_backend.zipf_stream(args)
    rows = []
    for name in args.cells:
        model = per_backend.scoring_model(args, CELLS[name])
        evaluators = {}
        for path in ("former", "new"):
            jit = False if (backend == "tensorflow" and path == "former") else "auto"
            evaluators[path] = DynamicEvaluator(model, segment_length=5, jit_compile=jit)
            evaluators[path].collect_gradient_statistics(stream, batch_size=1)

        def run(path, adapt, **kwargs):
            if backend != "torch" or path == "new":
                return evaluators[path].evaluate(stream, adapt=adapt, verbose=0, **kwargs)
            from keras_mogrifier.backend import torch as torch_backend

            original = torch_backend.in_place_update
            torch_backend.in_place_update = lambda update_rule: None
            try:  # the former path: the `keras.ops` rule, copied in
                return evaluators[path].evaluate(stream, adapt=adapt, verbose=0, **kwargs)
            finally:
                torch_backend.in_place_update = original

        losses = {}
        for path in ("former", "new"):  # warm-up: builds every call length
            for adapt in (False, True):
                losses[path, adapt] = run(path, adapt, return_token_losses=True)["token_losses"]
        times = _harness.time_interleaved(
            {(path, adapt): (lambda p=path, a=adapt: run(p, a))
             for adapt in (False, True) for path in ("former", "new")},
            rounds=args.repeats,
        )
        row = {"cell": name}
        for path in ("former", "new"):
            for adapt, kind in ((False, "static"), (True, "dynamic")):
                row[f"{path}_{kind}_ms_per_token"] = times[path, adapt].per(args.tokens)
                row[f"{path}_{kind}_cpu_ms_per_token"] = times[path, adapt].cpu_per(args.tokens)
            row[f"{path}_dynamic_over_static"] = (
                row[f"{path}_dynamic_ms_per_token"] / row[f"{path}_static_ms_per_token"]
            )
        for adapt, kind in ((False, "static"), (True, "dynamic")):
            row[f"{kind}_max_abs_loss_difference"] = float(
                np.max(np.abs(losses["former", adapt] - losses["new", adapt]))
            )
        rows.append(row)
        print(f"{backend} {name}: static {row['former_static_ms_per_token']:.3f} -> "
              f"{row['new_static_ms_per_token']:.3f}, dynamic "
              f"{row['former_dynamic_ms_per_token']:.3f} -> "
              f"{row['new_dynamic_ms_per_token']:.3f} ms/token", flush=True)
    return rows


def main():
    args = per_backend.parse_arguments(
        __doc__.splitlines()[0], CELLS, repeats=2, json_name="evaluator_paths.json"
    )
    results = per_backend.run(__file__, args, worker)
    print("| cell | backend | static, former → new (ms/token) | dynamic, former → new "
          "(ms/token) | dynamic / static, former → new | max |Δ loss| static, dynamic |")
    print("| --- | --- | --- | --- | --- | --- |")
    for cell, backend, row in per_backend.rows_by_cell(results, args.cells):
        print(f"| {cell} | {backend} | {row['former_static_ms_per_token']:.3f} → "
              f"{row['new_static_ms_per_token']:.3f} | "
              f"{row['former_dynamic_ms_per_token']:.2f} → "
              f"{row['new_dynamic_ms_per_token']:.2f} | "
              f"{row['former_dynamic_over_static']:.1f} → "
              f"{row['new_dynamic_over_static']:.1f} | "
              f"{row['static_max_abs_loss_difference']:.1e}, "
              f"{row['dynamic_max_abs_loss_difference']:.1e} |")
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
