"""Adaptive generation on Penn Treebank: is a document's continuation more probable?

For `--documents` spans of the test split (each starting at a sentence;
`--split valid` to choose the settings),
the first `--prefix-tokens` tokens play the part of the document read so
far and the next `--continuation-tokens` its continuation. The continuation
is scored (`LanguageModel.score`, the prefix read as context) twice: by the
trained model, and inside `DynamicEvaluator.adapt_to(prefix)`, where the
model has been adapted to the prefix with Krause's rule. Gradient
statistics come from the training split. The report gives the perplexity
of the continuations under both, and how many documents the adaptation
helped. It also prints a continuation generated for the first document
with and without adaptation.

    python examples/ptb_word.py --data-dir DIR --save-model runs/ptb/model.keras ...
    python benchmarks/adaptive_generation.py --model runs/ptb/model.keras --data-dir DIR
"""

import math
import time

import _harness

_harness.environment()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402


def document_spans(ids, eos_id, count, length):
    """`count` spans of `length` tokens, evenly spread, each starting a sentence."""
    starts = []
    for target in np.linspace(0, len(ids) - length - 1, count).astype(int):
        after_eos = np.flatnonzero(ids[target:] == eos_id)
        start = target + int(after_eos[0]) + 1 if after_eos.size else target
        if start + length <= len(ids):
            starts.append(start)
    return [ids[s : s + length] for s in starts]


def main():
    parser = _harness.argument_parser(__doc__, data_dir="required")
    parser.add_argument("--model", required=True, help="a .keras LanguageModel with its vocabulary")
    parser.add_argument("--split", default="test", choices=("valid", "test"),
                        help="where the documents come from (tune on valid)")
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--prefix-tokens", type=int, default=300)
    parser.add_argument("--continuation-tokens", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--decay-rate", type=float, default=2e-3)
    parser.add_argument("--segment-length", type=int, default=5)
    parser.add_argument("--statistics-batches", type=int, default=500,
                        help="training batches for the gradient statistics")
    args = parser.parse_args()

    model = keras.saving.load_model(args.model)
    corpus = load_corpus(args.data_dir)
    if model.vocabulary is None or model.vocabulary != corpus.vocabulary:
        raise SystemExit("the model's vocabulary is not the corpus's (train it on this corpus)")
    evaluator = DynamicEvaluator(
        model, learning_rate=args.learning_rate, decay_rate=args.decay_rate,
        segment_length=args.segment_length,
    )
    start = time.time()
    capacity = int(model.recurrent_state_variables[0].shape[0])
    evaluator.collect_gradient_statistics(
        corpus.train, batch_size=min(capacity, 100), steps=args.statistics_batches
    )
    statistics_seconds = time.time() - start

    length = args.prefix_tokens + args.continuation_tokens
    spans = document_spans(corpus[args.split], corpus.vocabulary.eos_id, args.documents, length)
    n = args.continuation_tokens
    static, adapted = [], []
    start = time.time()
    for span in spans:
        prefix = span[: args.prefix_tokens]
        static.append(model.score(span)["token_log_probabilities"][-n:].sum())
        with evaluator.adapt_to(prefix) as adapted_model:
            adapted.append(adapted_model.score(span)["token_log_probabilities"][-n:].sum())
    seconds = time.time() - start
    static, adapted = np.array(static, "float64"), np.array(adapted, "float64")
    tokens = n * len(spans)
    results = {
        "model": args.model,
        "split": args.split,
        "documents": len(spans),
        "prefix_tokens": args.prefix_tokens,
        "continuation_tokens": n,
        "learning_rate": args.learning_rate,
        "decay_rate": args.decay_rate,
        "segment_length": args.segment_length,
        "static_continuation_perplexity": math.exp(-static.sum() / tokens),
        "adapted_continuation_perplexity": math.exp(-adapted.sum() / tokens),
        "static_mean_log_probability": float(static.mean()),
        "adapted_mean_log_probability": float(adapted.mean()),
        "documents_improved": int((adapted > static).sum()),
        "statistics_seconds": statistics_seconds,
        "seconds": seconds,
        "backend": keras.backend.backend(),
    }
    print(
        f"{len(spans)} {args.split} documents: {args.prefix_tokens} tokens read, the next "
        f"{n} scored (η={args.learning_rate:g}, λ={args.decay_rate:g}, "
        f"n={args.segment_length})"
    )
    print("| model | continuation perplexity | mean log-prob per document |")
    print("| --- | ---: | ---: |")
    print(f"| trained (prefix as context) | {results['static_continuation_perplexity']:.2f} | "
          f"{results['static_mean_log_probability']:.1f} |")
    print(f"| adapted to the prefix | {results['adapted_continuation_perplexity']:.2f} | "
          f"{results['adapted_mean_log_probability']:.1f} |")
    print(f"adaptation helped on {results['documents_improved']} of {len(spans)} documents")

    vocabulary = model.vocabulary
    prompt = vocabulary.to_tokens(spans[0][args.prefix_tokens - 12 : args.prefix_tokens])
    prompt = " ".join(prompt)
    kwargs = dict(max_length=12 + 25, sampler="top_p", p=0.9, seed=0, stop_token_ids=None)
    results["sample_prompt"] = prompt
    results["sample_static"] = model.generate(prompt, **kwargs)
    with evaluator.adapt_to(spans[0][: args.prefix_tokens]) as adapted_model:
        results["sample_adapted"] = adapted_model.generate(prompt, **kwargs)
    print(f"\nprompt (end of document 0's prefix): {prompt}")
    print(f"trained: ... {results['sample_static'][len(prompt):]}")
    print(f"adapted: ... {results['sample_adapted'][len(prompt):]}")
    if args.json:
        _harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
