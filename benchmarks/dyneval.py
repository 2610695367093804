"""Tokens per second of dynamic evaluation against static evaluation.

The model is a PTB-size word-level language model: embedding, two LSTM layers
and a softmax over a 10k vocabulary (random weights: speed only). Every row
scores the same tokens with `DynamicEvaluator.evaluate`:

- `static n=N`: `adapt=False`, segments of N tokens, state carried (the
  baseline with the same number of model calls);
- `dynamic n=N`: full dynamic evaluation (forward, backward and the update of
  every weight per segment), batch 1;
- `static n=70`: static evaluation in long windows, as it is usually run;
- `sparse S streams`: sparse dynamic evaluation of S streams at once, one
  H×H adaptation matrix per stream on the last layer, against static
  evaluation of the same model at batch S.

Each configuration is warmed up (tracing) and then timed `--rounds` times,
interleaved, in one process. The table reports the best round of each (the
least disturbed by other processes on a shared machine) and ratios of those;
the JSON file also holds the median. Absolute times on a shared machine are
noise; ratios measured side by side are not.

    python benchmarks/dyneval.py                               # synthetic ids
    python benchmarks/dyneval.py --data-dir /work/shared/data/ptb --tokens 2000
    python benchmarks/dyneval.py --segment-lengths 5 20 --json dyneval.json
"""

import statistics

import _harness

_harness.environment()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402


def test_tokens(args):
    if args.data_dir is None:
        rng = np.random.default_rng(0)
        return rng.integers(0, args.vocabulary, args.tokens + 1), args.vocabulary
    from keras_mogrifier.data import load_corpus

    corpus = load_corpus(args.data_dir, splits=("train", "test"))
    return np.asarray(corpus.test[: args.tokens + 1]), len(corpus.vocabulary)


def lstm_model(vocabulary, args, batch=1):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input(batch_shape=(batch, None), dtype="int32"),
            keras.layers.Embedding(vocabulary, args.units),
            keras.layers.LSTM(args.units, stateful=True, return_sequences=True),
            keras.layers.LSTM(args.units, stateful=True, return_sequences=True),
            keras.layers.Dense(vocabulary),
        ]
    )


def sparse_model(vocabulary, args):
    from keras_mogrifier.layers import MogrifierLSTMCell

    keras.utils.set_random_seed(0)
    streams = args.sparse_streams

    def cell(adapt):
        return MogrifierLSTMCell(
            args.units,
            mogrifier_rounds=0,
            capped_input_gate=False,
            adaptation_units=args.sparse_units if adapt else None,
            adaptation_streams=streams if adapt else None,
        )

    return keras.Sequential(
        [
            keras.Input(batch_shape=(streams, None), dtype="int32"),
            keras.layers.Embedding(vocabulary, args.units),
            keras.layers.RNN(cell(False), stateful=True, return_sequences=True),
            keras.layers.RNN(cell(True), stateful=True, return_sequences=True),
            keras.layers.Dense(vocabulary),
        ]
    )


def with_unit_statistics(evaluator):
    # Speed does not depend on the values; these keep the steps finite.
    evaluator.gradient_statistics = {
        v.path: np.full(v.shape, 1e-4, "float32") for v in evaluator.adapted_variables()
    }
    return evaluator


def main():
    parser = _harness.argument_parser(__doc__, data_dir="optional", quiet=True)
    parser.add_argument("--tokens", type=int, default=2000, help="test tokens scored")
    parser.add_argument("--vocabulary", type=int, default=10000)
    parser.add_argument("--units", type=int, default=200, help="embedding and LSTM size")
    parser.add_argument("--segment-lengths", type=int, nargs="+", default=[5])
    parser.add_argument("--sparse-streams", type=int, default=32, help="0: no sparse row")
    parser.add_argument("--sparse-units", type=int, default=100, help="H")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jit-compile", action="store_true")
    args = parser.parse_args()
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)

    tokens, vocabulary = test_tokens(args)
    jit = bool(args.jit_compile)
    model = lstm_model(vocabulary, args)
    runs = {}  # name -> (evaluator, kwargs, predicted tokens)
    for n in args.segment_lengths:
        runs[f"static n={n}"] = (
            DynamicEvaluator(model, segment_length=n, jit_compile=jit), {"adapt": False}
        )
        runs[f"dynamic n={n}"] = (
            with_unit_statistics(DynamicEvaluator(model, segment_length=n, jit_compile=jit)),
            {},
        )
    runs["static n=70"] = (
        DynamicEvaluator(model, segment_length=70, jit_compile=jit), {"adapt": False}
    )
    sparse_x = None
    if args.sparse_streams:
        streams = args.sparse_streams
        per_stream = tokens.shape[0] // streams
        sparse_x = tokens[: streams * per_stream].reshape(streams, per_stream)
        n = args.segment_lengths[0]
        smodel = sparse_model(vocabulary, args)
        runs[f"sparse static {streams} streams n={n}"] = (
            DynamicEvaluator(smodel, segment_length=n, jit_compile=jit), {"adapt": False}
        )
        runs[f"sparse dynamic {streams} streams n={n}"] = (
            with_unit_statistics(
                DynamicEvaluator(smodel, segment_length=n, sparse=True, jit_compile=jit)
            ),
            {},
        )

    def run(name):
        evaluator, kwargs = runs[name]
        x = sparse_x if name.startswith("sparse") else tokens
        return evaluator.evaluate(x, verbose=0, **kwargs)["num_tokens"]

    scored = {name: run(name) for name in runs}  # warm-up: tracing
    times = _harness.time_interleaved({name: (lambda n=name: run(n)) for name in runs},
                                      rounds=args.rounds)
    speeds = {name: [scored[name] / t for t in timing.wall] for name, timing in times.items()}
    best = {name: max(v) for name, v in speeds.items()}
    median = {name: statistics.median(v) for name, v in speeds.items()}

    rows = []
    for name, speed in best.items():
        if name.startswith("sparse dynamic"):
            baseline = name.replace("dynamic", "static")
        elif name.startswith("dynamic"):
            baseline = name.replace("dynamic", "static")
        else:
            baseline = name
        rows.append(
            {
                "configuration": name,
                "tokens_per_second": speed,
                "baseline": baseline,
                "slowdown": best[baseline] / speed,
                "median_tokens_per_second": median[name],
                "median_slowdown": median[baseline] / median[name],
            }
        )

    print(
        f"vocabulary {vocabulary}, 2 x LSTM {args.units}, {tokens.shape[0] - 1} tokens"
        f"{' (PTB test)' if args.data_dir else ' (random ids)'}, jit_compile={jit}, "
        f"best of {args.rounds} rounds, backend {keras.backend.backend()}"
    )
    print(f"| {'configuration':<34} | tokens/s | time vs baseline |")
    print(f"| {'-' * 34} | -------: | ---------------: |")
    for row in rows:
        ratio = "" if row["baseline"] == row["configuration"] else (
            f"{row['slowdown']:.2f}x {row['baseline']}"
        )
        print(f"| {row['configuration']:<34} | {row['tokens_per_second']:8.0f} | {ratio:>16} |")
    if args.json:
        _harness.write_json(args.json, {
            "command": _harness.command_line(__file__), "backend": keras.backend.backend(),
            # Timings on a shared machine: its load, 1/5/15 min.
            "quiet_machine": quiet, "load_average_at_end": _harness.load_average(),
            "arguments": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
