"""Training throughput of the full PTB-size language model, per cell.

The model is `LanguageModel` (embedding, 2 recurrent layers with residual
connections, tied softmax over 10k words) with each cell, against the same
model whose recurrent layers are `keras.layers.LSTM` (swapped in before the
model is built). Steps are timed interleaved in one process; the table gives
tokens/s and the ratio of step times to the Keras-LSTM model.

    python benchmarks/lm_throughput.py --units 400 --json lm_throughput.json
"""

import _harness

_harness.environment()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.losses import IWAEDropoutLoss  # noqa: E402
from keras_mogrifier.models import LanguageModel  # noqa: E402

CONFIGS = {
    "keras.layers.LSTM": {"cell": "lstm"},
    "lstm (MogrifierLSTMCell r=0)": {"cell": "lstm"},
    "rlstm": {"cell": "rlstm"},
    "mogrifier_lstm r=5 k=32": {"cell": "mogrifier_lstm", "mogrifier_rank": 32},
    "mogrifier_rlstm r=5 k=32": {"cell": "mogrifier_rlstm", "mogrifier_rank": 32},
}
BASELINE = "keras.layers.LSTM"


def build(name, vocab, units, batch, steps, jit_compile, dropout):
    model = LanguageModel(
        vocab, units=units, num_layers=2, batch_size=batch,
        input_dropout=dropout, state_dropout=dropout, output_dropout=dropout,
        **CONFIGS[name],
    )
    if name == BASELINE:
        model.recurrent_layers = [
            keras.layers.LSTM(
                units, return_sequences=True, return_state=True,
                recurrent_dropout=dropout, name=f"keras_lstm_{i}",
            )
            for i in range(2)
        ]
    model.build((batch, steps))
    model.compile(optimizer="adam", loss=IWAEDropoutLoss(), jit_compile=jit_compile)
    return model


def main():
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--units", type=int, default=400)
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--no-jit", action="store_true")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    args = parser.parse_args()
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    names = [BASELINE] + [n for n in args.configs if n != BASELINE]
    rng = np.random.default_rng(0)
    x = rng.integers(0, args.vocab, (args.batch, args.steps)).astype("int32")
    y = rng.integers(0, args.vocab, (args.batch, args.steps)).astype("int32")
    models = {n: build(n, args.vocab, args.units, args.batch, args.steps,
                       not args.no_jit, args.dropout) for n in names}
    samples = _harness.time_interleaved(
        {n: (lambda m=m: m.train_on_batch(x, y)) for n, m in models.items()},
        rounds=args.rounds, repeats=args.repeats, warmup=2,
    )
    base = samples[BASELINE].median
    rows = []
    for n in names:
        med = samples[n].median
        rows.append({"config": n, "step_ms": 1000 * med, "ratio": med / base,
                     "tokens_per_s": args.batch * args.steps / med,
                     "parameters": int(sum(np.prod(w.shape) for w in models[n].trainable_weights))})
    setting = (f"V={args.vocab}, 2×{args.units}, batch {args.batch}, BPTT {args.steps}, "
               f"dropout {args.dropout}, jit_compile={not args.no_jit}, keras {keras.__version__}")
    print(setting)
    print("| model | parameters | step (ms) | × Keras-LSTM model | tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['config']} | {r['parameters']:,} | {r['step_ms']:.0f} | "
              f"{r['ratio']:.2f} | {r['tokens_per_s']:.0f} |")
    if args.json:
        _harness.write_json(args.json, {"setting": setting, "quiet_machine": quiet,
                                        "rows": rows})


if __name__ == "__main__":
    main()
