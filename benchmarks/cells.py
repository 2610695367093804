"""Train-step time of the package's cells against `keras.layers.LSTM`.

Every configuration is a model `RNN(cell) -> mean squared error` trained with
`train_on_batch` on random data (batch 32, 35 time steps, input size = units).
Each cell runs twice: inside `keras.layers.RNN(cell)` (the reference path a
user writes) and as the package's full-sequence layer (`km.MogrifierLSTM`,
`km.RLSTM`: `CellRNN`, the input projection hoisted out of the time loop when
the input is not mogrified). Any backend: set `KERAS_BACKEND`.
Configurations are timed interleaved, in the same process, several rounds, and
each is reported as the ratio of its median step time to the median step time
of `keras.layers.LSTM` of the same size: absolute times on a shared machine
are noise, ratios are not.

    python benchmarks/cells.py                        # 400 and 650 units
    python benchmarks/cells.py --units 400 --rounds 5 --json cells.json
    python benchmarks/cells.py --jit-compile --policy mixed_bfloat16
    KERAS_BACKEND=jax python benchmarks/cells.py --jit-compile
    python benchmarks/cells.py --memory --units 650 --steps 70   # peak memory

`--memory` runs each configuration in its own process: the peak resident
memory (`ru_maxrss`) of a process that builds the model and runs 3 train
steps, minus that of one that only builds it and runs a forward pass — what a
training step costs on top of the weights, compiled code included.
"""

import _harness

_harness.environment()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mogrifier as km  # noqa: E402

CONFIGS = {
    "keras.layers.LSTM": lambda n: keras.layers.LSTM(n, return_sequences=True),
    "MogrifierLSTMCell r=0": lambda n: keras.layers.RNN(
        km.MogrifierLSTMCell(n, mogrifier_rounds=0, capped_input_gate=False),
        return_sequences=True,
    ),
    "MogrifierLSTMCell r=0 capped": lambda n: keras.layers.RNN(
        km.MogrifierLSTMCell(n, mogrifier_rounds=0), return_sequences=True
    ),
    "RLSTMCell": lambda n: keras.layers.RNN(
        km.RLSTMCell(n), return_sequences=True
    ),
    "MogrifierLSTMCell r=5 k=32": lambda n: keras.layers.RNN(
        km.MogrifierLSTMCell(n, mogrifier_rounds=5, mogrifier_rank=32),
        return_sequences=True,
    ),
    "RLSTMCell r=5 k=32": lambda n: keras.layers.RNN(
        km.RLSTMCell(n, mogrifier_rounds=5, mogrifier_rank=32),
        return_sequences=True,
    ),
    # The full-sequence layers (CellRNN): the same cells, the same numbers.
    "MogrifierLSTM r=0 (layer)": lambda n: km.MogrifierLSTM(
        n, mogrifier_rounds=0, capped_input_gate=False, return_sequences=True
    ),
    "RLSTM (layer)": lambda n: km.RLSTM(n, return_sequences=True),
    "MogrifierLSTM r=5 k=32 (layer)": lambda n: km.MogrifierLSTM(
        n, mogrifier_rounds=5, mogrifier_rank=32, return_sequences=True
    ),
    "RLSTM r=5 k=32 (layer)": lambda n: km.RLSTM(
        n, mogrifier_rounds=5, mogrifier_rank=32, return_sequences=True
    ),
}
BASELINE = "keras.layers.LSTM"


def build(name, units, batch, steps, jit_compile, unroll):
    layer = CONFIGS[name](units)
    layer.unroll = unroll
    inputs = keras.Input(batch_shape=(batch, steps, units))
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    return model


def run(units_list, batch, steps, rounds, repeats, jit_compile, unroll, names):
    rng = np.random.default_rng(0)
    results = []
    for units in units_list:
        x = rng.normal(size=(batch, steps, units)).astype("float32")
        y = rng.normal(size=(batch, steps, units)).astype("float32")
        models = {n: build(n, units, batch, steps, jit_compile, unroll) for n in names}
        # Interleaved: each round times every model; two warm-up steps compile.
        samples = _harness.time_interleaved(
            {n: (lambda m=model: m.train_on_batch(x, y)) for n, model in models.items()},
            rounds=rounds, repeats=repeats, warmup=2,
        )
        base = samples[BASELINE].median
        for n in names:
            med = samples[n].median
            results.append(
                {
                    "units": units,
                    "config": n,
                    "step_ms": 1000 * med,
                    "ratio_vs_keras_lstm": med / base,
                    "tokens_per_s": batch * steps / med,
                }
            )
    return results


def memory_worker(name, units, batch, steps, jit_compile, train):
    """The peak RSS (MiB) of building `name` and (if `train`) 3 train steps."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, steps, units)).astype("float32")
    y = rng.normal(size=(batch, steps, units)).astype("float32")
    model = build(name, units, batch, steps, jit_compile, False)
    model.predict_on_batch(x)
    if train:
        for _ in range(3):
            model.train_on_batch(x, y)
    return _harness.peak_memory_mib()


def measure_memory(names, units, batch, steps, jit_compile):
    """Each configuration's peak memory, built and trained, each in its own process."""
    results = []
    for name in names:
        peaks = [
            _harness.run_in_backend(memory_worker, name, units, batch, steps, jit_compile,
                                    train, capture_output=True)
            for train in (False, True)
        ]
        results.append(
            {"units": units, "config": name, "build_mib": peaks[0],
             "train_step_mib": peaks[1] - peaks[0]}
        )
    base = next(r for r in results if r["config"] == BASELINE)["train_step_mib"]
    for r in results:
        r["ratio_vs_keras_lstm"] = r["train_step_mib"] / base
    return results


def print_memory_table(results, header):
    print(header)
    print("| units | configuration | peak RSS, model built (MiB) | + training (MiB) | × keras LSTM |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['units']} | {r['config']} | {r['build_mib']:.0f} | "
            f"{r['train_step_mib']:.0f} | {r['ratio_vs_keras_lstm']:.2f} |"
        )


def print_table(results, header):
    print(header)
    print("| units | configuration | step (ms) | × keras LSTM | tokens/s |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['units']} | {r['config']} | {r['step_ms']:.1f} | "
            f"{r['ratio_vs_keras_lstm']:.2f} | {r['tokens_per_s']:.0f} |"
        )


def main():
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--units", type=int, nargs="+", default=[400, 650])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--unroll", action="store_true")
    parser.add_argument("--policy", default="float32")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--memory", action="store_true",
                        help="peak memory of a train step instead of its time")
    args = parser.parse_args()
    keras.config.set_dtype_policy(args.policy)
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    names = [BASELINE] + [n for n in args.configs if n != BASELINE]
    if args.memory:
        header = (
            f"peak memory, batch {args.batch}, {args.steps} steps, "
            f"jit_compile={args.jit_compile}, keras {keras.__version__}, "
            f"backend {keras.backend.backend()}"
        )
        results = [
            r for units in args.units
            for r in measure_memory(names, units, args.batch, args.steps, args.jit_compile)
        ]
        print_memory_table(results, header)
        if args.json:
            _harness.write_json(
                args.json, {"setting": header, "quiet_machine": quiet, "results": results})
        return
    results = run(
        args.units, args.batch, args.steps, args.rounds, args.repeats,
        args.jit_compile, args.unroll, names,
    )
    header = (
        f"batch {args.batch}, {args.steps} steps, policy {args.policy}, "
        f"jit_compile={args.jit_compile}, unroll={args.unroll}, "
        f"keras {keras.__version__}, backend {keras.backend.backend()}"
    )
    print_table(results, header)
    if args.json:
        _harness.write_json(
            args.json, {"setting": header, "quiet_machine": quiet, "results": results})


if __name__ == "__main__":
    main()
