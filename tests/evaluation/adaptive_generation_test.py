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


def _replayed_document_state(model, ids, after_segment, n):
    """The state dynamic evaluation reaches: each segment read with the
    weights of the segment before (the trained ones for the first)."""
    trained = _values(model.trainable_variables)
    for v in model.recurrent_state_variables:
        v.assign(np.zeros(v.shape, "float32"))
    inputs = ids[:-1]
    for s, start in enumerate(range(0, len(inputs), n)):
        weights = trained if s == 0 else after_segment[s - 1]
        for v, w in zip(model.trainable_variables, weights):
            v.assign(w)
        model(inputs[None, start : start + n])
    for v, w in zip(model.trainable_variables, trained):
        v.assign(w)
    return _values(model.recurrent_state_variables)


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_adapted_weights_and_state_are_what_evaluate_reaches_and_are_restored(trained):
    model, evaluator = trained
    model.set_temperature(0.7)
    ids = WORDS.to_ids(DOCUMENT.split())
    assert (len(ids) - 1) % evaluator.segment_length != 0  # a short last segment
    capture = CaptureVariables(model.trainable_variables)
    evaluated = evaluator.evaluate(ids, verbose=0, callbacks=[capture])
    expected_state = _replayed_document_state(
        model, ids, capture.after_segment, evaluator.segment_length
    )
    rng = np.random.default_rng(1)
    for v in model.recurrent_state_variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    before, states = _values(model.variables), _values(model.recurrent_state_variables)
    with evaluator.adapt_to(DOCUMENT) as adapted:
        assert adapted is model
        # Two compiled programmes (a call per segment, with the callback,
        # and `adapt_to`'s calls of many): the same steps, rounded apart
        # under XLA.
        for v, expected in zip(model.trainable_variables, capture.after_segment[-1]):
            np.testing.assert_allclose(to_numpy(v), expected, rtol=1e-6, atol=1e-6)
        assert evaluator.adaptation_results["loss"] == pytest.approx(evaluated["loss"], rel=1e-6)
        # Row 0 of the carried state is the document's (all but its last
        # token read), the other rows start from zero.
        for v, expected in zip(model.recurrent_state_variables, expected_state):
            np.testing.assert_allclose(to_numpy(v)[0], expected[0], atol=1e-5)
            np.testing.assert_array_equal(to_numpy(v)[1:], 0.0)
        model(np.zeros((4, 3), "int32"))  # the block moves the state
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)
    # The caller's carried state is back, too.
    for v, b in zip(model.recurrent_state_variables, states):
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


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
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


# 57 tokens: 56 predicted, whole segments of 4, so a block on DOCUMENT_57 + P
# and one on DOCUMENT_57 followed by P read in `generate` segment alike.
DOCUMENT_57 = DOCUMENT + "the big red"
PROMPT = "a cat sat on a mat <eos> a cat sat on a mat <eos> a cat"  # 4 segments of 4


def test_generate_continues_the_document_from_its_state(trained):
    model, evaluator = trained
    with evaluator.adapt_to(DOCUMENT) as adapted:
        inside = _values(model.variables)  # weights and carried state
        text = evaluator.generate(max_length=12, sampler="greedy", keep_adapting=False)
        ids = evaluator.generate(max_length=3, prompt=[0, 10], sampler="greedy")
        # Weights and state are the block's afterwards.
        for v, b in zip(model.variables, inside):
            np.testing.assert_array_equal(to_numpy(v), b)
        assert ids.dtype == np.int32 and list(ids[:2]) == [0, 10] and len(ids) == 3
        # The same continuation, step by step from the block's state: the
        # document's last token first, then each argmax, up to <eos>.
        token, expected = WORDS.eos_id, []
        while len(expected) < 12:
            token = int(np.argmax(to_numpy(adapted(np.full((4, 1), token, "int32")))[0, -1]))
            expected.append(token)
            if token == WORDS.eos_id:
                break
    assert text == " ".join(WORDS.to_tokens(expected))
    assert text == "the big red dog ran on the mat <eos>"


def test_generate_keeps_adapting_on_what_it_reads_and_samples(trained):
    """Krause §3/§7.4: sample a segment with fixed weights, then take the
    dynamic-evaluation step on it. Reading PROMPT inside `generate` adapts
    as a block over the document followed by PROMPT does, and both go on
    adapting alike while sampling."""
    model, evaluator = trained
    assert len(WORDS.to_ids(DOCUMENT_57.split())) == 57
    # A learning rate at which the 16 prompt tokens' adaptation changes what
    # greedy decoding picks (at the fixture's 3e-3 it did not on TensorFlow).
    evaluator.learning_rate = 1e-2
    try:
        with evaluator.adapt_to(DOCUMENT_57):
            adapting = evaluator.generate(max_length=28, prompt=PROMPT, sampler="greedy",
                                          stop_token_ids=None)
            fixed = evaluator.generate(max_length=28, prompt=PROMPT, sampler="greedy",
                                       stop_token_ids=None, keep_adapting=False)
        with evaluator.adapt_to(DOCUMENT_57 + " " + PROMPT):
            continued = evaluator.generate(max_length=12, sampler="greedy",
                                           stop_token_ids=None)
    finally:
        evaluator.learning_rate = 3e-3
    assert adapting.startswith(PROMPT + " ")
    assert adapting[len(PROMPT) + 1 :] == continued
    # Adapting on "a cat sat on a mat" twice moves the continuation away
    # from the document's sentence, which the fixed weights go back to.
    assert adapting != fixed


def test_generate_errors_and_leaves_the_model_untouched(trained):
    model, evaluator = trained
    before = _values(model.variables)
    with pytest.raises(ValueError, match="inside `with evaluator.adapt_to"):
        evaluator.generate(max_length=5)
    with evaluator.adapt_to(DOCUMENT):
        inside = _values(model.variables)
        with pytest.raises(ValueError, match="one token per step"):
            evaluator.generate(max_length=5, sampler="beam")
        with pytest.raises(ValueError, match="Expected `max_length`"):
            evaluator.generate(max_length=0)
        with pytest.raises(ValueError, match="exceed the prompt"):
            evaluator.generate(max_length=2, prompt="the big red")
        with pytest.raises(ValueError, match="Expected `keep_adapting` to be a bool"):
            evaluator.generate(max_length=5, keep_adapting="yes")
        with pytest.raises(ValueError, match=r"token ids in \[0, 12\)"):
            evaluator.generate(max_length=5, prompt=[1, 12])
        for v, b in zip(model.variables, inside):
            np.testing.assert_array_equal(to_numpy(v), b)
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)
