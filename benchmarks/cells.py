"""Train-step time of the package's cells against `keras.layers.LSTM`.

Every configuration is a model `RNN(cell) -> mean squared error` trained with
`train_on_batch` on random data (batch 32, 35 time steps, input size = units).
Configurations are timed interleaved, in the same process, several rounds, and
each is reported as the ratio of its median step time to the median step time
of `keras.layers.LSTM` of the same size: absolute times on a shared machine
are noise, ratios are not.

    python benchmarks/cells.py                        # 400 and 650 units
    python benchmarks/cells.py --units 400 --rounds 5 --json cells.json
    python benchmarks/cells.py --jit-compile --policy mixed_bfloat16
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
}
BASELINE = "keras.layers.LSTM"


def build(name, units, batch, steps, jit_compile, unroll):
    layer = CONFIGS[name](units)
    layer.unroll = unroll
    inputs = keras.Input(batch_shape=(batch, steps, units))
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    return model


def time_steps(model, x, y, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return times


def run(units_list, batch, steps, rounds, repeats, jit_compile, unroll, names):
    rng = np.random.default_rng(0)
    results = []
    for units in units_list:
        x = rng.normal(size=(batch, steps, units)).astype("float32")
        y = rng.normal(size=(batch, steps, units)).astype("float32")
        models = {n: build(n, units, batch, steps, jit_compile, unroll) for n in names}
        for model in models.values():  # compile and warm up
            time_steps(model, x, y, 2)
        samples = {n: [] for n in names}
        for _ in range(rounds):  # interleaved: each round times every model
            for n, model in models.items():
                samples[n].extend(time_steps(model, x, y, repeats))
        base = statistics.median(samples[BASELINE])
        for n in names:
            med = statistics.median(samples[n])
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


def print_table(results, header):
    print(header)
    print(f"| units | configuration | step (ms) | × keras LSTM | tokens/s |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['units']} | {r['config']} | {r['step_ms']:.1f} | "
            f"{r['ratio_vs_keras_lstm']:.2f} | {r['tokens_per_s']:.0f} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[400, 650])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--unroll", action="store_true")
    parser.add_argument("--policy", default="float32")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    keras.config.set_dtype_policy(args.policy)
    names = [BASELINE] + [n for n in args.configs if n != BASELINE]
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
        with open(args.json, "w") as f:
            json.dump({"setting": header, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
