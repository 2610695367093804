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
warm-up), per segment; the adapted parameters; the floor and the ratio.

    python benchmarks/dynamic_floor.py      # quiet machine; ~3 minutes
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


def worker(args):
    import keras
    import numpy as np

    from keras_mogrifier import DynamicEvaluator

    backend = keras.backend.backend()
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
        }
        rows.append(row)
        print(f"{backend} {name}: dynamic {row['dynamic_ms_per_segment']:.3f} ms/segment, "
              f"floor {row['floor_ms_per_segment']:.3f} (memory "
              f"{row['memory_floor_ms_per_segment']:.3f} + 3 x static "
              f"{row['static_ms_per_segment']:.3f}): {row['ratio_to_floor']:.2f}x", flush=True)
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
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
