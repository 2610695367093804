"""PyTorch's thread settings, quiet and under load (issue 29).

PyTorch's CPU build runs its operations and MKL's matrix products on an
OpenMP pool of `torch.get_num_threads()` threads (the physical cores by
default) and keeps a second pool of `torch.get_num_interop_threads()` for
TorchScript's `fork`, which eager Keras code never uses. This script times
the same work with PyTorch's thread count and with one thread
(`torch.set_num_threads`), alternating the two inside one process, round
after round, so that both see the same load; with `--passive` a second
process does the same with `OMP_WAIT_POLICY=PASSIVE` (idle OpenMP threads
sleep at once instead of spinning first; OpenMP reads it at start).

The work: a `LanguageModel` (RLSTM by default, 2 × 256, V = 10k, batch 32,
window 35, dropout 0.3, `IWAEDropoutLoss`, Adam) — a `fit` step; static and
dynamic evaluation (batch 1, segments of 5) per token; greedy generation per
token. `--load N` starts N busy processes (a pure Python spin each) beside
the workers. Each measurement keeps its wall time and its process CPU time
(all threads: a thread that spins while it waits counts).

    python benchmarks/torch_threads.py --json benchmarks/results/torch_threads.json
    python benchmarks/torch_threads.py --load 1 --json benchmarks/results/torch_threads_load1.json
"""

import json
import os
import statistics
import sys

import _harness

KEYS = ("train_ms", "static_ms_per_token", "dynamic_ms_per_token", "generate_ms_per_token")


def worker(args):
    import keras
    import torch

    from thread_policy import workload  # benchmarks/thread_policy.py: the same work

    assert keras.backend.backend() == "torch"
    default_threads = torch.get_num_threads()
    model, ids, work = workload(args, tokens=200_000, evaluator_batch=4)
    generator = model.with_options(batch_size=1, samples=1)
    prompt = ids[:10]
    new = args.generate_tokens
    work["generate_ms_per_token"] = (
        lambda: generator.generate(prompt, len(prompt) + new, stop_token_ids=None), new)
    for fn, _ in work.values():  # warm-up
        fn()
    rows = []
    for r in range(args.rounds):
        for threads in (default_threads, 1) if r % 2 == 0 else (1, default_threads):
            torch.set_num_threads(threads)
            row = {"round": r, "threads": threads,
                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                   "interop_threads": torch.get_num_interop_threads()}
            for key, (fn, count) in work.items():
                timing = _harness.time_call(fn, repeats=1)
                row[key], row[key.replace("_ms", "_cpu_ms")] = (
                    timing.per(count), timing.cpu_per(count))
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return {"default_threads": default_threads, "torch": torch.__version__, "rows": rows}


def run_worker(args, env, load):
    """`worker(args)` in a fresh PyTorch process with `env` and `load` busy
    processes beside it, and the load averages before and after."""
    before = _harness.load_average()
    result = _harness.run_in_backend(worker, args, backend="torch", env=env, busy=load)
    result["load_average_before"] = before
    result["load_average_after"] = _harness.load_average()
    return result


def main():
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--passive", action="store_true",
                        help="also a process with OMP_WAIT_POLICY=PASSIVE")
    parser.add_argument("--load", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cell", default="rlstm")
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=35)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--eval-tokens", type=int, default=100)
    parser.add_argument("--generate-tokens", type=int, default=10)
    args = parser.parse_args()
    # PyTorch's own default thread count, not the library's policy (one).
    own = {"KERAS_MOGRIFIER_TORCH_THREADS": "torch"}
    settings = {"default": own}
    if args.passive:
        settings["OMP_WAIT_POLICY=PASSIVE"] = dict(own, OMP_WAIT_POLICY="PASSIVE")
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    started = quiet["load_average"]
    results = {name: run_worker(args, env, args.load) for name, env in settings.items()}
    print(f"PyTorch threads, {args.cell} 2 × {args.units}, {args.load} busy process(es) "
          f"beside; median of {args.rounds} alternating rounds; load average at start "
          f"{started[0]:.1f}")
    print("| OpenMP | threads | train step (ms) | static (ms/token) | dynamic (ms/token) "
          "| generate (ms/token) | train CPU / wall |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    summary = {}
    for name, result in results.items():
        for threads in sorted({row["threads"] for row in result["rows"]}, reverse=True):
            mine = [row for row in result["rows"] if row["threads"] == threads]
            s = {k: statistics.median(row[k] for row in mine)
                 for k in KEYS + tuple(k.replace("_ms", "_cpu_ms") for k in KEYS)}
            summary[f"{name}, {threads} thread(s)"] = s
            print(f"| {name} | {threads} | {s['train_ms']:.0f} | "
                  f"{s['static_ms_per_token']:.2f} | {s['dynamic_ms_per_token']:.2f} | "
                  f"{s['generate_ms_per_token']:.2f} | "
                  f"{s['train_cpu_ms'] / s['train_ms']:.2f} |")
    if args.json:
        _harness.write_json(args.json, {
            "command": _harness.command_line(__file__), "machine": _harness.machine(),
            "quiet_machine": quiet, "load_average_start": started,
            "load_average_end": _harness.load_average(), "results": results,
            "summary": summary,
        })


if __name__ == "__main__":
    main()
