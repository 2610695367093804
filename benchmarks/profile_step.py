"""Where one train step's time goes: TensorFlow's profiler, per operation kind.

Builds the configurations of `benchmarks/cells.py` (same model: the layer on
random data, mean squared error, SGD, batch 32, 35 steps, input = units), runs
a few warm-up steps, then traces `--steps` train steps with
`tf.profiler.experimental` and reads the trace (the XPlane protobuf that
TensorFlow writes) directly. Every operation the executor ran is put in one of
four places — forward or backward (`gradient_tape/...`), inside the time loop
(`.../while/...`) or outside it — and grouped by operation kind (`MatMul`,
`Mul`, `Sigmoid`, ...). Prints, per configuration:

- the step's wall time (outside the profiler, median of `--repeats`),
- per place: operations per time step, their summed kernel time, and the mean
  time per operation,
- the operation kinds that take the most time inside the loop.

"Kernel time" is the time each operation's kernel ran on the executor's
threads; the step's wall time minus the summed kernel time (divided by the
threads that can run at once) is the executor's own per-operation cost —
scheduling, the loop's bookkeeping, Python. TensorFlow only, without XLA (XLA
fuses the step into a few large kernels that the trace no longer names):

    python benchmarks/profile_step.py --units 400 --json benchmarks/results/profile_step_400.json
"""

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import cells  # noqa: E402

DEFAULT_CONFIGS = (
    "keras.layers.LSTM",
    "MogrifierLSTM r=0 (layer)",
    "RLSTM (layer)",
    "MogrifierLSTM r=5 k=32 (layer)",
    "RLSTM r=5 k=32 (layer)",
)


def _xspace(logdir):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def op_events(space):
    """(name, kind, microseconds) of every operation the executor ran."""
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = names[event.metadata_id]
                # Ops are "scope/.../name:Kind"; executor/threadpool events use "::".
                if ":" not in name or "::" in name:
                    continue
                kind = name.rsplit(":", 1)[1].lstrip("_").replace("Mkl", "")
                yield name, kind, event.duration_ps / 1e6


def graph_counts(model, x, y):
    """Operations per time step in the loop's body, forward and backward, by kind.

    Read from the graph of one gradient step (before Grappler's rewrites):
    the while loop's body function and the body of its gradient.
    """
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        return tape.gradient(loss, model.trainable_variables)

    library = step.get_concrete_function(x, y).graph.as_graph_def().library
    counts = {"forward": collections.Counter(), "backward": collections.Counter()}
    for function in library.function:
        name = function.signature.name
        if "_while_body_" not in name or name.endswith("_rewritten"):
            continue
        phase = "backward" if "_grad_" in name else "forward"
        counts[phase].update(node.op for node in function.node_def)
    return counts


def cheap_op_microseconds(units, batch, steps, extra=24, repeats=7):
    """The cost of one elementwise operation on a `(batch, units)` tensor inside
    a `tf.while_loop`: its kernel and the executor's dispatch, measured as the
    slope of a loop's time against the number of chained `Tanh`s per step."""
    x = tf.random.normal((batch, units))

    def looped(k):
        @tf.function
        def run(x):
            def body(t, h):
                for _ in range(k):
                    h = tf.tanh(h)  # nothing for Grappler to fold or hoist
                return t + 1, h

            return tf.while_loop(lambda t, h: t < steps, body, (0, x))[1]

        run(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(x).numpy()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return 1e6 * (looped(extra) - looped(0)) / (extra * steps)


def place(name):
    phase = "backward" if name.startswith("gradient_tape") else "forward"
    where = "loop" if "/while/" in name or "/while_grad/" in name else "outside"
    return phase, where


def profile(config, units, batch, steps, traced_steps, repeats):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, steps, units)).astype("float32")
    y = rng.normal(size=(batch, steps, units)).astype("float32")
    model = cells.build(config, units, batch, steps, False, False)
    for _ in range(3):
        model.train_on_batch(x, y)
    wall = statistics.median(cells.time_steps(model, x, y, repeats))
    # Level 3 asks for the inexpensive operations too; TensorFlow still runs
    # some of them inline, untraced (hence the graph counts below).
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3)
    with tempfile.TemporaryDirectory(prefix="profile_step_") as logdir:
        tf.profiler.experimental.start(logdir, options=options)
        for _ in range(traced_steps):
            model.train_on_batch(x, y)
        tf.profiler.experimental.stop()
        events = list(op_events(_xspace(logdir)))
    places = collections.defaultdict(lambda: {"ops": 0, "us": 0.0})
    kinds = collections.defaultdict(lambda: {"ops": 0, "us": 0.0})
    for name, kind, us in events:
        phase, where = place(name)
        groups = [places[(phase, where)]] + ([kinds[(phase, kind)]] if where == "loop" else [])
        for group in groups:
            group["ops"] += 1
            group["us"] += us

    def summary(v):
        # Per train step (the trace holds `traced_steps`), and per operation.
        return {"ops_per_train_step": v["ops"] / traced_steps,
                "kernel_ms": v["us"] / traced_steps / 1000,
                "mean_us_per_op": v["us"] / max(v["ops"], 1)}

    result = {"config": config, "units": units, "wall_ms": 1000 * wall, "places": {}}
    for (phase, where), v in sorted(places.items()):
        p = summary(v)
        p["ops_per_time_step"] = p["ops_per_train_step"] / steps if where == "loop" else None
        result["places"][f"{phase} {where}"] = p
    result["loop_kinds"] = [
        {"phase": phase, "kind": kind, **summary(v),
         "ops_per_time_step": v["ops"] / traced_steps / steps}
        for (phase, kind), v in sorted(kinds.items(), key=lambda kv: -kv[1]["us"])
    ]
    result["kernel_ms"] = sum(p["kernel_ms"] for p in result["places"].values())
    counts = graph_counts(model, x, y)
    result["loop_graph_ops"] = {
        phase: {"total": sum(c.values()), "matmul": c["MatMul"],
                "other": sum(c.values()) - c["MatMul"], "by_kind": dict(c.most_common())}
        for phase, c in counts.items()
    }
    return result


def print_result(r, top):
    print(f"\n### {r['config']}, {r['units']} units: step {r['wall_ms']:.1f} ms wall, "
          f"{r['kernel_ms']:.1f} ms summed kernel time")
    print("| place | ops per time step | ops per train step | kernel ms | µs per op |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, p in r["places"].items():
        per_t = "" if p["ops_per_time_step"] is None else f"{p['ops_per_time_step']:.1f}"
        print(f"| {name} | {per_t} | {p['ops_per_train_step']:.0f} | "
              f"{p['kernel_ms']:.1f} | {p['mean_us_per_op']:.1f} |")
    for phase, c in r["loop_graph_ops"].items():
        print(f"| graph: {phase} loop body | {c['total']} ops ({c['matmul']} MatMul, "
              f"{c['other']} other) | | | |")
    print("| in the loop: kind | ops per time step | | kernel ms | µs per op |")
    for k in r["loop_kinds"][:top]:
        print(f"| {k['phase']} {k['kind']} | {k['ops_per_time_step']:.1f} | | "
              f"{k['kernel_ms']:.1f} | {k['mean_us_per_op']:.1f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--traced-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                        choices=list(cells.CONFIGS))
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--json")
    args = parser.parse_args()
    cheap = cheap_op_microseconds(args.units, args.batch, args.steps)
    print(f"one elementwise op on ({args.batch}, {args.units}) in a tf.while_loop: "
          f"{cheap:.1f} µs (kernel + dispatch)")
    results = []
    for config in args.configs:
        r = profile(config, args.units, args.batch, args.steps, args.traced_steps,
                    args.repeats)
        print_result(r, args.top)
        results.append(r)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": "python benchmarks/profile_step.py " + " ".join(sys.argv[1:]),
                       "cheap_op_us": cheap, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
