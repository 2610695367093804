"""What the embedded corpus is made of, and what n-gram models and a cache make of it.

Counts the documents, sentences, names and `<unk>` of the default
`synthetic_corpus()`, and the validation perplexity of a unigram model
(add-0.1), of bigram models (add-k, k in 0.003 … 0.1), and of the best-k
bigram mixed with a unigram cache of the current document (reset at each
blank line): how much there is to gain by adapting to the document as it
is read.

    python benchmarks/synthetic_corpus.py --json benchmarks/results/synthetic_corpus.json
"""

import collections
import json
import time

import numpy as np

import _harness

from keras_mogrifier.data import synthetic
from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.data import synthetic_lines


def perplexity(log_probabilities):
    return float(np.exp(-np.mean(log_probabilities)))


def main(argv=None):
    args = _harness.argument_parser(__doc__).parse_args(argv)
    start = time.process_time()
    synthetic._lines.__wrapped__(120_000, 0, "train")
    generation_cpu = time.process_time() - start
    corpus = synthetic_corpus()
    vocab = corpus.vocabulary
    train, valid = corpus.train.tolist(), corpus.valid.tolist()
    n, size = len(train), len(vocab)
    counts = collections.Counter(train)
    lines = synthetic_lines(100_000)
    sentences = [line for line in lines if line]
    documents = sum(1 for line in lines if not line) + 1
    names = set(synthetic._PERSON_POOL) | set(synthetic._COMPANY_POOL)
    results = {
        "cpu_seconds_for_120k_tokens": generation_cpu,
        "vocabulary": size,
        "tokens": {s: len(corpus[s]) for s in ("train", "valid", "test")},
        "unk_share": counts[vocab.unk_id] / n,
        "training_documents": documents,
        "tokens_per_document": n / documents,
        "tokens_per_sentence": sum(len(s.split()) + 1 for s in sentences) / len(sentences),
        "name_token_share": sum(1 for t in train if vocab.tokens[t] in names) / n,
        "names_in_vocabulary": sum(1 for t in vocab.tokens if t in names),
        "valid_perplexity": {},
    }
    ppl = results["valid_perplexity"]
    ppl["unigram add-0.1"] = perplexity(
        [np.log((counts[b] + 0.1) / (n + 0.1 * size)) for b in valid[1:]]
    )
    pairs = collections.Counter(zip(train[:-1], train[1:]))

    def bigram(a, b, k):
        return (pairs[(a, b)] + k) / (counts[a] + k * size)

    for k in (0.003, 0.01, 0.03, 0.1):
        ppl[f"bigram add-{k:g}"] = perplexity(
            [np.log(bigram(a, b, k)) for a, b in zip(valid[:-1], valid[1:])]
        )
    eos = vocab.eos_id
    for k, weight in ((0.01, 0.1), (0.03, 0.1)):
        cache, total, logs, previous = collections.Counter(), 0, [], None
        for a, b in zip(valid[:-1], valid[1:]):
            if a == eos and previous == eos:  # a blank line: a new document
                cache, total = collections.Counter(), 0
            p = bigram(a, b, k)
            if total:
                p = (1 - weight) * p + weight * cache[b] / total
            logs.append(np.log(p))
            cache[b] += 1
            total += 1
            previous = a
        ppl[f"bigram add-{k:g} + document cache {weight:g}"] = perplexity(logs)
    print(json.dumps(results, indent=2))
    if args.json:
        _harness.write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
