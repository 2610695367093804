"""What one mogrifier round costs in a train step, against what its arithmetic needs.

Times train steps of `km.MogrifierLSTM(units, mogrifier_rounds=r,
mogrifier_rank=k)` (the model of `benchmarks/cells.py`: batch 32, 35 steps,
input = units, MSE, SGD) for r = 0 … `--max-rounds`, interleaved in one process,
and fits the step time as a line in r ≥ 1 (at r = 0 the input product
leaves the loop, which no mogrified cell can do): the slope is the cost of one round per
train step (forward and backward, every time step). Beside it, the round's
arithmetic — two thin products per round forward (`(B × n) @ (n × k)` and
`(B × k) @ (k × n)`), four backward — timed as the same products done as one
large batched product at the rate a large matrix product reaches on this
machine (measured in the same process). The ratio says how far a round is from
its arithmetic: what is left is the fixed cost of each small operation.
Any backend (`KERAS_BACKEND`):

    python benchmarks/round_cost.py --units 400
    KERAS_BACKEND=jax python benchmarks/round_cost.py --units 400 --jit-compile
"""

import _harness

_harness.environment(log_level="3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mogrifier as km  # noqa: E402


def build(units, rounds, rank, batch, steps, jit_compile):
    inputs = keras.Input(batch_shape=(batch, steps, units))
    layer = km.MogrifierLSTM(units, mogrifier_rounds=rounds, mogrifier_rank=rank,
                             capped_input_gate=False, return_sequences=True)
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    return model


def matmul_gflops(size=1024, repeats=10):
    """Multiply-add rate (GFLOP/s, 2 flops each) of a large product on this machine."""
    a = keras.ops.convert_to_tensor(np.random.rand(size, size).astype("float32"))
    timing = _harness.time_call(
        lambda: keras.ops.convert_to_numpy(keras.ops.matmul(a, a)), repeats, warmup=1
    )
    return 2 * size**3 / timing.median / 1e9


def main():
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--units", type=int, default=400)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--max-rounds", type=int, default=5, help="at least 2")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jit-compile", action="store_true")
    args = parser.parse_args()
    if args.max_rounds < 2:
        parser.error(f"--max-rounds must be at least 2 (a line through r = 1, 2, …); "
                     f"received {args.max_rounds}")
    n, k, b, t = args.units, args.rank, args.batch, args.steps
    rng = np.random.default_rng(0)
    x = rng.normal(size=(b, t, n)).astype("float32")
    y = rng.normal(size=(b, t, n)).astype("float32")
    rs = list(range(args.max_rounds + 1))
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    models = {r: build(n, r, k, b, t, args.jit_compile) for r in rs}
    # Interleaved: each round times every model; two warm-up steps compile.
    samples = _harness.time_interleaved(
        {r: (lambda m=model: m.train_on_batch(x, y)) for r, model in models.items()},
        rounds=args.rounds, repeats=args.repeats, warmup=2,
    )
    medians = {r: 1000 * timing.median for r, timing in samples.items()}
    # r = 0 hoists the input product out of the loop (the input is not
    # mogrified), r ≥ 1 cannot: the line is fitted from r = 1 on.
    fitted = [r for r in rs if r >= 1]
    slope, intercept = np.polyfit(fitted, [medians[r] for r in fitted], 1)
    gflops = matmul_gflops()
    # Forward: (B×n)@(n×k) and (B×k)@(k×n); backward: two products per forward one.
    round_flops = 3 * 2 * (2 * b * n * k) * t
    arithmetic_ms = 1000 * round_flops / (gflops * 1e9)
    result = {
        "backend": keras.backend.backend(),
        "jit_compile": args.jit_compile,
        "units": n,
        "rank": k,
        "step_ms_by_rounds": medians,
        "ms_per_round_per_train_step": slope,
        "us_per_round_per_time_step": 1000 * slope / t,
        "round_arithmetic_ms_at_peak": arithmetic_ms,
        "large_matmul_gflops": gflops,
        "round_time_over_arithmetic": slope / arithmetic_ms,
    }
    print(f"{result['backend']}{' (jit)' if args.jit_compile else ''}, {n} units, rank {k}:")
    print("| rounds | " + " | ".join(str(r) for r in rs) + " |")
    print("| --- |" + " ---: |" * len(rs))
    print("| step (ms) | " + " | ".join(f"{medians[r]:.1f}" for r in rs) + " |")
    print(f"one round: {slope:.2f} ms per train step ({result['us_per_round_per_time_step']:.0f} "
          f"µs per time step, forward + backward); its arithmetic at the large-product rate "
          f"({gflops:.0f} GFLOP/s): {arithmetic_ms:.2f} ms — {slope / arithmetic_ms:.0f}×")
    if args.json:
        _harness.write_json(args.json, {"command": _harness.command_line(__file__),
                                        "quiet_machine": quiet, **result})


if __name__ == "__main__":
    main()
