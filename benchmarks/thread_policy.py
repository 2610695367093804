"""Every backend quiet and beside busy processes: the thread policy (issue 43).

On a machine whose cores other processes also use, a backend whose threads
spin while they wait for each other (PyTorch's OpenMP pool, by default)
slows by far more than the share of the CPU it loses. This script times the
same work on each backend in a fresh process, quiet and then with one and
with two busy processes beside it (a pure Python spin each, one core each),
and prints each backend's slowdown against its own quiet time. PyTorch runs
twice: with the library's thread policy (`keras_mogrifier.backend`,
`KERAS_MOGRIFIER_TORCH_THREADS` unset) and with PyTorch's own default
(`KERAS_MOGRIFIER_TORCH_THREADS=torch`); TensorFlow and JAX run with their
own defaults and with fewer threads: TensorFlow with one intra-op thread
(`TF_NUM_INTRAOP_THREADS=1`; its inter-op threads still run ops beside it —
two threads did 64 % and 35 % of a recurrent step's CPU time so, 2026-12-02),
JAX with one thread, pinned to one core (`_harness.one_core_environment()`: XLA sizes its
pool to the process's cores). Until 2026-12-02 the JAX row set `XLA_FLAGS`
`--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`
instead, which left XLA's pool as it was: that row of
`results/thread_policy.json` is a second run of JAX's default.

The work, per process: a `LanguageModel` (RLSTM by default, 2 × 256,
V = 10k, dropout 0.3, `IWAEDropoutLoss`, Adam) — a `fit` step at batch 32 ×
35 (ms), static and dynamic evaluation at batch 1, segments of 5 (ms per
token); compiled and warmed up first, then the median of `--rounds`. Each
time also keeps the process's CPU time (all its threads), so a policy whose
threads spin shows it.

The goal (issue 43): with one or two busy processes beside it on 2 cores,
no backend slower than 2.5× its quiet time. With two busy processes, a
process that gets its fair share of 2 cores has 2/3 of a core per thread
when it runs one thread, and 1/2 per thread when it runs two: 1.5× and 2×
its quiet time.

    python benchmarks/thread_policy.py --json benchmarks/results/thread_policy.json

Run it on a quiet machine (it checks): the busy processes are the only load
it means to measure.
"""

import os
import statistics
import sys

import _harness

KEYS = ("train_ms", "static_ms_per_token", "dynamic_ms_per_token")
# (label, backend, environment): what runs, each in its own processes.
CONFIGURATIONS = (
    ("tensorflow", "tensorflow", {}),
    ("tensorflow (1 intra-op thread)", "tensorflow", {"TF_NUM_INTRAOP_THREADS": "1"}),
    ("jax", "jax", {}),
    ("jax (1 core)", "jax", _harness.one_core_environment()),
    ("torch (library policy)", "torch", {}),
    ("torch (PyTorch's default)", "torch", {"KERAS_MOGRIFIER_TORCH_THREADS": "torch"}),
)


def workload(args, tokens=100_000, evaluator_batch=1):
    """The timed work of a worker process: `(model, ids, work)`, `work`
    mapping each key of `KEYS` to `(function, count)` — a `fit` of
    `args.train_steps` steps, static and dynamic evaluation of the last
    `args.eval_tokens` tokens (per token) — on a `LanguageModel` of
    `args.cell`, 2 × `args.units`, over `tokens` Zipf-like ids.
    (`torch_threads.py` times the same work.)"""
    import keras
    import numpy as np

    from keras_mogrifier import IWAEDropoutLoss
    from keras_mogrifier import LanguageModel
    from keras_mogrifier.data import StreamDataset
    from keras_mogrifier.evaluation import DynamicEvaluator

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.2, size=tokens) % args.vocabulary).astype("int32")
    model = LanguageModel(
        args.vocabulary, units=args.units, num_layers=2, batch_size=args.batch,
        input_dropout=0.3, state_dropout=0.3, output_dropout=0.3, cell=args.cell,
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=IWAEDropoutLoss())
    data = StreamDataset(ids, args.batch, args.window)
    evaluator = DynamicEvaluator(
        model.with_options(batch_size=evaluator_batch, samples=1), segment_length=5)
    evaluator.collect_gradient_statistics(ids, batch_size=evaluator_batch, steps=2)
    stream = ids[-(args.eval_tokens + 1):]
    count = len(stream) - 1
    work = {
        "train_ms": (lambda: model.fit(data, epochs=1, steps_per_epoch=args.train_steps,
                                       verbose=0), args.train_steps),
        "static_ms_per_token": (
            lambda: evaluator.evaluate(stream, adapt=False, verbose=0), count),
        "dynamic_ms_per_token": (lambda: evaluator.evaluate(stream, verbose=0), count),
    }
    return model, ids, work


def worker(args):
    from keras_mogrifier import backend as km_backend

    _, _, work = workload(args)
    for function, _ in work.values():  # compiled and warmed up
        function()
    rows = {key: [] for key in KEYS}
    cpu = {key: [] for key in KEYS}
    for _ in range(args.rounds):
        for key, (function, count) in work.items():
            timing = _harness.time_call(function, repeats=1)
            rows[key].append(timing.per(count))
            cpu[key].append(timing.cpu_per(count))
    return {
        "threads": km_backend.thread_settings(),
        "median": {key: statistics.median(values) for key, values in rows.items()},
        "cpu_median": {key: statistics.median(values) for key, values in cpu.items()},
        "rows": rows,
    }


def main():
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2],
                        help="busy processes beside the worker, one run each")
    parser.add_argument("--only", nargs="+", default=None,
                        help="run only these configurations (labels' first word or the label)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cell", default="rlstm")
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=35)
    parser.add_argument("--train-steps", type=int, default=4)
    parser.add_argument("--eval-tokens", type=int, default=200)
    args = parser.parse_args()
    if 0 not in args.loads:
        parser.error("--loads must include 0: the slowdowns are against the quiet time")
    configurations = [c for c in CONFIGURATIONS
                      if args.only is None or c[0] in args.only or c[1] in args.only]
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    results = {}
    for label, backend, env in configurations:
        results[label] = {}
        for load in args.loads:
            before = _harness.load_average()
            result = _harness.run_in_backend(worker, args, backend=backend, env=env,
                                             busy=load)
            result.update(load_average_before=before, load_average_after=_harness.load_average())
            results[label][str(load)] = result
            print(f"{label}, {load} busy: " + ", ".join(
                f"{k} {v:.3g}" for k, v in result["median"].items()), file=sys.stderr, flush=True)
    summary = {}
    print(f"{args.cell} 2 × {args.units}, V = {args.vocabulary}; median of {args.rounds} "
          f"rounds; slowdown = time with N busy processes / quiet time")
    print("| backend | threads | busy | train step (ms) | static (ms/token) | dynamic (ms/token) "
          "| slowdown train / static / dynamic | train CPU / wall |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for label, by_load in results.items():
        quiet_row = by_load["0"]["median"]
        summary[label] = {}
        for load, result in by_load.items():
            m = result["median"]
            slowdown = {k: m[k] / quiet_row[k] for k in KEYS}
            summary[label][load] = {"median": m, "slowdown": slowdown,
                                    "max_slowdown": max(slowdown.values())}
            print(f"| {label} | {result['threads']['description']} | {load} | "
                  f"{m['train_ms']:.0f} | {m['static_ms_per_token']:.3f} | "
                  f"{m['dynamic_ms_per_token']:.3f} | "
                  + " / ".join(f"{slowdown[k]:.2f}" for k in KEYS) + " | "
                  f"{result['cpu_median']['train_ms'] / m['train_ms']:.2f} |")
    if args.json:
        _harness.write_json(args.json, {
            "command": _harness.command_line(__file__), "machine": _harness.machine(),
            "versions": _harness.versions(), "quiet_machine": quiet,
            "load_average_end": _harness.load_average(), "settings": vars(args),
            "results": results, "summary": summary,
        })


if __name__ == "__main__":
    main()
