"""Peak memory and tokens/s of the output layer and loss, MoS vs one softmax.

What is measured is a training step of the output layer alone: from softmax
features `(batch, time, units)` (random), the mixture (K components; K = 0 is
today's single softmax), the tied output layer, and the per-token loss, forward
and backward (`train_on_batch` of a small model around a `LanguageModel`'s
output path: `LanguageModel._logits` + `IWAEDropoutLoss`, or, chunked,
`LanguageModel.target_log_probabilities`, which never holds a (tokens, vocab)
block per component). Configurations: K = 0, 2, 4, each with and without
chunking. Any backend: set `KERAS_BACKEND`.

Each configuration runs in its own process (as `benchmarks/cells.py
--memory`): the peak resident memory (`ru_maxrss`) of a process that builds
the model and runs a forward pass, and of one that also runs the training
steps; the difference is what the step costs. tokens/s is measured in the
training process after one warm-up step. Ratios are against K = 0 without
chunking (today's single softmax); absolute figures on a shared machine are
noise.

    python benchmarks/mixture_of_softmaxes.py                      # V 10k
    python benchmarks/mixture_of_softmaxes.py --vocab 33278 --json mos.json
    python benchmarks/mixture_of_softmaxes.py --vocab 50 --units 8 --batch 2 \\
        --steps 5 --train-steps 2                                  # smoke run
"""

import sys

import _harness

_harness.environment()
# This checkout's package, also in the worker processes (their sys.path
# starts at benchmarks/).
sys.path.insert(0, _harness.REPOSITORY)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import keras_mogrifier as km  # noqa: E402

COMPONENTS = (0, 2, 4)


class OutputLayerStep(keras.Model):
    """Per-token loss of a LanguageModel's output path, from its features."""

    def __init__(self, vocab, units, components, chunk_size):
        super().__init__()
        self.lm = km.LanguageModel(
            vocab, units=units, num_layers=1, cell="lstm", stateful=False,
            mixture_of_softmaxes=components, softmax_chunk_size=chunk_size,
        )
        self.lm.build((None, None))
        self.chunk_size = chunk_size

    def call(self, inputs, training=False):
        features, targets = inputs["features"], ops.cast(inputs["targets"], "int32")
        if self.chunk_size:
            return -self.lm.target_log_probabilities(features, targets, self.chunk_size)
        logits = self.lm._logits(features, True)
        return ops.sparse_categorical_crossentropy(targets, logits, from_logits=True)


def worker(args, components, chunk, train):
    """Peak memory (and tokens/s, if `train`) of one configuration, in its own process."""
    rng = np.random.default_rng(0)
    x = {
        "features": rng.normal(size=(args.batch, args.steps, args.units)).astype("float32"),
        "targets": rng.integers(0, args.vocab, (args.batch, args.steps)).astype("int32"),
    }
    y = np.zeros((args.batch, args.steps), "float32")
    model = OutputLayerStep(args.vocab, args.units, components, chunk or None)
    model.compile(optimizer="sgd", loss=lambda y_true, y_pred: y_pred,
                  jit_compile=args.jit_compile)
    model.predict_on_batch(x)
    rate = None
    if train:
        model.train_on_batch(x, y)  # warm-up (tracing, compilation)

        def train_steps():
            for _ in range(args.train_steps):
                model.train_on_batch(x, y)

        elapsed = _harness.time_call(train_steps, repeats=1).median
        rate = args.train_steps * args.batch * args.steps / elapsed
    return {"peak_rss_mib": _harness.peak_memory_mib(), "tokens_per_s": rate}


def measure(args):
    results = []
    for components in COMPONENTS:
        for chunk in (0, args.chunk_size):
            runs = [_harness.run_in_backend(worker, args, components, chunk, train,
                                            capture_output=True)
                    for train in (False, True)]
            results.append({
                "K": components, "chunk_size": chunk or None,
                "build_mib": runs[0]["peak_rss_mib"],
                "step_mib": runs[1]["peak_rss_mib"] - runs[0]["peak_rss_mib"],
                "tokens_per_s": runs[1]["tokens_per_s"],
            })
    base = results[0]
    for r in results:
        r["memory_vs_single_softmax"] = r["step_mib"] / base["step_mib"] if base["step_mib"] > 0 else None
        r["speed_vs_single_softmax"] = r["tokens_per_s"] / base["tokens_per_s"]
    return results


def print_table(results, args):
    print(f"output layer + loss, {keras.backend.backend()}, vocab {args.vocab}, units "
          f"{args.units}, batch {args.batch} × {args.steps} tokens")
    print("| K | chunk | + step memory (MiB) | × single softmax | tokens/s | × single softmax |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        mem = r["memory_vs_single_softmax"]
        print(f"| {r['K']} | {r['chunk_size'] or '—'} | {r['step_mib']:.1f} | "
              f"{'n/a' if mem is None else f'{mem:.2f}'} | {r['tokens_per_s']:.0f} | "
              f"{r['speed_vs_single_softmax']:.2f} |")


def main(argv=None):
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--units", type=int, default=650)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=70, help="time steps per sequence")
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--jit-compile", action="store_true")
    args = parser.parse_args(argv)
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    results = measure(args)
    print_table(results, args)
    if args.json:
        _harness.write_json(args.json, {"settings": vars(args), "quiet_machine": quiet,
                                        "results": results}, indent=1)


if __name__ == "__main__":
    main()
