"""A model is compiled once, not once per text: scoring, dynamic evaluation
and the neural cache trace nothing new for a stream of another length.

Every call of `score_stream`'s scoring function holds `SEGMENTS_PER_CALL`
segments, or the rest after the last full call: a backend's loop runs one
program for any number of segments (JAX pads the segments on the host to a
power-of-two capacity and loops for the call's own number; TensorFlow's
first trace takes any number), and a windowed model's windows are
`context_length` columns also for a short stream. Counted here as
the model's Python `call` running: on JAX and TensorFlow it runs when a
function is traced, not when a compiled one runs.
"""

import keras
import numpy as np
import pytest

from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.evaluation import NeuralCache
from keras_mogrifier.evaluation._stream_scoring import SEGMENTS_PER_CALL
from keras_mogrifier.models import LanguageModel

import testing

VOCAB = 13
N = 3
pytestmark = [
    pytest.mark.compiled,  # what is counted is tracing
    pytest.mark.skipif(
        keras.backend.backend() == "torch", reason="PyTorch runs eagerly: nothing is traced"
    ),
]


class CountingLanguageModel(LanguageModel):
    calls = 0

    def call(self, inputs, training=False, return_features=False):
        CountingLanguageModel.calls += 1
        return super().call(inputs, training=training, return_features=return_features)


class CountingCausalMean(testing.CausalMean):
    calls = 0

    def call(self, x):
        CountingCausalMean.calls += 1
        return super().call(x)


def recurrent():
    keras.utils.set_random_seed(0)
    model = CountingLanguageModel(VOCAB, units=8, num_layers=1, batch_size=1)
    model(np.zeros((1, 2), "int32"))
    return model, CountingLanguageModel


def windowed():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((None,), dtype="int32"),
        keras.layers.Embedding(VOCAB, 4),
        CountingCausalMean(),
        keras.layers.Dense(VOCAB),
    ])
    return model, CountingCausalMean


def text(segments, extra, seed):
    """`segments` whole segments and `extra` more predicted tokens."""
    return np.random.default_rng(seed).integers(0, VOCAB, segments * N + extra + 1)


# Lengths with full calls and a rest, a short last segment or none, and a
# text shorter than one call.
FIRST = text(SEGMENTS_PER_CALL + 5, 2, 1)
OTHERS = [text(2 * SEGMENTS_PER_CALL + 9, 1, 2), text(SEGMENTS_PER_CALL + 1, 0, 3), text(4, 1, 4)]


def traces(counter, run):
    before = counter.calls
    run()
    return counter.calls - before


@pytest.mark.parametrize("family", ["recurrent", "windowed"])
def test_a_text_of_another_length_traces_nothing_new(family):
    model, counter = {"recurrent": recurrent, "windowed": windowed}[family]()
    context = 16 if family == "windowed" else None
    ev = DynamicEvaluator(model, update_rule="sgd", learning_rate=0.1, segment_length=N,
                          context_length=context)
    for adapt in (False, True):
        def run(stream):
            return lambda: ev.evaluate(stream, adapt=adapt, verbose=0)

        traces(counter, run(FIRST))  # compiles
        again = traces(counter, run(FIRST))  # the calls that are not tracing
        for other in OTHERS:
            assert traces(counter, run(other)) == again, (adapt, len(other))


@pytest.mark.parametrize("family", ["recurrent", "windowed"])
def test_the_first_text_compiles_one_program_for_its_full_calls_and_its_rest(family):
    """A stream's calls of `SEGMENTS_PER_CALL` segments and the one-segment
    calls of its rest run one compiled adaptation loop: the first dynamic
    evaluation of a text with a rest traces as much as that of a text of
    exactly one full call (issue 43: a second program made the first call
    of a model cost two compilations)."""
    context = 16 if family == "windowed" else None

    def first_traces(stream):
        model, counter = {"recurrent": recurrent, "windowed": windowed}[family]()
        ev = DynamicEvaluator(model, update_rule="sgd", learning_rate=0.1, segment_length=N,
                              context_length=context)
        return traces(counter, lambda: ev.evaluate(stream, verbose=0))

    assert first_traces(FIRST) == first_traces(text(SEGMENTS_PER_CALL, 0, 7))


def test_the_neural_cache_traces_nothing_new_for_another_length():
    model, counter = recurrent()
    cache = NeuralCache(model, cache_size=10, segment_length=N)
    traces(counter, lambda: cache.evaluate(FIRST, verbose=0))
    again = traces(counter, lambda: cache.evaluate(FIRST, verbose=0))
    for other in OTHERS:
        assert traces(counter, lambda: cache.evaluate(other, verbose=0)) == again, len(other)


def test_short_texts_share_a_power_of_two_window():
    """Texts shorter than the context are padded to a power of two columns:
    two lengths in one bucket trace once; the losses are those of the text
    alone in a window of its own length."""
    model, counter = windowed()
    ev = DynamicEvaluator(model, update_rule="sgd", segment_length=N, context_length=64)
    first, second = text(7, 1, 5), text(9, 2, 6)  # 22 and 29 columns: both 32
    traces(counter, lambda: ev.evaluate(first, adapt=False, verbose=0))
    again = traces(counter, lambda: ev.evaluate(first, adapt=False, verbose=0))
    assert traces(counter, lambda: ev.evaluate(second, adapt=False, verbose=0)) == again
    losses = ev.evaluate(second, adapt=False, verbose=0, return_token_losses=True)
    logits = keras.ops.convert_to_numpy(model(second[None, :-1])).astype("float64")[0]
    logits -= logits.max(-1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(
        losses["token_losses"][0], -log_p[np.arange(len(second) - 1), second[1:]],
        rtol=1e-5, atol=1e-5,
    )
