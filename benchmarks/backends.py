"""What the library costs on each Keras backend, side by side (issue 29).

Each backend runs in its own process, one after the other (never two at
once), on the same settings: a `LanguageModel` over a V = 10k vocabulary,
2 × 256 units, batch 32, window 35, dropout 0.3 (input, state, output),
`IWAEDropoutLoss`, Adam, for each cell of `--cells` (`lstm`, `rlstm`,
`mogrifier_rlstm` by default; `mogrifier_lstm` too on request; the
Mogrifier with 5 rounds of rank 32). Per cell it
measures, after a warm-up:

- `train_ms`: one step of `LanguageModel.fit` (median of `--repeats` fits
  of `--train-steps` steps each), and `tokens_per_s` = batch × window /
  step;
- `evaluate_ms`: one step of `LanguageModel.evaluate` on the same windows;
- `static_ms_per_token`: `DynamicEvaluator.evaluate(..., adapt=False)` on
  `--eval-tokens` tokens, batch 1, segments of 5 (the state carried);
- `dynamic_ms_per_token`: `DynamicEvaluator.evaluate` on the same tokens
  (eq. 8, every weight adapted, after `collect_gradient_statistics`);
  `dynamic_over_static` is their ratio;
- `generate_ms_per_token`: `LanguageModel.generate`, greedy, one prompt,
  per new token.

With `--keras-lstm` the worker also times the same model with
`keras.layers.LSTM` layers in place of the package's (`fit` and `evaluate`
only): Keras's own recurrent path on the same backend, the reference.

The table gives each figure per backend, the step time over the fastest
backend's for the same cell (`step / fastest`), and dynamic over static
evaluation per backend.

Then the cells against `keras.layers.LSTM` (`--gap-backends`, all three by
default; `gap_worker`): `Input(32, 35, 400) -> layer -> Dense(1)`, MSE,
SGD, `jit_compile=False` (TensorFlow without XLA), the package's
full-sequence layers (`MogrifierLSTM` r = 0 capped and uncapped, `RLSTM`,
`MogrifierLSTM` and `RLSTM` with 5 rounds of rank 32) timed interleaved with
Keras's LSTM in one process, as ratios of median steps; `--gap-runs`
processes per backend (2).

`--load N` runs N busy processes (a pure Python spin, one core each) beside
every worker: what a backend costs on a machine that is not quiet. The
machine, its load average before and after every worker, and the thread
settings each backend ran with are stored with the results
(`benchmarks/results/backends_quiet.json`, `backends_load<N>.json`).
`--quick` runs a few steps and tokens of everything (a check that it runs,
`backends_quick.json`; its timings are too short to report).

    python benchmarks/backends.py                                # quiet
    python benchmarks/backends.py --quick                        # does it run?
    python benchmarks/backends.py --load 1                       # one busy process
    python benchmarks/backends.py --backends torch --cells rlstm --repeats 3
    python benchmarks/backends.py --data-dir ../shared/data/ptb  # PTB tokens

Absolute times depend on the machine and its load; measure on a quiet one
(nothing else running) and read the load averages stored with the results.
"""

import argparse
import os
import sys
import time

import _harness

CELLS = {
    "lstm": {"cell": "lstm"},
    "rlstm": {"cell": "rlstm"},
    "mogrifier_lstm": {"cell": "mogrifier_lstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
}
# `mogrifier_lstm` too with `--cells` (a quarter more time).
DEFAULT_CELLS = ("lstm", "rlstm", "mogrifier_rlstm")
KERAS_LSTM = "keras.layers.LSTM"


# === Worker: one backend, in its own process ===


def _put(row, name, timing, count, unit="ms"):
    """`timing` as `row`'s `<name>_<unit>` (median per item of `count`), its
    CPU time (on a loaded machine the wall time also counts waiting for a
    core) and every repeat."""
    row[f"{name}_{unit}"] = timing.per(count)
    row[f"{name}_{unit.replace('ms', 'cpu_ms', 1)}"] = timing.cpu_per(count)
    row[f"{name}_{unit}_all"] = timing.all_per(count)


def _tokens(args, vocabulary_size):
    import numpy as np

    if args.data_dir:
        from keras_mogrifier.data import load_corpus

        corpus = load_corpus(args.data_dir, splits=("train", "test"))
        train = np.asarray(corpus.train, "int32")
        test = np.asarray(corpus.test, "int32")
        train = train[train < vocabulary_size]
        test = test[test < vocabulary_size]
        return train, test
    rng = np.random.default_rng(0)
    # Zipf-like ids: a language model's inputs are far from uniform.
    ranks = rng.zipf(1.2, size=400_000) % vocabulary_size
    return ranks[:300_000].astype("int32"), ranks[300_000:].astype("int32")


def statistics_evaluator(model, train_ids, args):
    """A `DynamicEvaluator` on a copy of `model` with its gradient statistics
    (batches of `args.statistics_batch` streams: the state has that many rows)."""
    from keras_mogrifier.evaluation import DynamicEvaluator

    evaluator_model = model.with_options(batch_size=args.statistics_batch, samples=1)
    evaluator = DynamicEvaluator(
        evaluator_model, segment_length=args.segment_length,
        jit_compile=getattr(args, "evaluator_jit", "auto"),
    )
    evaluator.collect_gradient_statistics(
        train_ids, batch_size=args.statistics_batch, steps=args.statistics_steps
    )
    return evaluator


def _build(args, name, dropout):
    import keras

    from keras_mogrifier import IWAEDropoutLoss
    from keras_mogrifier import LanguageModel

    keras.utils.set_random_seed(0)
    settings = CELLS["lstm" if name == KERAS_LSTM else name]
    model = LanguageModel(
        args.vocabulary, units=args.units, num_layers=2, batch_size=args.batch,
        input_dropout=dropout, state_dropout=dropout, output_dropout=dropout,
        **settings,
    )
    if name == KERAS_LSTM:
        model.recurrent_layers = [
            keras.layers.LSTM(
                args.units, return_sequences=True, return_state=True,
                recurrent_dropout=dropout, name=f"keras_lstm_{i}",
            )
            for i in range(2)
        ]
    model.build((args.batch, args.window))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=IWAEDropoutLoss())
    return model


def _measure_cell(args, name, train_ids, test_ids):
    import numpy as np

    from keras_mogrifier.data import StreamDataset

    row = {"cell": name}
    model = _build(args, name, args.dropout)
    data = StreamDataset(train_ids, args.batch, args.window)
    row["parameters"] = int(sum(np.prod(w.shape) for w in model.trainable_weights))

    steps = args.train_steps
    model.fit(data, epochs=1, steps_per_epoch=args.warmup_steps, verbose=0)
    timing = _harness.time_call(
        lambda: model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0), args.repeats
    )
    _put(row, "train", timing, steps)
    row["tokens_per_s"] = args.batch * args.window / (timing.median / steps)

    model.evaluate(data, steps=2, verbose=0)
    timing = _harness.time_call(
        lambda: model.evaluate(data, steps=steps, verbose=0), args.repeats
    )
    _put(row, "evaluate", timing, steps)
    if name == KERAS_LSTM:
        return row

    # Test-time: one stream, batch 1, segments of 5 (statistics on batches of
    # `--statistics-batch` streams: the state has that many rows).
    stream = test_ids[: args.eval_tokens + 1]
    evaluator = statistics_evaluator(model, train_ids, args)
    # The warm-up scores the timed stream itself: every compiled call length
    # it uses (64 segments per call, and the remainder) is built before the
    # timing starts. (Until 2026-11-26 it scored 4 segments, so the first
    # timed pass also compiled; read the `*_all` lists of older results.)
    evaluator.evaluate(stream, adapt=False, verbose=0)
    evaluator.evaluate(stream, verbose=0)
    tokens = len(stream) - 1
    per_token = "ms_per_token"
    timing = _harness.time_call(
        lambda: evaluator.evaluate(stream, adapt=False, verbose=0), args.eval_repeats
    )
    _put(row, "static", timing, tokens, per_token)
    timing = _harness.time_call(lambda: evaluator.evaluate(stream, verbose=0), args.eval_repeats)
    _put(row, "dynamic", timing, tokens, per_token)
    row["dynamic_over_static"] = row["dynamic_ms_per_token"] / row["static_ms_per_token"]
    # The same, adapting every weight but the (tied) embedding table: the
    # share of the update's memory traffic that the 10k × units table is.
    statistics_all = evaluator.gradient_statistics
    evaluator.variables = lambda v: v.trainable and "embedding" not in v.path
    evaluator.gradient_statistics = {
        path: value for path, value in statistics_all.items() if "embedding" not in path
    }
    timing = _harness.time_call(
        lambda: evaluator.evaluate(stream, verbose=0), args.eval_repeats, warmup=1
    )
    row["dynamic_no_table_ms_per_token"] = timing.per(tokens)
    row["dynamic_no_table_over_static"] = (
        row["dynamic_no_table_ms_per_token"] / row["static_ms_per_token"]
    )
    evaluator.variables = None
    evaluator.gradient_statistics = statistics_all

    generator = model.with_options(batch_size=1, samples=1)
    prompt = test_ids[: args.prompt_tokens]
    new = args.generate_tokens
    generator.generate(prompt, len(prompt) + 3, stop_token_ids=None)
    timing = _harness.time_call(
        lambda: generator.generate(prompt, len(prompt) + new, stop_token_ids=None),
        args.eval_repeats,
    )
    _put(row, "generate", timing, new, per_token)
    return row


GAP_CONFIGS = (
    "keras.layers.LSTM",
    "MogrifierLSTM r=0",
    "MogrifierLSTM r=0 uncapped",
    "RLSTM",
    "MogrifierLSTM r=5 k=32",
    "RLSTM r=5 k=32",
)


def _gap_layer(name, units):
    import keras

    import keras_mogrifier as km

    if name == "keras.layers.LSTM":
        return keras.layers.LSTM(units, return_sequences=True)
    if name.startswith("MogrifierLSTM"):
        rounds = 0 if "r=0" in name else 5
        return km.MogrifierLSTM(
            units, mogrifier_rounds=rounds, mogrifier_rank=32,
            capped_input_gate="uncapped" not in name, return_sequences=True,
        )
    rounds = 0 if name == "RLSTM" else 5
    return km.RLSTM(units, mogrifier_rounds=rounds, mogrifier_rank=32, return_sequences=True)


def gap_worker(args):
    """The cells against `keras.layers.LSTM`: ratios of median step times.

    Each configuration is `Input(batch, steps, units) -> layer (the whole
    sequence) -> Dense(1)`, mean squared error, SGD, trained with
    `train_on_batch` on random data; `jit_compile=False` (TensorFlow
    without XLA; JAX compiles its step anyway). The configurations are
    timed interleaved, `--gap-rounds` rounds of `--gap-steps` steps each,
    after two warm-up steps, and each is reported as the ratio of its
    median step to that of `keras.layers.LSTM` in the same process.
    """
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    units, batch, steps = args.gap_units, args.gap_batch, args.gap_window
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, steps, units)).astype("float32")
    y = rng.normal(size=(batch, steps, 1)).astype("float32")
    steps_of = {}
    for name in GAP_CONFIGS:
        inputs = keras.Input(batch_shape=(batch, steps, units))
        outputs = keras.layers.Dense(1)(_gap_layer(name, units)(inputs))
        model = keras.Model(inputs, outputs)
        model.compile(optimizer="sgd", loss="mse", jit_compile=False)
        steps_of[name] = lambda model=model: model.train_on_batch(x, y)
    samples = _harness.time_interleaved(
        steps_of, rounds=args.gap_rounds, repeats=args.gap_steps, warmup=2
    )
    base = samples["keras.layers.LSTM"].median
    return [
        {"config": name, "step_ms": 1000 * samples[name].median,
         "ratio_vs_keras_lstm": samples[name].median / base,
         "step_ms_all": samples[name].all_per(1)}
        for name in GAP_CONFIGS
    ]


def _thread_settings(backend):
    settings = {k: os.environ.get(k) for k in (
        "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "KERAS_MOGRIFIER_TORCH_THREADS")}
    if backend == "torch":
        import torch

        settings["torch_num_threads"] = torch.get_num_threads()
        settings["torch_num_interop_threads"] = torch.get_num_interop_threads()
        settings["torch_parallel_backend"] = torch.__config__.parallel_info().splitlines()[-1]
    return settings


def worker(args, gap=False):
    """One backend's rows (`gap_worker`'s with `gap`), in a process of its own."""
    import keras

    import keras_mogrifier  # noqa: F401  (the backend's settings, if any)

    backend = keras.backend.backend()
    if args.torch_threads and backend == "torch":
        import torch

        torch.set_num_threads(args.torch_threads)
    result = {"backend": backend, "versions": _harness.versions(),
              "threads": _thread_settings(backend)}
    if gap:
        return dict(result, rows=gap_worker(args))
    train_ids, test_ids = _tokens(args, args.vocabulary)
    names = list(args.cells) + ([KERAS_LSTM] if args.keras_lstm else [])
    rows = []
    for name in names:
        started = time.perf_counter()
        row = _measure_cell(args, name, train_ids, test_ids)
        row["seconds"] = time.perf_counter() - started
        print(f"[{backend}] {name}: " + ", ".join(
            f"{k}={v:.3g}" for k, v in row.items() if isinstance(v, float)
        ), file=sys.stderr, flush=True)
        rows.append(row)
        keras.backend.clear_session()
    return dict(result, rows=rows)


# === Driver: every backend, one after the other ===


def run_backend(backend, args, gap=False):
    """`worker(args, gap)` in a fresh process on `backend`, with `args.load`
    busy processes beside it, its load averages and seconds."""
    before = _harness.load_average()
    started = time.perf_counter()
    result = _harness.run_in_backend(
        worker, args, gap, backend=backend, env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        busy=args.load,
    )
    result["load_average_before"] = before
    result["load_average_after"] = _harness.load_average()
    result["seconds"] = time.perf_counter() - started
    return result


def summarise(results):
    """Adds `step_over_fastest` per cell and returns the table's rows."""
    fastest = {}
    for result in results:
        for row in result["rows"]:
            for key in ("train_ms", "evaluate_ms", "static_ms_per_token",
                        "dynamic_ms_per_token", "generate_ms_per_token"):
                if key in row:
                    best = fastest.setdefault(row["cell"], {}).get(key)
                    if best is None or row[key] < best:
                        fastest[row["cell"]][key] = row[key]
    for result in results:
        for row in result["rows"]:
            for key, best in fastest[row["cell"]].items():
                if key in row:
                    row[key.replace("_ms_per_token", "").replace("_ms", "") + "_over_fastest"] = (
                        row[key] / best
                    )
    return results


def print_table(results):
    def fmt(value, spec):
        return "—" if value is None else format(value, spec)

    print("| cell | backend | train step (ms) | tokens/s | step / fastest | evaluate (ms) "
          "| static (ms/token) | static / fastest | dynamic (ms/token) | dynamic / static "
          "| generate (ms/token) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    cells = []
    for result in results:
        for row in result["rows"]:
            if row["cell"] not in cells:
                cells.append(row["cell"])
    for cell in cells:
        for result in results:
            for row in result["rows"]:
                if row["cell"] != cell:
                    continue
                g = row.get
                print(
                    f"| {cell} | {result['backend']} | {fmt(g('train_ms'), '.0f')} | "
                    f"{fmt(g('tokens_per_s'), ',.0f')} | {fmt(g('train_over_fastest'), '.2f')} | "
                    f"{fmt(g('evaluate_ms'), '.0f')} | {fmt(g('static_ms_per_token'), '.2f')} | "
                    f"{fmt(g('static_over_fastest'), '.2f')} | "
                    f"{fmt(g('dynamic_ms_per_token'), '.2f')} | "
                    f"{fmt(g('dynamic_over_static'), '.2f')} | "
                    f"{fmt(g('generate_ms_per_token'), '.2f')} |"
                )
    print()
    print("| backend | dynamic / static, per cell | worst | the same without the "
          "embedding table adapted |")
    print("| --- | --- | ---: | --- |")
    for result in results:
        ratios = [
            (row["cell"], row["dynamic_over_static"], row.get("dynamic_no_table_over_static"))
            for row in result["rows"] if "dynamic_over_static" in row
        ]
        if ratios:
            shown = ", ".join(f"{c} {r:.2f}" for c, r, _ in ratios)
            no_table = ", ".join(f"{c} {fmt(r, '.2f')}" for c, _, r in ratios)
            print(f"| {result['backend']} | {shown} | {max(r for _, r, _ in ratios):.2f} "
                  f"| {no_table} |")


# Settings that `--quick` shrinks (a check that the script runs, minutes on
# a quiet machine; its timings are too short to report): name -> (full, quick).
SIZES = {
    "warmup_steps": (3, 1),
    "train_steps": (10, 2),
    "repeats": (3, 1),
    "eval_tokens": (1500, 40),
    "eval_repeats": (2, 1),
    "statistics_steps": (20, 2),
    "generate_tokens": (50, 3),
    "gap_rounds": (3, 1),
    "gap_steps": (5, 2),
    "gap_runs": (2, 1),
}


def print_gap_table(gap):
    backends = list(gap)
    print("| configuration | " + " | ".join(
        f"{b} × keras LSTM (runs)" for b in backends) + " |")
    print("| --- |" + " ---: |" * len(backends))
    for name in GAP_CONFIGS:
        cells = []
        for b in backends:
            ratios = [
                row["ratio_vs_keras_lstm"] for run in gap[b] for row in run["rows"]
                if row["config"] == name
            ]
            cells.append("–".join(f"{r:.2f}" for r in sorted(ratios)))
        print(f"| {name} | " + " | ".join(cells) + " |")
    for b in backends:
        ms = [
            row["step_ms"] for run in gap[b] for row in run["rows"]
            if row["config"] == "keras.layers.LSTM"
        ]
        print(f"keras.layers.LSTM step on {b}: " + ", ".join(f"{m:.1f} ms" for m in ms))


def _jit_setting(text):
    values = {"auto": "auto", "true": True, "false": False}
    if text.lower() not in values:
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}")
    return values[text.lower()]


def main():
    parser = _harness.argument_parser(__doc__, json_flag=False, backends=_harness.BACKENDS,
                                      quiet=True)
    parser.add_argument("--quick", action="store_true",
                        help="a few steps and tokens of everything: checks that it runs")
    parser.add_argument("--cells", nargs="+", default=list(DEFAULT_CELLS), choices=list(CELLS))
    parser.add_argument("--keras-lstm", action="store_true",
                        help="also time the model with keras.layers.LSTM layers")
    parser.add_argument("--load", type=int, default=0,
                        help="busy processes beside each backend's worker")
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=35)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--segment-length", type=int, default=5)
    parser.add_argument("--statistics-batch", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=20)
    for name, (full, quick) in SIZES.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int,
                            help=f"default {full} ({quick} with --quick)")
    parser.add_argument("--gap-backends", nargs="*", default=list(_harness.BACKENDS),
                        choices=_harness.BACKENDS,
                        help="backends of the cells-vs-keras.layers.LSTM comparison "
                             "(none: skip it)")
    parser.add_argument("--gap-units", type=int, default=400)
    parser.add_argument("--gap-batch", type=int, default=32)
    parser.add_argument("--gap-window", type=int, default=35)
    parser.add_argument("--torch-threads", type=int,
                        help="torch.set_num_threads in the PyTorch worker (default: the "
                             "library's policy, KERAS_MOGRIFIER_TORCH_THREADS)")
    parser.add_argument("--evaluator-jit", default="auto", type=_jit_setting,
                        help="the DynamicEvaluator's jit_compile: auto (default), true "
                             "or false (on TensorFlow's CPU, auto is false)")
    parser.add_argument("--data-dir", help="a corpus folder (ptb.{train,test}.txt): real tokens")
    parser.add_argument("--json", help="output (default: benchmarks/results/backends_quiet.json, "
                        "backends_load<N>.json with --load N, backends_quick.json with --quick)")
    args = parser.parse_args()
    for name, (full, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    started = {"load_average": quiet["load_average"],
               "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    clock = time.perf_counter()
    results = [run_backend(b, args) for b in args.backends]
    summarise(results)
    gap = {
        b: [run_backend(b, args, gap=True) for _ in range(args.gap_runs)]
        for b in args.gap_backends
    }
    setting = (
        f"LanguageModel V={args.vocabulary}, 2 × {args.units}, batch {args.batch}, "
        f"window {args.window}, dropout {args.dropout}, IWAEDropoutLoss, Adam; train step "
        f"= median of {args.repeats} fits of {args.train_steps} steps; evaluation "
        f"on {args.eval_tokens} tokens, batch 1, segments of {args.segment_length} "
        f"(evaluator jit_compile={args.evaluator_jit}); "
        f"{args.load} busy process(es) beside each backend"
    )
    gap_setting = (
        f"Input({args.gap_batch}, {args.gap_window}, {args.gap_units}) -> layer (whole "
        f"sequence) -> Dense(1), MSE, SGD, jit_compile=False, {args.gap_rounds} rounds × "
        f"{args.gap_steps} steps interleaved, {args.gap_runs} run(s) (processes) per backend"
    )
    print(setting)
    print_table(results)
    if gap:
        print()
        print(gap_setting)
        print_gap_table(gap)
    if args.quick:
        print("\n--quick: a check that everything runs; these timings are too short to report")
    default = (
        "backends_quick.json" if args.quick
        else "backends_quiet.json" if args.load == 0 else f"backends_load{args.load}.json"
    )
    path = args.json or os.path.join(_harness.RESULTS, default)
    _harness.write_json(path, {
        "setting": setting, "gap_setting": gap_setting,
        "command": _harness.command_line(__file__), "quick": args.quick,
        "machine": _harness.machine(), "quiet_machine": quiet, "started": started,
        "finished_load_average": _harness.load_average(),
        "seconds": time.perf_counter() - clock, "results": results, "gap": gap,
    })
    print(f"wrote {path} ({(time.perf_counter() - clock) / 60:.1f} min)")


if __name__ == "__main__":
    main()
