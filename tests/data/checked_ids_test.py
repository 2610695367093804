"""A corpus's ids are checked once, when it is made, not by every consumer."""

import numpy as np
import pytest

from keras_mogrifier import _validation
from keras_mogrifier.data import Corpus
from keras_mogrifier.data import StreamDataset
from keras_mogrifier.data import Vocabulary
from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.evaluation.temperature import search_temperature
from keras_mogrifier.models import LanguageModel


@pytest.fixture
def scans(monkeypatch):
    """The arrays `token_ids` scans (min/max over every id)."""
    seen = []
    original = _validation.scan_token_ids

    def counting(name, array, vocabulary_size, at=""):
        seen.append(array.size)
        return original(name, array, vocabulary_size, at)

    monkeypatch.setattr(_validation, "scan_token_ids", counting)
    return seen


def test_corpus_arrays_are_read_only_and_known_with_their_views():
    corpus = synthetic_corpus(train_tokens=2000, valid_tokens=300, test_tokens=300)
    size = len(corpus.vocabulary)
    for split in ("train", "valid", "test"):
        ids = corpus[split]
        assert not ids.flags.writeable
        assert _validation.known_token_bound(ids) == size
        assert _validation.known_token_bound(ids[5:50]) == size
        assert _validation.known_token_bound(ids[:200].reshape(10, 20)) == size
        with pytest.raises(ValueError, match="read-only"):
            ids[0] = 0
    # A copy is the caller's to change: it is not known.
    copy = corpus.train.copy()
    assert _validation.known_token_bound(copy) is None
    # A bound only helps a vocabulary at least that large.
    assert _validation.ids_known_below(corpus.valid, size)
    assert not _validation.ids_known_below(corpus.valid, size - 1)
    # Arrays given to Corpus are copied: the caller's stays writable.
    mine = np.array([0, 1, 0])
    Corpus({"train": mine}, Vocabulary(["<eos>", "a"]))
    assert mine.flags.writeable


def test_every_consumer_skips_the_scan_of_corpus_ids(scans):
    corpus = synthetic_corpus(train_tokens=3000, valid_tokens=400, test_tokens=300)
    model = LanguageModel(len(corpus.vocabulary), units=8, num_layers=1, batch_size=4)
    model.build((4, None))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    data = StreamDataset(corpus.train, batch_size=4, sequence_length=10, max_batches=3)
    data.check_token_ids(len(corpus.vocabulary))
    model.fit(data, epochs=1, shuffle=False, verbose=0)
    search_temperature(model, corpus.valid, batch_size=4, sequence_length=10)
    evaluator = DynamicEvaluator(model, segment_length=5)
    evaluator.collect_gradient_statistics(corpus.train, batch_size=4, steps=3)
    evaluator.evaluate(corpus.test[:31], verbose=0)
    model.score(corpus.test[:20])
    assert scans == []
    # The same work on a writable copy scans (so the test can fail).
    StreamDataset(corpus.train.copy(), batch_size=4, sequence_length=10)
    evaluator.evaluate(corpus.test[:31].copy(), verbose=0)
    assert len(scans) >= 2


def test_bad_ids_are_still_found_where_they_are_not_a_corpus(scans):
    corpus = synthetic_corpus(train_tokens=2000, valid_tokens=300, test_tokens=300)
    size = len(corpus.vocabulary)
    bad = corpus.test.copy()
    bad[7] = size
    model = LanguageModel(size, units=8, num_layers=1, batch_size=1)
    model.build((1, None))
    with pytest.raises(ValueError, match=f"an id {size}"):
        DynamicEvaluator(model).evaluate(bad, verbose=0, adapt=False)
    with pytest.raises(ValueError, match=rf"\[0, {size}\)"):
        StreamDataset(bad, batch_size=2, sequence_length=5).check_token_ids(size)
    # A corpus refuses bad ids when it is made.
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        Corpus({"train": np.array([0, 2])}, Vocabulary(["<eos>", "a"]))
