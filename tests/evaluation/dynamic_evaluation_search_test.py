"""Tests of search_dynamic_evaluation."""

import math

import keras
import numpy as np
import pytest

from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.evaluation import search_dynamic_evaluation

VOCAB = 10


@pytest.fixture(scope="module")
def evaluator():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(batch_shape=(1, None), dtype="int32"),
            keras.layers.Embedding(VOCAB, 6),
            keras.layers.LSTM(8, stateful=True, return_sequences=True),
            keras.layers.Dense(VOCAB),
        ]
    )
    ev = DynamicEvaluator(model, learning_rate=1e-4, decay_rate=1e-3)
    ev.collect_gradient_statistics(
        np.random.default_rng(0).integers(0, VOCAB, 300), batch_size=1, steps=20
    )
    return ev


TEXT = np.tile(np.random.default_rng(1).integers(0, VOCAB, 7), 6)


def test_grid_tries_every_pair_and_returns_the_best(evaluator):
    best = search_dynamic_evaluation(
        evaluator, TEXT, learning_rates=[0.0, 1e-3, 3e-3], decay_rates=[0.0, 0.1]
    )
    pairs = [(r["learning_rate"], r["decay_rate"]) for r in best["results"]]
    assert pairs == [(0.0, 0.0), (0.0, 0.1), (1e-3, 0.0), (1e-3, 0.1), (3e-3, 0.0), (3e-3, 0.1)]
    losses = [r["loss"] for r in best["results"]]
    winner = best["results"][int(np.argmin(losses))]
    assert (best["learning_rate"], best["decay_rate"]) == (
        winner["learning_rate"], winner["decay_rate"]
    )
    assert best["loss"] == min(losses)
    assert best["learning_rate"] > 0  # adaptation helps on repeating text
    # One pass per setting, the same as evaluating that setting directly.
    evaluator.learning_rate, evaluator.decay_rate = 1e-3, 0.1
    direct = evaluator.evaluate(TEXT, verbose=0)
    np.testing.assert_allclose(best["results"][3]["loss"], direct["loss"], rtol=1e-6)
    evaluator.learning_rate, evaluator.decay_rate = 1e-4, 1e-3


def test_evaluator_settings_are_left_unchanged(evaluator):
    search_dynamic_evaluation(evaluator, TEXT, settings=[(1e-3, 0.5), (2e-3, 0.0)])
    assert (evaluator.learning_rate, evaluator.decay_rate) == (1e-4, 1e-3)


def test_sequential_tunes_learning_rate_then_decay(evaluator):
    best = search_dynamic_evaluation(
        evaluator, TEXT, learning_rates=[0.0, 2e-3], decay_rates=[0.0, 0.05, 0.5],
        strategy="sequential",
    )
    results = best["results"]
    assert len(results) == 5
    assert [r["decay_rate"] for r in results[:2]] == [1e-3, 1e-3]
    best_lr = min(results[:2], key=lambda r: r["loss"])["learning_rate"]
    assert [(r["learning_rate"], r["decay_rate"]) for r in results[2:]] == [
        (best_lr, 0.0), (best_lr, 0.05), (best_lr, 0.5)
    ]
    assert best["loss"] == min(r["loss"] for r in results)


def test_sequential_runs_no_setting_twice(evaluator):
    # The evaluator's decay rate (1e-3) is among the candidates: the pair
    # (best η, 1e-3) was run in the first stage and is not run again.
    best = search_dynamic_evaluation(
        evaluator, TEXT, learning_rates=[0.0, 2e-3], decay_rates=[1e-3, 0.5],
        strategy="sequential",
    )
    pairs = [(r["learning_rate"], r["decay_rate"]) for r in best["results"]]
    assert len(pairs) == 3 == len(set(pairs))
    assert pairs[:2] == [(0.0, 1e-3), (2e-3, 1e-3)]
    assert pairs[2][1] == 0.5


def test_a_diverged_setting_never_wins():
    class Fake(DynamicEvaluator):
        losses = {1.0: float("nan"), 2.0: 3.0, 3.0: float("inf"), 4.0: 2.5}

        def evaluate(self, x, batch_size=None, verbose=0):
            loss = self.losses[self.learning_rate]
            return {"loss": loss, "perplexity": math.exp(loss), "bits_per_token": 0.0,
                    "num_tokens": 1}

    fake = Fake()
    fake._statistics = ([], [])
    best = search_dynamic_evaluation(fake, TEXT, learning_rates=[1.0, 2.0, 3.0, 4.0])
    assert best["learning_rate"] == 4.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(strategy="random"), "strategy"),
        (dict(learning_rates=[-1e-3]), "learning_rates"),
        (dict(learning_rates=[]), "non-empty"),
        (dict(decay_rates=[float("inf")]), "decay_rates"),
        (dict(settings=[(1e-3,)]), "pair"),
        (dict(settings=[(1e-3, 0.1)], learning_rates=[1e-3]), "either"),
        (dict(verbose="yes"), "verbose"),
    ],
)
def test_bad_arguments_raise(evaluator, kwargs, message):
    with pytest.raises(ValueError, match=message):
        search_dynamic_evaluation(evaluator, TEXT, **kwargs)


def test_needs_statistics_and_an_evaluator(evaluator):
    with pytest.raises(ValueError, match="DynamicEvaluator"):
        search_dynamic_evaluation("ev", TEXT)
    with pytest.raises(ValueError, match="gradient statistics"):
        search_dynamic_evaluation(DynamicEvaluator(evaluator.model), TEXT)
