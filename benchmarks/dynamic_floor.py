"""Dynamic evaluation against its floor on every backend (issue 43).

The floor of one segment of dynamic evaluation is what the update must do
at the least: move its bytes through memory — for every adapted weight,
read the weight, θ_g, the statistics (RMS) and the gradient, write the
weight: issue 43 counts 6 × 4 bytes per adapted float32 weight — at the
machine's measured memory bandwidth, plus three times the backend's own
static (score-only) time for the segment (forward, backward, and the
forward the update's objective repeats). Goal: ≤ 1.3× the floor on every
backend.

In one fresh process per backend, for each cell (`first_call.py`'s: the
RLSTM and the Mogrifier RLSTM, 2 × 256, V = 10k, batch 1, segments of 5,
1,500 Zipf-like tokens, the default RMS rule with statistics from the
stream): the copy bandwidth (NumPy copying a 256 MiB float32 array, the
best of 5; bytes read plus written per second, in that process), the warm
static and dynamic times of the whole stream (median of `--repeats` after a
warm-up), per segment; the adapted parameters; the floor and the ratio; the
backend's thread settings (`keras_mogrifier.backend.thread_settings()`).

On PyTorch the same dynamic evaluation is also run by a bare loop with
nothing of Keras around it (`bare_adaptation`: `torch_eager_floor.py`'s
bare forward over the same weights, `torch.autograd.grad`, and the
package's own in-place update) — what eager PyTorch with autograd does at
the least (the package, with its backward pass written out since
2026-11-29, is below it: `backend.torch.adaptation_gradients`); their
token losses must agree to float rounding, and the two are timed
interleaved.

    python benchmarks/dynamic_floor.py      # quiet machine; ~4 minutes
"""

import _harness
import per_backend  # benchmarks/per_backend.py, beside this script
from first_call import CELLS  # benchmarks/first_call.py: the same two cells

BYTES_PER_WEIGHT = 6 * 4  # issue 43: 6 float32 accesses per adapted weight
COPY_MIB = 256


def copy_bandwidth(mib=COPY_MIB, repeats=5):
    """Bytes read plus written per second by a NumPy copy of `mib` MiB (best of `repeats`)."""
    import numpy as np

    source = np.ones(mib * 2**20 // 4, "float32")
    target = np.empty_like(source)
    timing = _harness.time_call(lambda: np.copyto(target, source), repeats=repeats, warmup=1)
    return 2 * source.nbytes / timing.best


def bare_adaptation(model, evaluator, stream):
    """Dynamic evaluation of `stream` by a bare eager PyTorch loop.

    Per segment of `evaluator.segment_length` tokens, batch 1, the recurrent
    state carried from the segment before: the forward pass over the
    model's own weights with autograd recording (`torch_eager_floor`'s bare
    parts: lookup, the package's fused cell step per token and layer,
    residual sums, the tied output product, `cross_entropy`), the
    gradient of the segment's mean loss (the evaluator's objective) for every
    adapted variable
    (`torch.autograd.grad`), and the package's in-place update
    (`backend.torch.in_place_update`, with the evaluator's own RMS and
    hyperparameters). The weights are restored to θ_g afterwards. Returns
    the token losses (each scored before its segment's update).
    """
    import torch
    import torch.nn.functional as F

    from keras_mogrifier.backend import torch as torch_backend
    from torch_eager_floor import bare_parts, run_layers

    variables = evaluator.adapted_variables()
    rms, hyperparameters = evaluator._update_inputs(variables)
    parameters = [v.value for v in variables]
    theta_g = [p.detach().clone() for p in parameters]
    ids = torch.as_tensor(stream[:-1], dtype=torch.long)
    targets = torch.as_tensor(stream[1:], dtype=torch.long)
    units = model.backbone.units
    states = [[torch.zeros(1, units), torch.zeros(1, units)]
              for _ in model.backbone.recurrent_layers]
    step = torch_backend.in_place_update(evaluator.update_rule)(
        variables, theta_g, rms, hyperparameters)
    n = evaluator.segment_length
    losses = []
    try:
        for start in range(0, len(ids), n):
            for p in parameters:
                p.requires_grad_(True)
            with torch.enable_grad():
                table, _, bias, layers = bare_parts(model)
                states = [[h.detach(), c.detach()] for h, c in states]
                x = run_layers(layers, table[ids[start:start + n]], states)
                # The tied product in the order the package's PyTorch path
                # takes for a few rows (`backend.torch.tied_logits`).
                logits = torch.mm(table, x.t()).t() + bias
                loss = F.cross_entropy(logits, targets[start:start + n], reduction="none")
                gradients = torch.autograd.grad(loss.mean(), parameters, allow_unused=True)
            for p in parameters:
                p.requires_grad_(False)
            step([torch.zeros_like(p) if g is None else g
                  for p, g in zip(parameters, gradients)])
            losses.append(loss.detach())
    finally:
        with torch.no_grad():
            for p, t in zip(parameters, theta_g):
                p.requires_grad_(False)
                p.copy_(t)
    return torch.cat(losses).numpy()


def worker(args):
    import keras
    import numpy as np

    from keras_mogrifier import DynamicEvaluator
    from keras_mogrifier import backend as km_backend

    backend = keras.backend.backend()
    threads = km_backend.thread_settings()
    bandwidth = copy_bandwidth()
    stream = per_backend.zipf_stream(args)
    segments = -(-(len(stream) - 1) // 5)
    rows = []
    for name in args.cells:
        model = per_backend.scoring_model(args, CELLS[name])
        evaluator = DynamicEvaluator(model, segment_length=5)
        evaluator.collect_gradient_statistics(stream, batch_size=1)
        adapted = int(sum(np.prod(v.shape) for v in evaluator.adapted_variables()))
        times = {}
        for adapt, kind in ((False, "static"), (True, "dynamic")):
            timing = _harness.time_call(
                lambda a=adapt: evaluator.evaluate(stream, adapt=a, verbose=0),
                repeats=args.repeats, warmup=1,
            )
            times[kind] = timing.median / segments
        bare = {}
        if backend == "torch":
            def package():
                return evaluator.evaluate(stream, verbose=0, return_token_losses=True)
            losses = np.ravel(package()["token_losses"])
            bare_losses = bare_adaptation(model, evaluator, stream)
            timings = _harness.time_interleaved(
                {"package": package, "bare": lambda: bare_adaptation(model, evaluator, stream)},
                rounds=args.repeats)
            bare = {
                "bare_dynamic_ms_per_segment": 1000 * timings["bare"].median / segments,
                "package_dynamic_ms_per_segment_interleaved":
                    1000 * timings["package"].median / segments,
                "max_abs_loss_difference_bare": float(np.max(np.abs(losses - bare_losses))),
            }
        memory = BYTES_PER_WEIGHT * adapted / bandwidth
        floor = memory + 3 * times["static"]
        row = {
            "cell": name, "adapted_parameters": adapted, "segments": segments,
            "copy_bandwidth_gb_per_s": bandwidth / 1e9,
            "static_ms_per_segment": 1000 * times["static"],
            "dynamic_ms_per_segment": 1000 * times["dynamic"],
            "memory_floor_ms_per_segment": 1000 * memory,
            "floor_ms_per_segment": 1000 * floor,
            "ratio_to_floor": times["dynamic"] / floor,
            "threads": threads,
        }
        if bare:
            row.update(bare)
            row["bare_ratio_to_floor"] = bare["bare_dynamic_ms_per_segment"] / (1000 * floor)
            row["package_to_bare"] = (bare["package_dynamic_ms_per_segment_interleaved"]
                                      / bare["bare_dynamic_ms_per_segment"])
            print(f"{backend} {name}: bare eager loop {row['bare_dynamic_ms_per_segment']:.3f} "
                  f"ms/segment ({row['bare_ratio_to_floor']:.2f}x the floor), package / bare "
                  f"{row['package_to_bare']:.2f} (interleaved), losses differ by at most "
                  f"{row['max_abs_loss_difference_bare']:.2g}", flush=True)
        rows.append(row)
        print(f"{backend} {name}: dynamic {row['dynamic_ms_per_segment']:.3f} ms/segment, "
              f"floor {row['floor_ms_per_segment']:.3f} (memory "
              f"{row['memory_floor_ms_per_segment']:.3f} + 3 x static "
              f"{row['static_ms_per_segment']:.3f}): {row['ratio_to_floor']:.2f}x "
              f"[{threads['description']}]", flush=True)
    return rows


def main():
    args = per_backend.parse_arguments(
        __doc__.splitlines()[0], CELLS, repeats=3, json_name="dynamic_floor.json"
    )
    results = per_backend.run(__file__, args, worker)
    print("| cell | backend | adapted parameters | copy bandwidth (GB/s) | static (ms/segment) "
          "| memory floor (ms/segment) | floor | dynamic (ms/segment) | dynamic / floor |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for cell, backend, row in per_backend.rows_by_cell(results, args.cells):
        print(f"| {cell} | {backend} | {row['adapted_parameters']:,} | "
              f"{row['copy_bandwidth_gb_per_s']:.1f} | {row['static_ms_per_segment']:.3f} | "
              f"{row['memory_floor_ms_per_segment']:.3f} | {row['floor_ms_per_segment']:.3f} | "
              f"{row['dynamic_ms_per_segment']:.3f} | {row['ratio_to_floor']:.2f} |")
    torch_rows = [row for cell, backend, row in per_backend.rows_by_cell(results, args.cells)
                  if backend == "torch"]
    if torch_rows:
        print("\n| cell | PyTorch package (ms/segment) | bare eager loop | package / bare "
              "| bare / floor | largest loss difference |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for row in torch_rows:
            print(f"| {row['cell']} | {row['package_dynamic_ms_per_segment_interleaved']:.3f} | "
                  f"{row['bare_dynamic_ms_per_segment']:.3f} | {row['package_to_bare']:.2f} | "
                  f"{row['bare_ratio_to_floor']:.2f} | {row['max_abs_loss_difference_bare']:.2g} |")
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
