"""Where dynamic evaluation of a trained model starts to diverge, in (η, ε).

One `DynamicEvaluationTuner` pass per point of a grid of learning rates η and
epsilons ε (the library's units), at one segment length and decay rate, over
the first `--max-tokens` validation tokens; gradient statistics gathered once,
as the tuner does (saved in `--directory`, reused by a rerun). Each point is
`diverged` (the evaluator's `DivergenceError`, or a loss above `max_loss`,
2 ln V), or its loss against static evaluation of the same tokens. The
printed table marks `x` diverged, `+` better than static, `-` worse.

    python benchmarks/dyneval_divergence.py --model model.keras \
        --data-dir /work/shared/data/ptb --json divergence.json
"""

import time

import _harness

_harness.environment()

import keras  # noqa: E402

import keras_mogrifier  # noqa: E402,F401  (registers the classes for loading)
from keras_mogrifier.data import load_ptb  # noqa: E402
from keras_mogrifier.evaluation import DivergenceError  # noqa: E402
from keras_mogrifier.tuning import DynamicEvaluationTuner  # noqa: E402


def parse_args(argv=None):
    parser = _harness.argument_parser(__doc__, data_dir="optional")
    parser.add_argument("--model", required=True, help="a saved .keras LanguageModel")
    parser.add_argument("--learning-rates", type=float, nargs="+",
                        default=[1e-5, 3e-5, 1e-4, 1.7e-4, 3e-4, 1e-3])
    parser.add_argument("--epsilons", type=float, nargs="+",
                        default=[1e-9, 1e-8, 2.6e-8, 1e-7, 3e-7, 1e-6, 3e-6, 2e-5])
    parser.add_argument("--segment-length", type=int, default=5)
    parser.add_argument("--decay-rate", type=float, default=1e-6,
                        help="λ (the bottom of the default range: the least pull back)")
    parser.add_argument("--normalizer", default="global_mean")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--statistics-tokens", type=int, default=200_000)
    parser.add_argument("--directory", default="runs/dyneval_divergence")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    corpus = load_ptb(args.data_dir)
    model = keras.saving.load_model(args.model)
    n = args.segment_length
    tuner = DynamicEvaluationTuner(
        model, corpus.train, fixed={"segment_length": n}, normalizer=args.normalizer,
        statistics_tokens=args.statistics_tokens, directory=args.directory,
        project_name="divergence", overwrite=False,
    )
    valid = corpus.valid[: args.max_tokens + 1]
    static = tuner.evaluate_static(valid, segment_length=n)["loss"]
    print(f"static loss {static:.4f} on {args.max_tokens} validation tokens, "
          f"max_loss {tuner.max_loss:.2f}")
    rows = []
    for epsilon in args.epsilons:
        for learning_rate in args.learning_rates:
            values = {"segment_length": n, "learning_rate": learning_rate,
                      "decay_rate": args.decay_rate, "epsilon": epsilon}
            start = time.perf_counter()
            try:
                loss = tuner.evaluate(valid, values)["loss"]
                diverged = not loss <= tuner.max_loss
            except DivergenceError as error:
                loss, diverged = error.loss, True
            rows.append({**values, "loss": float(loss), "diverged": diverged,
                         "seconds": round(time.perf_counter() - start, 2)})
            print(f"eps {epsilon:8.2g} eta {learning_rate:8.2g}: "
                  f"{'diverged' if diverged else 'loss'} {loss:.4f}", flush=True)
    print("\nrows ε, columns η: x diverged, + better than static, - worse")
    print("          " + " ".join(f"{v:8.2g}" for v in args.learning_rates))
    for epsilon in args.epsilons:
        marks = [
            "x" if r["diverged"] else ("+" if r["loss"] < static else "-")
            for r in rows if r["epsilon"] == epsilon
        ]
        print(f"{epsilon:8.2g}  " + " ".join(f"{m:>8}" for m in marks))
    if args.json:
        _harness.write_json(args.json, {"command": _harness.command_line(__file__, argv),
                                        "backend": keras.backend.backend(),
                                        "static_loss": static, "max_loss": tuner.max_loss,
                                        "rows": rows})
    return rows


if __name__ == "__main__":
    main()
