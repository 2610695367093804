"""Step time and peak memory of multi-sample training, D = 1, 2, 4, 8.

A word-level `LanguageModel` at Penn Treebank size (vocabulary 10,000; by
default 2 × 256 LSTM units, tied embeddings, batch 16, 35 time steps) trains
with `IWAEDropoutLoss` and D dropout samples per sequence, with the logits
materialised (the default) and with the chunked softmax
(`softmax_chunk_size`). Every configuration runs in a fresh subprocess, so
that its peak resident memory (`resource.getrusage`'s `ru_maxrss`; the CPU
has no allocator statistics) is its own. Reported per configuration: the
median train-step time, its ratio to D × the D = 1 step of the same mode
(target: ≤ 1.1), the peak RSS, the peak RSS minus the RSS before the first
step (the training step's own memory: activations, gradients, XLA
buffers), and the naive size of the logits tensor B·D·T·V·4 bytes.

    python benchmarks/multisample.py                          # the table
    python benchmarks/multisample.py --samples 1 8 --chunk-size 512 --json out.json
    python benchmarks/multisample.py --no-jit-compile         # TF graph, no XLA
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _rss_mb():
    # Current resident set size, from /proc (Linux).
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB


def child(args):
    """One configuration: prints a JSON line with its measurements."""
    import keras
    import numpy as np

    from keras_mogrifier.losses import IWAEDropoutLoss
    from keras_mogrifier.metrics import Perplexity
    from keras_mogrifier.models import LanguageModel

    keras.utils.set_random_seed(0)
    model = LanguageModel(
        args.vocabulary,
        units=args.units,
        num_layers=args.layers,
        cell=args.cell,
        input_dropout=0.3,
        cell_output_dropout=0.2,
        state_dropout=0.2,
        output_dropout=0.3,
        samples=args.child_samples,
        softmax_chunk_size=args.child_chunk or None,
        batch_size=args.batch_size,
    )
    model.build((args.batch_size, None))
    model.compile(
        keras.optimizers.Adam(1e-3),
        IWAEDropoutLoss(),
        weighted_metrics=[Perplexity()],
        jit_compile=args.jit_compile,
    )
    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.bptt)
    x = rng.integers(0, args.vocabulary, size=shape).astype("int32")
    y = rng.integers(0, args.vocabulary, size=shape).astype("int32")
    rss_before = _rss_mb()
    start = time.perf_counter()
    model.train_on_batch(x, y)  # trace and compile
    compile_seconds = time.perf_counter() - start
    for _ in range(args.warmup):
        model.train_on_batch(x, y)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        logs = model.train_on_batch(x, y, return_dict=True)
        times.append(time.perf_counter() - start)
    assert np.isfinite(logs["loss"])
    print(
        json.dumps(
            {
                "samples": args.child_samples,
                "chunk_size": args.child_chunk or None,
                "step_seconds": statistics.median(times),
                "step_seconds_all": times,
                "compile_seconds": compile_seconds,
                "rss_before_mb": rss_before,
                "peak_rss_mb": _peak_rss_mb(),
                "naive_logits_mb": args.batch_size
                * args.child_samples
                * args.bptt
                * args.vocabulary
                * 4
                / 2**20,
            }
        )
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--chunk-size", type=int, default=512,
                        help="softmax_chunk_size of the chunked runs (tokens)")
    parser.add_argument("--modes", nargs="+", default=["logits", "chunked"],
                        choices=["logits", "chunked"])
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--cell", default="lstm")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--jit-compile", action=argparse.BooleanOptionalAction,
                        default=True, help="XLA, as the pipeline's presets")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--child-samples", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-chunk", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_child(argv, samples, chunk):
    command = [sys.executable, os.path.abspath(__file__), *argv,
               "--child-samples", str(samples), "--child-chunk", str(chunk)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"configuration D={samples} chunk={chunk} failed:\n{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child_samples:
        return child(args)
    passthrough = [a for a in argv if a != "--json"]
    if args.json:
        passthrough.remove(args.json)
    results = []
    for mode in args.modes:
        chunk = args.chunk_size if mode == "chunked" else 0
        for samples in args.samples:
            result = run_child(passthrough, samples, chunk)
            result["mode"] = mode
            results.append(result)
            print(f"done: {mode} D={samples} "
                  f"{result['step_seconds'] * 1e3:.0f} ms/step", flush=True)
    base = {r["mode"]: r["step_seconds"] for r in results if r["samples"] == 1}
    print(
        f"\nB={args.batch_size} T={args.bptt} V={args.vocabulary} "
        f"{args.layers}×{args.units} {args.cell}, "
        f"jit_compile={args.jit_compile}, chunk={args.chunk_size} tokens\n"
    )
    header = ("| mode | D | step (ms) | step / (D × D=1 step) | peak RSS (MB) "
              "| peak − RSS before training (MB) | naive logits B·D·T·V·4 (MB) |")
    print(header)
    print("|" + "---|" * 7)
    for r in results:
        ratio = (
            r["step_seconds"] / (r["samples"] * base[r["mode"]])
            if r["mode"] in base else float("nan")
        )
        r["ratio_to_D_times_single"] = ratio
        print(
            f"| {r['mode']} | {r['samples']} | {r['step_seconds'] * 1e3:.0f} "
            f"| {ratio:.2f} | {r['peak_rss_mb']:.0f} "
            f"| {r['peak_rss_mb'] - r['rss_before_mb']:.0f} "
            f"| {r['naive_logits_mb']:.0f} |"
        )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items()
                                  if not k.startswith("child")},
                       "results": results}, f, indent=2)
        print(f"\nwritten to {args.json}")
    return results


if __name__ == "__main__":
    main()
