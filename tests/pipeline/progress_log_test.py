"""What the main job tells a user before and while it trains: the parameter
count with the vocabulary's share, an estimate of each epoch's time once the
first steps are timed, and a progress line every half minute in a log."""

import numpy as np

from keras_mogrifier.models import LanguageModel
from keras_mogrifier.pipeline import language_modeling as lm


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _run(steps, epochs, seconds_per_step, first_step=50.0, every=30.0):
    """Drives the callback as `fit` would, `seconds_per_step` per step and a
    slow first step (tracing); returns the lines it logged."""
    lines, clock = [], FakeClock()
    progress = lm._ProgressLog(lines.append, epochs, steps, tokens_per_step=200,
                               every=every, clock=clock)
    for epoch in range(epochs):
        progress.on_epoch_begin(epoch)
        for batch in range(steps):
            clock.now += first_step if (epoch, batch) == (0, 0) else seconds_per_step
            progress.on_train_batch_end(batch)
        progress.on_epoch_end(epoch)
    return lines


def test_the_estimate_leaves_out_the_first_step_and_comes_after_ten_seconds():
    lines = _run(steps=100, epochs=3, seconds_per_step=2.0)
    # Steps 2..6 take 10 s: the estimate follows step 6, at 2 s per step.
    assert lines[0] == (
        "timing: 100 tokens/s over 5 steps -> about 3m20s per epoch of 100 "
        "steps; training ends in about 9m48s (validation not counted)"
    )
    # Then a line every 30 s (15 steps), the times left counting down.
    assert lines[1] == (
        "epoch 1/3 step 21/100: 100 tokens/s, epoch ends in 2m38s, training in 9m18s"
    )
    assert len(lines) == 1 + (3 * 100 - 6) // 15
    assert lines[-1].startswith("epoch 3/3 step 91/100:")


def test_a_short_epoch_gets_its_estimate_at_its_end():
    lines = _run(steps=4, epochs=2, seconds_per_step=1.0)
    assert lines == [
        "timing: 200 tokens/s over 3 steps -> about 4s per epoch of 4 steps; "
        "training ends in about 4s (validation not counted)"
    ]


def test_durations_read_in_hours_past_an_hour():
    assert [lm._duration(s) for s in (42, 125, 3600, 23_400)] == [
        "42s", "2m05s", "1h00m", "6h30m"
    ]


def test_the_vocabulary_share_counts_the_tied_embedding_and_the_softmax_bias():
    model = LanguageModel(37, units=8, num_layers=1, batch_size=2, seed=0)
    model.build((2, None))
    assert lm._vocabulary_parameters(model, 37) == 37 * 8 + 37
    total = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert 0 < lm._vocabulary_parameters(model, 37) < total
