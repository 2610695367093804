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

import _harness

_harness.environment()


def child(args, samples, chunk):
    """One configuration's measurements, in a process of its own."""
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
        samples=samples,
        softmax_chunk_size=chunk or None,
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
    rss_before = _harness.memory_mib()
    compiled = _harness.time_call(lambda: model.train_on_batch(x, y), repeats=1)
    logs = {}
    step = _harness.time_call(
        lambda: logs.update(model.train_on_batch(x, y, return_dict=True)), args.steps,
        warmup=args.warmup,
    )
    assert np.isfinite(logs["loss"])
    return {
        "samples": samples,
        "chunk_size": chunk or None,
        "step_seconds": step.median,
        "step_seconds_all": step.wall,
        "compile_seconds": compiled.median,
        "rss_before_mb": rss_before,
        "peak_rss_mb": _harness.peak_memory_mib(),
        "naive_logits_mb": args.batch_size * samples * args.bptt * args.vocabulary * 4 / 2**20,
    }


def parse_args(argv=None):
    parser = _harness.argument_parser(
        __doc__, quiet=True, formatter_class=argparse.ArgumentDefaultsHelpFormatter
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
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    results = []
    for mode in args.modes:
        chunk = args.chunk_size if mode == "chunked" else 0
        for samples in args.samples:
            try:
                result = _harness.run_in_backend(child, args, samples, chunk,
                                                 capture_output=True)
            except _harness.WorkerError as error:
                raise RuntimeError(
                    f"configuration D={samples} chunk={chunk} failed:\n{error.output[-3000:]}"
                ) from None
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
        _harness.write_json(args.json, {"config": vars(args), "quiet_machine": quiet,
                                        "results": results})
        print(f"\nwritten to {args.json}")
    return results


if __name__ == "__main__":
    main()
