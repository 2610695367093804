"""DynamicEvaluator.adapt_to: the model handed back adapted to a document."""

import keras
import numpy as np
import pytest
from testing import CaptureVariables
from testing import to_numpy

from keras_mogrifier.data import Vocabulary
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.models import LanguageModel

WORDS = Vocabulary(["the", "<eos>", "a", "cat", "dog", "sat", "ran", "on", "mat", "<unk>", "big", "red"])
V = len(WORDS)


def _sentence(rng):
    adjectives = [[], ["big"], ["red"], ["big", "red"]][rng.integers(4)]
    return (
        [str(rng.choice(["the", "a"]))] + adjectives
        + [str(rng.choice(["cat", "dog"])), str(rng.choice(["sat", "ran"])), "on",
           str(rng.choice(["the", "a"])), "mat", "<eos>"]
    )


@pytest.fixture(scope="module")
def trained():
    """A small model trained on sentences where every choice is a coin flip."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    train = WORDS.to_ids([t for _ in range(300) for t in _sentence(rng)])
    model = LanguageModel(V, units=16, num_layers=1, cell="lstm", batch_size=4, vocabulary=WORDS)
    model.compile(
        optimizer=keras.optimizers.Adam(2e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    length, window = len(train) // 4, 10
    streams = train[: 4 * length].reshape(4, length)
    starts = range(0, length - window, window)
    x = np.concatenate([streams[:, s : s + window] for s in starts])
    y = np.concatenate([streams[:, s + 1 : s + window + 1] for s in starts])
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    evaluator = DynamicEvaluator(model, learning_rate=3e-3, decay_rate=0.0, segment_length=4)
    evaluator.collect_gradient_statistics(train, batch_size=4)
    return model, evaluator


# One of the 32 sentences of the training language, again and again.
DOCUMENT = "the big red dog ran on the mat <eos> " * 6


def _values(variables):
    return [to_numpy(v).copy() for v in variables]


def test_adapted_weights_are_those_evaluate_reaches_and_are_restored(trained):
    model, evaluator = trained
    model.set_temperature(0.7)
    ids = WORDS.to_ids(DOCUMENT.split())
    capture = CaptureVariables(model.trainable_variables)
    evaluated = evaluator.evaluate(ids, verbose=0, callbacks=[capture])
    rng = np.random.default_rng(1)
    for v in model.recurrent_state_variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    before, states = _values(model.variables), _values(model.recurrent_state_variables)
    with evaluator.adapt_to(DOCUMENT) as adapted:
        assert adapted is model
        for v, expected in zip(model.trainable_variables, capture.after_segment[-1]):
            np.testing.assert_array_equal(to_numpy(v), expected)
        assert evaluator.adaptation_results["loss"] == evaluated["loss"]
        # The carried state is the caller's inside the block too.
        for v, b in zip(model.recurrent_state_variables, states):
            np.testing.assert_array_equal(to_numpy(v), b)
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)
    model.set_temperature(1.0)


def test_continuation_is_more_probable_and_generation_follows_the_document(trained):
    model, evaluator = trained
    continuation = "the big red dog ran on the mat <eos>"
    static = model.score(DOCUMENT + continuation)["token_log_probabilities"][-9:].sum()
    with evaluator.adapt_to(DOCUMENT) as adapted:
        adaptive = adapted.score(DOCUMENT + continuation)["token_log_probabilities"][-9:].sum()
        text = adapted.generate("the big", max_length=10)
    # Unadapted, every coin flip costs ln 2 (5 flips after "the big").
    assert static < -3.0 and adaptive > static + 1.0
    assert text == "the big red dog ran on the mat <eos>"
    assert model.generate("the big", max_length=10) != text


def test_restored_after_an_error_and_nested_blocks(trained):
    model, evaluator = trained
    before = _values(model.variables)
    with pytest.raises(RuntimeError, match="inside"):
        with evaluator.adapt_to(DOCUMENT):
            raise RuntimeError("inside")
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)
    with evaluator.adapt_to(DOCUMENT):
        outer = _values(model.trainable_variables)
        with evaluator.adapt_to("a cat sat on a mat"):
            assert any(
                not np.array_equal(to_numpy(v), o) for v, o in zip(model.trainable_variables, outer)
            )
        for v, o in zip(model.trainable_variables, outer):
            np.testing.assert_array_equal(to_numpy(v), o)
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)


def test_adapt_to_errors(trained):
    model, evaluator = trained
    with pytest.raises(ValueError, match="Expected one document"):
        with evaluator.adapt_to(np.zeros((2, 5), "int32")):
            pass
    with pytest.raises(ValueError, match="at least 2 tokens"):
        with evaluator.adapt_to("the"):
            pass
    bare = LanguageModel(V, units=4, num_layers=1, cell="lstm", batch_size=1)
    bare.build((1, None))
    fresh = DynamicEvaluator(bare)
    with pytest.raises(ValueError, match="Expected a vocabulary to read a text `document`"):
        with fresh.adapt_to("the cat"):
            pass
    with pytest.raises(ValueError, match="Expected gradient statistics"):
        with fresh.adapt_to([1, 2, 3]):
            pass
