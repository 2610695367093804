"""Static scoring of a stateful LanguageModel in windows of many segments.

Without adaptation nothing changes the weights between segments, so
`DynamicEvaluator.evaluate(..., adapt=False)` scores a call's `K` segments
of a stateful `LanguageModel` as one window of `K · n` tokens (one model
call instead of `K`: on PyTorch, where every call pays Keras's layer
machinery, 4× less time per token). These tests compare that path with the
segment-by-segment one (`_dynamic_pass.WHOLE_WINDOW = False`) and with one
pass of the model over the whole stream, and check where each path is taken.
"""

import keras
import numpy as np
import pytest
from segment_loop_test import CountCalls
from testing import to_numpy

from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.evaluation import _stream_scoring
from keras_mogrifier.evaluation import _dynamic_pass
from keras_mogrifier.evaluation import dynamic_evaluator
from keras_mogrifier.models import LanguageModel

VOCAB = 17


def model_for(cell, batch=1, stateful=True, **options):
    keras.utils.set_random_seed(3)
    model = LanguageModel(
        vocabulary_size=VOCAB, units=8, num_layers=2, cell=cell, batch_size=batch,
        stateful=stateful, **options,
    )
    model(np.zeros((batch, 3), "int32"))
    # Weights far from the initial ones: losses that differ from token to
    # token and depend on the context.
    rng = np.random.default_rng(7)
    for v in model.trainable_variables:
        v.assign(rng.normal(0.0, 0.6, v.shape).astype("float32"))
    return model


def one_pass_losses(model, stream):
    """Token losses of one call of the model on the whole stream (float64)."""
    model.reset_states()
    logits = to_numpy(model(stream[None, :-1], training=False)).astype("float64")[0]
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -log_probs[np.arange(len(stream) - 1), stream[1:]]


def score(model, streams, monkeypatch, whole, **options):
    monkeypatch.setattr(_dynamic_pass, "WHOLE_WINDOW", whole)
    evaluator = DynamicEvaluator(model, segment_length=5)
    counter = CountCalls(evaluator)
    result = evaluator.evaluate(
        streams, adapt=False, verbose=0, return_token_losses=True, **options
    )
    return result, counter.calls


@pytest.mark.parametrize(
    "cell, options",
    [
        ("lstm", {}),
        ("rlstm", {}),
        ("mogrifier_rlstm", {"mogrifier_rounds": 3}),
        ("mogrifier_lstm", {"mogrifier_rounds": 2, "dual": True}),
        ("lstm", {"mixture_of_softmaxes": 2}),
    ],
)
def test_windows_score_like_segments_and_like_one_pass(cell, options, monkeypatch):
    model = model_for(cell, **options)
    stream = np.random.default_rng(0).integers(0, VOCAB, 34)  # 33 predicted: 6 × 5 + 3
    monkeypatch.setattr(dynamic_evaluator, "SEGMENTS_PER_CALL", 4)
    monkeypatch.setattr(_stream_scoring, "SEGMENTS_PER_CALL", 4)
    states = [to_numpy(v).copy() for v in model.recurrent_state_variables]
    whole, calls = score(model, stream, monkeypatch, True)
    # 7 segments: windows of 4 segments, the second padded with one at weight 0.
    assert calls == {"forward": 2}
    for v, s in zip(model.recurrent_state_variables, states):
        np.testing.assert_array_equal(to_numpy(v), s)
    segments, calls = score(model, stream, monkeypatch, False)
    assert calls == {"forward_loop": 2}
    np.testing.assert_allclose(
        whole["token_losses"], segments["token_losses"], rtol=1e-6, atol=1e-6
    )
    assert whole["num_tokens"] == segments["num_tokens"] == 33
    np.testing.assert_allclose(
        whole["token_losses"][0], one_pass_losses(model, stream), rtol=1e-5, atol=1e-6
    )


def test_a_compiling_backend_pads_the_last_window_and_pytorch_does_not(monkeypatch):
    """One compiled shape for every window where new shapes compile (JAX,
    TensorFlow); on PyTorch (eager) the last window is the rest of the
    text: padding would be work for nothing."""
    model = model_for("rlstm")
    stream = np.random.default_rng(5).integers(0, VOCAB, 34)  # 7 segments
    monkeypatch.setattr(dynamic_evaluator, "SEGMENTS_PER_CALL", 4)
    monkeypatch.setattr(_stream_scoring, "SEGMENTS_PER_CALL", 4)
    evaluator = DynamicEvaluator(model, segment_length=5)
    original, shapes = evaluator._step, []

    def step(kind, *args, **kwargs):
        built = original(kind, *args, **kwargs)
        return lambda x, y: shapes.append(tuple(x.shape)) or built(x, y)

    evaluator._step = step
    result = evaluator.evaluate(stream, adapt=False, verbose=0, return_token_losses=True)
    last = (1, 15) if keras.backend.backend() == "torch" else (1, 20)
    assert shapes == [(1, 20), last]
    np.testing.assert_allclose(
        result["token_losses"][0], one_pass_losses(model, stream), rtol=1e-5, atol=1e-6
    )


def test_windows_of_several_streams_with_a_padded_group(monkeypatch):
    model = model_for("rlstm", batch=2)
    streams = np.random.default_rng(1).integers(0, VOCAB, (3, 23))  # 2 groups of 2
    whole, calls = score(model, streams, monkeypatch, True, batch_size=2)
    assert calls == {"forward": 2}  # one window per group
    segments, _ = score(model, streams, monkeypatch, False, batch_size=2)
    np.testing.assert_allclose(
        whole["token_losses"], segments["token_losses"], rtol=1e-6, atol=1e-6
    )
    assert whole["token_losses"].shape == (3, 22)
    one = model_for("rlstm", batch=1)
    for mine, theirs in zip(one.trainable_variables, model.trainable_variables):
        mine.assign(theirs)
    for row in range(3):
        np.testing.assert_allclose(
            whole["token_losses"][row], one_pass_losses(one, streams[row]),
            rtol=1e-5, atol=1e-6,
        )


def test_a_window_is_cut_at_the_logits_budget(monkeypatch):
    model = model_for("rlstm")
    stream = np.random.default_rng(2).integers(0, VOCAB, 41)  # 8 segments
    # 2 segments' logits (2 · 5 rows of 17) per window: 4 windows in one call.
    monkeypatch.setattr(_dynamic_pass, "WINDOW_LOGITS", 2 * 5 * VOCAB)
    whole, calls = score(model, stream, monkeypatch, True)
    assert calls == {"forward": 4}
    segments, _ = score(model, stream, monkeypatch, False)
    np.testing.assert_allclose(
        whole["token_losses"], segments["token_losses"], rtol=1e-6, atol=1e-6
    )


def test_a_model_without_carried_state_is_scored_segment_by_segment(monkeypatch):
    # Without a carried state every segment starts from zeros: one window
    # would give later tokens context they do not have.
    model = model_for("lstm", stateful=False)
    stream = np.random.default_rng(3).integers(0, VOCAB, 21)
    result, calls = score(model, stream, monkeypatch, True)
    assert calls == {"forward_loop": 1}
    assert not np.allclose(
        result["token_losses"][0], one_pass_losses(model, stream), rtol=1e-4
    )


def test_adaptation_and_callbacks_keep_their_own_paths(monkeypatch):
    model = model_for("rlstm")
    stream = np.random.default_rng(4).integers(0, VOCAB, 21)
    _, calls = score(model, stream, monkeypatch, True, callbacks=[keras.callbacks.Callback()])
    assert calls == {"forward": 4}  # a callback sees every segment: one per call
    evaluator = DynamicEvaluator(model, update_rule="sgd", learning_rate=0.1)
    counter = CountCalls(evaluator)
    evaluator.evaluate(stream, verbose=0)
    assert set(counter.calls) == {"adaptation_loop"}
