"""The `cosine_decay_steps` training setting and `run_experiment(callbacks=...)`."""

import math

import keras
import numpy as np
import pytest

from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.pipeline import build_optimizer
from keras_mogrifier.pipeline import get_preset
from keras_mogrifier.pipeline import run_experiment

from testing import to_numpy


def _training(**overrides):
    return get_preset("tiny", training={"optimizer": "radam", "learning_rate": 2e-3,
                                        **overrides})["training"]


def test_cosine_decay_follows_the_cosine_to_zero_by_step():
    optimizer = build_optimizer(_training(cosine_decay_steps=100))
    schedule = optimizer._learning_rate  # the schedule object the optimizer calls
    assert isinstance(schedule, keras.optimizers.schedules.CosineDecay)
    for step in (0, 25, 50, 99, 100, 150):
        expected = 2e-3 * 0.5 * (1 + math.cos(math.pi * min(step, 100) / 100))
        assert float(to_numpy(schedule(step))) == pytest.approx(expected, rel=1e-4, abs=1e-9)
    # Without it, the rate is constant.
    assert float(to_numpy(build_optimizer(_training()).learning_rate)) == pytest.approx(2e-3)


def test_cosine_decay_applies_in_training_and_resumes_on_the_same_curve(tmp_path):
    corpus = synthetic_corpus(train_tokens=1000, valid_tokens=200, test_tokens=200)
    common = dict(
        model_overrides={"units": 8, "embedding_dim": 8, "num_layers": 1,
                         "cell": "lstm"},
        dynamic=False, verbose=0, log=lambda line: None, like_for_like=False,
    )
    rates = []

    class Rate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rates.append((int(to_numpy(self.model.optimizer.iterations)),
                          float(to_numpy(self.model.optimizer.learning_rate))))

    training = {"epochs": 2, "batch_size": 4, "sequence_length": 10,
                "cosine_decay_steps": 40, "optimizer": "adam", "learning_rate": 1e-2,
                "eval_batch_size": 4}
    run_experiment(corpus, "tiny", training_overrides=training,
                   checkpoint_dir=str(tmp_path / "ckpt"), callbacks=[Rate()], **common)
    assert len(rates) == 2  # the extra callback saw every epoch
    for step, rate in rates:
        assert rate == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * min(step, 40) / 40)),
                                     rel=1e-4)
    # A third epoch resumed from the checkpoint continues the same curve.
    more = dict(training, epochs=3)
    run_experiment(corpus, "tiny", training_overrides=more, resume=True,
                   checkpoint_dir=str(tmp_path / "ckpt"), callbacks=[Rate()], **common)
    step, rate = rates[-1]
    assert step > rates[1][0]
    assert rate == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * min(step, 40) / 40)),
                                 rel=1e-4, abs=1e-9)


@pytest.mark.parametrize("overrides, message", [
    ({"cosine_decay_steps": 0}, "cosine_decay_steps"),
    ({"cosine_decay_steps": 1.5}, "cosine_decay_steps"),
    ({"cosine_decay_steps": 10, "halve_after_epoch": 2}, "halve_after_epoch"),
    ({"cosine_decay_steps": 10, "divergence_recovery": True}, "divergence_recovery"),
])
def test_nonsense_schedules_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_optimizer(_training(**overrides))
