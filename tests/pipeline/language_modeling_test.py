"""The full recipe runs end to end: RAdam, Two-Tailed Averaging, recovery, D samples."""

import numpy as np

from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.optimizers import TwoTailedAveragingOptimizer
from keras_mogrifier.pipeline import run_experiment


def test_paper_recipe_on_a_tiny_model():
    corpus = synthetic_corpus(train_tokens=2000, valid_tokens=300, test_tokens=300)
    logs = []
    results = run_experiment(
        corpus, "paper",
        model_overrides={"units": 8, "embedding_dim": 8, "mogrifier_rank": 2, "samples": 2,
                         "mogrifier_rounds": 2},
        training_overrides={"epochs": 1, "batch_size": 4, "sequence_length": 10,
                            "eval_batch_size": 4, "averaging_frequency": 10},
        dynamic=False, verbose=0, log=logs.append,
    )
    model = results["model_object"]
    assert isinstance(model.optimizer, TwoTailedAveragingOptimizer)
    assert model.samples == 2 and model.softmax_chunk_size == 1024
    for key in ("valid_perplexity", "test_perplexity"):
        assert np.isfinite(results[key]) and 1 < results[key] < len(corpus.vocabulary) * 2
    assert 0.8 <= results["temperature"] <= 1.06
    assert any("epoch 1: validation perplexity" in line for line in logs)
