import collections
import time

import numpy as np
import pytest

from keras_mogrifier.data import synthetic
from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.data import synthetic_lines

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite


def test_deterministic_and_seeded():
    a = synthetic_corpus(train_tokens=3000, valid_tokens=500, test_tokens=500)
    b = synthetic_corpus(train_tokens=3000, valid_tokens=500, test_tokens=500)
    assert a.vocabulary == b.vocabulary
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(a[split], b[split])
    c = synthetic_corpus(train_tokens=3000, valid_tokens=500, test_tokens=500, seed=1)
    assert not np.array_equal(
        a.vocabulary.to_tokens(a.valid[:50]), c.vocabulary.to_tokens(c.valid[:50])
    )
    # Splits are independent streams: valid does not depend on the train size.
    assert synthetic_lines(500, split="valid") == synthetic_lines(500, split="valid")
    assert (
        synthetic_lines(2000, split="train")[:20]
        == synthetic_lines(500, split="train")[:20]
    )
    assert synthetic_lines(500, split="train") != synthetic_lines(500, split="valid")
    # A pinned sentence guards against accidental changes of the generator.
    assert synthetic_lines(30)[0] == synthetic._lines.__wrapped__(30, 0, "train")[0]


def test_fast_generation_of_the_default_size():
    start = time.perf_counter()
    lines = synthetic._lines.__wrapped__(120_000, 123, "train")  # bypass the cache
    elapsed = time.perf_counter() - start
    assert sum(len(line.split()) + 1 for line in lines) >= 120_000
    assert elapsed < 2.0  # ~0.15 s on one core; generous for a shared machine


def test_sizes_vocabulary_and_special_tokens():
    corpus = synthetic_corpus()
    assert corpus.source == "synthetic"
    for split, size in (("train", 100_000), ("valid", 10_000), ("test", 10_000)):
        assert size <= len(corpus[split]) < size + 100
    vocab = corpus.vocabulary
    assert 800 <= len(vocab) <= 1500
    assert vocab.unk_id is not None and vocab.eos_id is not None
    counts = np.bincount(corpus.train, minlength=len(vocab))
    assert 0.01 < counts[vocab.unk_id] / counts.sum() < 0.1
    # Lower case, PTB-like text; numbers are the token N.
    assert "N" in vocab and "the" in vocab


def _entropies(tokens):
    unigram = collections.Counter(tokens)
    n = len(tokens)
    h1 = -sum(c / n * np.log2(c / n) for c in unigram.values())
    pairs = collections.Counter(zip(tokens[:-1], tokens[1:]))
    h2 = -sum(c / (n - 1) * np.log2(c / unigram[a]) for (a, _), c in pairs.items())
    return h1, h2, unigram, pairs


def test_learnable_well_below_unigram_perplexity():
    corpus = synthetic_corpus()
    train, valid = corpus.train.tolist(), corpus.valid.tolist()
    h1, h2, unigram, pairs = _entropies(train)
    assert h1 > 6.5  # unigram perplexity > 90
    assert h2 < h1 - 2.0  # a bigram model already removes > 2 bits per token
    # Held out: an add-0.1 bigram model beats the unigram model by > 3x.
    v, n = len(corpus.vocabulary), len(train)
    uni = [(unigram[b] + 0.1) / (n + 0.1 * v) for b in valid[1:]]
    bi = [
        (pairs[(a, b)] + 0.1) / (unigram[a] + 0.1 * v)
        for a, b in zip(valid[:-1], valid[1:])
    ]
    ppl_uni = np.exp(-np.mean(np.log(uni)))
    ppl_bi = np.exp(-np.mean(np.log(bi)))
    assert ppl_bi < ppl_uni / 3


def test_agreement_is_long_range_structure():
    # Verb number follows the subject's number across an intervening phrase:
    # 'the analysts who ...' never continue with a singular present verb
    # right after the relative clause; checked on pronoun subjects directly.
    lines = synthetic_lines(50_000)
    after = collections.Counter()
    for line in lines:
        words = line.split()
        for a, b in zip(words, words[1:]):
            if a in ("he", "she", "they", "we"):
                after[(a in ("he", "she"), b)] += 1
    assert after[(True, "says")] > 0 and after[(False, "say")] > 0
    assert after[(True, "say")] == 0 and after[(False, "says")] == 0


def test_char_level_and_argument_errors():
    corpus = synthetic_corpus(
        level="char", train_tokens=2000, valid_tokens=300, test_tokens=300
    )
    assert " " in corpus.vocabulary and "<eos>" in corpus.vocabulary
    assert len(corpus.vocabulary) < 60
    with pytest.raises(ValueError, match="train_tokens"):
        synthetic_corpus(train_tokens=0)
    with pytest.raises(ValueError, match="seed"):
        synthetic_corpus(seed=-1)
    with pytest.raises(ValueError, match="level"):
        synthetic_corpus(level="bytes")
    with pytest.raises(ValueError, match="split"):
        synthetic_lines(10, split="")


def _documents(lines):
    documents, current = [], []
    for line in lines:
        if line == "":
            documents.append(current)
            current = []
        else:
            current.append(line.split())
    return documents


def test_documents_repeat_their_own_names_and_topic():
    """Documents, separated by a blank line (an <eos> alone), each with its
    own people and companies: a name seen in a document is far more likely
    to come back in it than in any other document."""
    lines = synthetic_lines(60_000)
    documents = _documents(lines)
    assert 150 < len(documents) < 400
    lengths = [sum(len(s) + 1 for s in d) for d in documents]
    assert 150 < np.mean(lengths) < 450 and min(len(d) for d in documents) >= 6
    names = set(synthetic._PERSON_POOL) | set(synthetic._COMPANY_POOL)
    assert len(synthetic._PERSON_POOL) == 300 and len(synthetic._COMPANY_POOL) == 200
    # Names are the pools' own (no grammar word among them).
    assert not names & synthetic._grammar_words() - set(synthetic._PERSON_NAMES) - set(
        synthetic._COMPANY_NAMES
    )
    repeated, mentions, seen_elsewhere = 0, 0, 0
    for k, document in enumerate(documents[:-1]):
        words = [w for sentence in document for w in sentence]
        doc_names = [w for w in words if w in names]
        counts = collections.Counter(doc_names)
        mentions += len(doc_names)
        repeated += sum(c for c in counts.values() if c > 1)
        # The next document: how often does it name this one's main entity?
        main = counts.most_common(1)[0][0] if counts else None
        nxt = [w for sentence in documents[k + 1] for w in sentence]
        seen_elsewhere += main is not None and main in nxt
    # Most name mentions repeat a name of the same document...
    assert repeated / mentions > 0.7
    # ...and a document's main name is rarely in the next one.
    assert seen_elsewhere / (len(documents) - 1) < 0.15
    # A topic: the document's most frequent noun of the topic lists is far
    # more frequent inside it than in the corpus as a whole.
    topic_nouns = {n for t in synthetic._TOPICS for pair in t["things"] for n in pair}
    overall = collections.Counter(w for line in lines for w in line.split() if w in topic_nouns)
    total = sum(overall.values())
    ratios = []
    for document in documents:
        inside = collections.Counter(w for s in document for w in s if w in topic_nouns)
        if sum(inside.values()) >= 10:
            word, count = inside.most_common(1)[0]
            ratios.append((count / sum(inside.values())) / (overall[word] / total))
    assert np.median(ratios) > 4


def test_the_document_structure_is_in_the_corpus_ids():
    corpus = synthetic_corpus(train_tokens=20_000, valid_tokens=2_000, test_tokens=2_000)
    eos = corpus.vocabulary.eos_id
    ids = corpus.train
    # A blank line between documents: two <eos> in a row.
    boundaries = np.flatnonzero((ids[:-1] == eos) & (ids[1:] == eos))
    assert 40 < len(boundaries) < 120
