"""Generate text with a saved language model, optionally adapted to a document.

    python examples/generate.py --model runs/main/model.keras --prompt "the company said"
    python examples/generate.py --model M --prompt "the" --prompt "in the" \\
        --sampler top_p --p 0.9 --temperature 0.9 --seed 1 --max-length 40
    python examples/generate.py --model M --prompt "the company said" \\
        --adapt-to article.txt --statistics-data ptb.train.txt
    python examples/generate.py --model M --score "the stock fell sharply <eos>"

The model must carry its vocabulary (`LanguageModel(vocabulary=...)`; the
main job's `runs/main/model.keras` does). With `--adapt-to FILE` the model
is first adapted to the text of FILE by dynamic evaluation
(`DynamicEvaluator.adapt_to`), and every prompt is continued (and every
`--score` text scored) twice: by the trained model and by the adapted one.
The gradient statistics of dynamic evaluation come from
`--statistics-data` (training text, e.g. `ptb.train.txt`), else from FILE
itself. All the logic lives in the library; this script only reads flags.
"""

import argparse
import sys

import _quiet  # noqa: F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402

from keras_mogrifier.data import read_lines  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402
from keras_mogrifier.generation import encode  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="a saved .keras LanguageModel")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    parser.add_argument("--score", action="append", default=[],
                        help="a text to score (repeatable; its first token is context)")
    parser.add_argument("--max-length", type=int, default=30,
                        help="output length in tokens, prompt included")
    parser.add_argument("--sampler", default="top_p", choices=("greedy", "top_k", "top_p", "random"))
    parser.add_argument("--k", type=int, help="k of top_k (default 5)")
    parser.add_argument("--p", type=float, help="p of top_p (default 0.9 here)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-stop", action="store_true", help="do not stop at <eos>")
    parser.add_argument("--adapt-to", metavar="FILE", help="adapt the model to this text file first")
    parser.add_argument("--statistics-data", metavar="FILE",
                        help="training text for the gradient statistics of --adapt-to")
    parser.add_argument("--statistics-tokens", type=int, default=200_000,
                        help="use at most this many tokens of --statistics-data")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="η of dynamic evaluation")
    parser.add_argument("--decay-rate", type=float, default=2e-3, help="λ of dynamic evaluation")
    parser.add_argument("--segment-length", type=int, default=5)
    args = parser.parse_args(argv)
    if not args.prompt and not args.score:
        parser.error("give at least one --prompt or --score")
    if args.sampler == "top_p" and args.p is None:
        args.p = 0.9
    return args


def read_text(path, vocabulary, limit=None):
    """The token ids of a text file (one sentence per line, as the corpora)."""
    ids = encode(vocabulary, "\n".join(read_lines(path)) + "\n", where=path)
    return ids[:limit] if limit else ids


def run(model, args, label):
    kwargs = dict(
        max_length=args.max_length, sampler=args.sampler, k=args.k, p=args.p,
        temperature=args.temperature, seed=args.seed,
        stop_token_ids=None if args.no_stop else "auto",
    )
    if args.prompt:
        print(f"{label}:")
        for text in model.generate(args.prompt, **kwargs):
            print(f"  {text}")
    for result, text in zip(model.score(args.score) if args.score else [], args.score):
        print(
            f"  score {text!r}: log-probability {result['log_probability']:.2f} over "
            f"{result['num_tokens']} tokens, perplexity {result['perplexity']:.2f}"
        )


def main(argv=None):
    args = parse_args(argv)
    model = keras.saving.load_model(args.model)
    if model.vocabulary is None:
        raise SystemExit(f"{args.model} carries no vocabulary: build it with `vocabulary=`")
    run(model, args, "trained model")
    if args.adapt_to:
        document = read_text(args.adapt_to, model.vocabulary)
        statistics = (
            read_text(args.statistics_data, model.vocabulary, args.statistics_tokens)
            if args.statistics_data
            else document
        )
        evaluator = DynamicEvaluator(
            model, learning_rate=args.learning_rate, decay_rate=args.decay_rate,
            segment_length=args.segment_length,
        )
        capacity = int(model.recurrent_state_variables[0].shape[0])
        streams = max(1, min(capacity, len(statistics) // (4 * (args.segment_length + 1))))
        evaluator.collect_gradient_statistics(statistics, batch_size=streams)
        with evaluator.adapt_to(document) as adapted:
            loss = evaluator.adaptation_results["perplexity"]
            run(adapted, args, f"adapted to {args.adapt_to} "
                f"({len(document)} tokens, perplexity {loss:.2f} while adapting)")


if __name__ == "__main__":
    main(sys.argv[1:])
