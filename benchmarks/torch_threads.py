"""PyTorch's thread settings, quiet and under load (issue 29).

PyTorch's CPU build runs its operations and MKL's matrix products on an
OpenMP pool of `torch.get_num_threads()` threads (the physical cores by
default) and keeps a second pool of `torch.get_num_interop_threads()` for
TorchScript's `fork`, which eager Keras code never uses. This script times
the same work under several settings, each in its own process (OpenMP reads
its environment once, at start), the settings interleaved round after round
so that they share the machine's load:

- `default`: what PyTorch chooses;
- `threads=1`: `torch.set_num_threads(1)` (one OpenMP thread);
- `passive`: `OMP_WAIT_POLICY=PASSIVE` (idle OpenMP threads sleep at once
  instead of spinning for a while first), PyTorch's thread count;
- `interop=1`: `torch.set_num_interop_threads(1)` (not run by default:
  nothing in eager Keras code runs on that pool).

The work: a `LanguageModel` (RLSTM by default, 2 × 256, V = 10k, batch 32,
window 35, dropout 0.3, `IWAEDropoutLoss`, Adam) — a `fit` step; static and
dynamic evaluation (batch 1, segments of 5) per token; greedy generation per
token. `--load N` starts N busy processes (a pure Python spin each) beside
every worker. Each worker records its wall time and its process CPU time
(all threads: a thread that spins while waiting counts).

    python benchmarks/torch_threads.py --json benchmarks/results/torch_threads.json
    python benchmarks/torch_threads.py --load 1 --json benchmarks/results/torch_threads_load1.json
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "default": {},
    "threads=1": {"threads": 1},
    "passive": {"env": {"OMP_WAIT_POLICY": "PASSIVE"}},
    "interop=1": {"interop": 1},
}


def _timed(fn, repeats):
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def worker(args, variant):
    import torch

    setting = VARIANTS[variant]
    if "interop" in setting:
        torch.set_num_interop_threads(setting["interop"])
    if "threads" in setting:
        torch.set_num_threads(setting["threads"])
    import keras
    import numpy as np

    from keras_mogrifier import IWAEDropoutLoss
    from keras_mogrifier import LanguageModel
    from keras_mogrifier.data import StreamDataset
    from keras_mogrifier.evaluation import DynamicEvaluator

    assert keras.backend.backend() == "torch"
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.2, size=200_000) % args.vocabulary).astype("int32")
    model = LanguageModel(
        args.vocabulary, units=args.units, num_layers=2, batch_size=args.batch,
        input_dropout=0.3, state_dropout=0.3, output_dropout=0.3, cell=args.cell,
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=IWAEDropoutLoss())
    data = StreamDataset(ids, args.batch, args.window)
    row = {"variant": variant, "torch_threads": torch.get_num_threads(),
           "interop_threads": torch.get_num_interop_threads(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    steps = args.train_steps
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
    wall, cpu = _timed(lambda: model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0),
                       args.repeats)
    row["train_ms"], row["train_cpu_ms"] = 1000 * wall / steps, 1000 * cpu / steps

    evaluator = DynamicEvaluator(model.with_options(batch_size=4, samples=1), segment_length=5)
    evaluator.collect_gradient_statistics(ids, batch_size=4, steps=2)
    stream = ids[-(args.eval_tokens + 1):]
    tokens = len(stream) - 1
    evaluator.evaluate(stream[:21], adapt=False, verbose=0)
    evaluator.evaluate(stream[:21], verbose=0)
    wall, cpu = _timed(lambda: evaluator.evaluate(stream, adapt=False, verbose=0), args.repeats)
    row["static_ms_per_token"], row["static_cpu_ms_per_token"] = (
        1000 * wall / tokens, 1000 * cpu / tokens)
    wall, cpu = _timed(lambda: evaluator.evaluate(stream, verbose=0), args.repeats)
    row["dynamic_ms_per_token"], row["dynamic_cpu_ms_per_token"] = (
        1000 * wall / tokens, 1000 * cpu / tokens)
    generator = model.with_options(batch_size=1, samples=1)
    prompt = ids[:10]
    generator.generate(prompt, 13, stop_token_ids=None)
    new = args.generate_tokens
    wall, cpu = _timed(
        lambda: generator.generate(prompt, len(prompt) + new, stop_token_ids=None),
        args.repeats)
    row["generate_ms_per_token"], row["generate_cpu_ms_per_token"] = (
        1000 * wall / new, 1000 * cpu / new)
    return row


def _load_average():
    return list(os.getloadavg())


def run_variant(variant, argv, load):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    env = dict(os.environ, KERAS_BACKEND="torch", **VARIANTS[variant].get("env", {}))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    before = _load_average()
    try:
        subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--worker", variant,
             "--worker-output", path] + argv,
            env=env, check=True,
        )
    finally:
        for process in busy:
            process.kill()
            process.wait()
    with open(path) as f:
        row = json.load(f)
    os.remove(path)
    row["load_average_before"] = before
    return row


KEYS = ("train_ms", "static_ms_per_token", "dynamic_ms_per_token", "generate_ms_per_token")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["default", "threads=1", "passive"],
                        choices=list(VARIANTS))
    parser.add_argument("--load", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cell", default="rlstm")
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=35)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eval-tokens", type=int, default=200)
    parser.add_argument("--generate-tokens", type=int, default=10)
    parser.add_argument("--json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        row = worker(args, args.worker)
        with open(args.worker_output, "w") as f:
            json.dump(row, f)
        return
    argv = [a for a in sys.argv[1:] if a != "--json" and not a.endswith(".json")]
    rows = []
    started = _load_average()
    for r in range(args.rounds):
        for variant in args.variants:
            row = run_variant(variant, argv, args.load)
            row["round"] = r
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    summary = {}
    for variant in args.variants:
        mine = [row for row in rows if row["variant"] == variant]
        summary[variant] = {
            k: statistics.median(row[k] for row in mine)
            for k in KEYS + tuple(k.replace("_ms", "_cpu_ms") for k in KEYS)
        }
    print(f"PyTorch thread settings, {args.cell} 2 × {args.units}, {args.load} busy "
          f"process(es) beside; median over {args.rounds} rounds; load average at start "
          f"{started[0]:.1f}")
    print("| setting | train step (ms) | static (ms/token) | dynamic (ms/token) "
          "| generate (ms/token) | train CPU / wall |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for variant, s in summary.items():
        print(f"| {variant} | {s['train_ms']:.0f} | {s['static_ms_per_token']:.2f} | "
              f"{s['dynamic_ms_per_token']:.2f} | {s['generate_ms_per_token']:.2f} | "
              f"{s['train_cpu_ms'] / s['train_ms']:.2f} |")
    if args.json:
        import torch

        with open(args.json, "w") as f:
            json.dump({
                "command": "python benchmarks/torch_threads.py " + " ".join(sys.argv[1:]),
                "machine": {"cpus": os.cpu_count(),
                            "cpus_usable": len(os.sched_getaffinity(0)),
                            "platform": platform.platform(),
                            "torch": torch.__version__},
                "load_average_start": started, "load_average_end": _load_average(),
                "rows": rows, "summary": summary,
            }, f, indent=2)


if __name__ == "__main__":
    main()
