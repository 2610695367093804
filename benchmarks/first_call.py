"""The first call on a model, and a text of another length, against the warm call (issue 43).

Issue 43's goal "compile once per model, not per text": evaluating, scoring
or adapting to a second text of another length traces nothing new (counted
by `tests/evaluation/compile_once_test.py`), and the first call on a model
takes at most twice its warm time plus 2 s, on every backend. This script
measures the times; the test counts the traces.

The setting is `backends.py`'s: a 2 × 256 `LanguageModel`, V = 10k, batch 1,
segments of 5, the default rule with gradient statistics from the stream,
1,500 tokens of Zipf-like ids (`--tokens`), and a second text of 1,238
tokens (`--other-tokens`: issue 43's lengths). In one fresh process per
backend, for each cell, in this order:

1. `collect_gradient_statistics` on the stream (its own compile; reported);
2. static scoring (`adapt=False`): the first call, then `--repeats` warm
   calls (median), then the other text's first call;
3. dynamic evaluation likewise.

Reported per backend and cell: seconds of each first call, the warm median,
the goal's bound `2 × warm + 2 s` and whether the first call is within it,
and the other text's milliseconds per token over the warm ones (1.0: it
cost what a warm call costs; above it, it compiled).

    python benchmarks/first_call.py             # quiet machine; ~5 minutes
    python benchmarks/first_call.py --backends jax --cells rlstm --repeats 1
"""

import _harness
import per_backend  # benchmarks/per_backend.py, beside this script

CELLS = {
    "rlstm": {"cell": "rlstm"},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
}
OTHER_TOKENS = 1238


def worker(args):
    import time

    import keras

    from keras_mogrifier import DynamicEvaluator

    backend = keras.backend.backend()
    stream = per_backend.zipf_stream(args)
    other = per_backend.zipf_stream(
        type(args)(**{**vars(args), "tokens": args.other_tokens}))[::-1].copy()
    rows = []
    for name in args.cells:
        model = per_backend.scoring_model(args, CELLS[name])
        evaluator = DynamicEvaluator(model, segment_length=5)
        start = time.perf_counter()
        evaluator.collect_gradient_statistics(stream, batch_size=1)
        row = {"cell": name, "statistics_first_seconds": time.perf_counter() - start}
        for adapt, kind in ((False, "static"), (True, "dynamic")):
            def call(text, a=adapt):
                return evaluator.evaluate(text, adapt=a, verbose=0)

            first = _harness.time_call(lambda: call(stream), repeats=1)
            warm = _harness.time_call(lambda: call(stream), repeats=args.repeats)
            other_first = _harness.time_call(lambda: call(other), repeats=1)
            row[f"{kind}_first_seconds"] = first.median
            row[f"{kind}_warm_seconds"] = warm.median
            row[f"{kind}_bound_seconds"] = 2 * warm.median + 2.0
            row[f"{kind}_first_within_bound"] = first.median <= 2 * warm.median + 2.0
            row[f"{kind}_other_length_over_warm_per_token"] = (
                other_first.median / args.other_tokens) / (warm.median / args.tokens)
        rows.append(row)
        print(f"{backend} {name}: static first {row['static_first_seconds']:.2f} s "
              f"(warm {row['static_warm_seconds']:.2f} s), dynamic first "
              f"{row['dynamic_first_seconds']:.2f} s (warm {row['dynamic_warm_seconds']:.2f} s); "
              f"other length {row['static_other_length_over_warm_per_token']:.2f}x / "
              f"{row['dynamic_other_length_over_warm_per_token']:.2f}x", flush=True)
    return rows


def main():
    args = per_backend.parse_arguments(
        __doc__.splitlines()[0], CELLS, repeats=3, json_name="first_call.json",
        more=lambda parser: parser.add_argument(
            "--other-tokens", type=int, default=OTHER_TOKENS,
            help="the second text's length (issue 43's: 1,238)"),
    )
    results = per_backend.run(__file__, args, worker)
    print("| cell | backend | statistics, first (s) | static: first / warm / bound (s) | "
          "dynamic: first / warm / bound (s) | other length / warm, per token "
          "(static, dynamic) |")
    print("| --- | --- | ---: | --- | --- | --- |")
    for cell, backend, row in per_backend.rows_by_cell(results, args.cells):
        print(f"| {cell} | {backend} | {row['statistics_first_seconds']:.1f} | "
              f"{row['static_first_seconds']:.2f} / {row['static_warm_seconds']:.2f} / "
              f"{row['static_bound_seconds']:.2f} | "
              f"{row['dynamic_first_seconds']:.2f} / {row['dynamic_warm_seconds']:.2f} / "
              f"{row['dynamic_bound_seconds']:.2f} | "
              f"{row['static_other_length_over_warm_per_token']:.2f}, "
              f"{row['dynamic_other_length_over_warm_per_token']:.2f} |")
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
