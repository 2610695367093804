"""A run resumed from its checkpoint reports every epoch's curve, from the first."""

import json

from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.pipeline import run_experiment
from keras_mogrifier.pipeline.language_modeling import checkpoint_history

COMMON = dict(
    model_overrides={"units": 8, "embedding_dim": 8, "num_layers": 1, "cell": "lstm"},
    dynamic=False, verbose=0, log=lambda line: None, like_for_like=False,
)
TRAINING = {"batch_size": 4, "sequence_length": 10, "optimizer": "adam",
            "learning_rate": 1e-2, "eval_batch_size": 4}


def test_a_resumed_run_reports_the_epochs_before_it(tmp_path):
    corpus = synthetic_corpus(train_tokens=1000, valid_tokens=200, test_tokens=200)
    checkpoint = str(tmp_path / "ckpt")
    first = run_experiment(corpus, "tiny", training_overrides=dict(TRAINING, epochs=2),
                           checkpoint_dir=checkpoint, **COMMON)
    assert len(first["valid_perplexity_curve"]) == 2
    history = checkpoint_history(checkpoint)
    assert [e["val_perplexity"] for e in history] == first["valid_perplexity_curve"]

    resumed = run_experiment(corpus, "tiny", training_overrides=dict(TRAINING, epochs=3),
                             checkpoint_dir=checkpoint, resume=True, **COMMON)
    assert resumed["initial_epoch"] == 2
    # Epochs 1 and 2 as the first run measured them, then the resumed one.
    assert resumed["valid_perplexity_curve"][:2] == first["valid_perplexity_curve"]
    assert resumed["train_perplexity_curve"][:2] == first["train_perplexity_curve"]
    assert len(resumed["valid_perplexity_curve"]) == 3
    assert len(checkpoint_history(checkpoint)) == 3


def test_a_checkpoint_without_history_pads_the_epochs_it_did_not_keep(tmp_path):
    # progress.json as written before the history was kept: the last logs only.
    (tmp_path / "progress.json").write_text(
        json.dumps({"epochs_done": 3, "logs": {"val_perplexity": 12.5}}))
    assert checkpoint_history(str(tmp_path)) == [None, None, {"val_perplexity": 12.5}]
    assert checkpoint_history(str(tmp_path / "nothing")) == []
