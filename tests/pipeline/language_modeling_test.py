"""The full recipe runs end to end: RAdam, Two-Tailed Averaging, recovery, D samples."""

import re

import keras
import numpy as np
import pytest

from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.optimizers import TwoTailedAveragingOptimizer
from keras_mogrifier.pipeline import run_experiment

from testing import to_numpy


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
    assert any(line.startswith("epoch 1/1: training perplexity") for line in logs)
    # Like for like (Zaremba's run_test, main.lua 207-220): test as one
    # sequential stream at τ = 1, whatever τ was tuned.
    tuned = model.temperature
    model.set_temperature(1.0)
    model.reset_states()
    logits = to_numpy(model(corpus.test[None, :-1])).astype("float64")[0]
    model.reset_states()
    model.set_temperature(tuned)
    m = logits.max(-1)
    log_z = m + np.log(np.exp(logits - m[:, None]).sum(-1))
    nll = log_z - logits[np.arange(len(corpus.test) - 1), corpus.test[1:]]
    assert results["test_perplexity_tau1_one_stream"] == pytest.approx(
        np.exp(nll.mean()), rel=1e-4
    )
    assert np.isfinite(results["valid_perplexity_tau1"])
    assert np.isfinite(results["valid_perplexity_tau1_one_stream"])
    assert any("static evaluation (τ 1, like for like)" in line for line in logs)


def test_dynamic_evaluation_step_reports_no_non_finite_number():
    """Settings that diverge are skipped; when all do, the step says so."""
    corpus = synthetic_corpus(train_tokens=3000, valid_tokens=300, test_tokens=300)
    common = dict(
        model_overrides={"units": 8, "embedding_dim": 8, "mogrifier_rounds": 1,
                         "mogrifier_rank": 2, "num_layers": 1},
        training_overrides={"epochs": 1, "batch_size": 4, "sequence_length": 10,
                            "eval_batch_size": 4},
        verbose=0,
    )
    logs = []
    results = run_experiment(
        corpus, "tiny", log=logs.append,
        dynamic_options={"learning_rates": (1e37, 1e-4), "decay_rates": (2e-3,),
                         "tuning_tokens": 100, "statistics_batches": 2},
        **common,
    )
    assert "1 diverged" in "\n".join(logs)
    assert np.isfinite(results["test_dynamic_perplexity"])
    assert results["dynamic_learning_rate"] == 1e-4
    logs = []
    results = run_experiment(
        corpus, "tiny", log=logs.append,
        dynamic_options={"learning_rates": (1e37, 1e38), "decay_rates": (2e-3,),
                         "tuning_tokens": 100, "statistics_batches": 2},
        **common,
    )
    text = "\n".join(logs)
    assert "dynamic evaluation skipped: Every dynamic-evaluation setting tried diverged" in text
    assert "test_dynamic_perplexity" not in results
    assert not re.search(r"\b(nan|inf)\b", text, flags=re.IGNORECASE)


def test_a_run_logs_each_phase_as_it_ends_and_draws_its_curves(tmp_path, capsys):
    """The main job as a user meets it: a readable log, a labelled table, a picture."""
    corpus = synthetic_corpus(train_tokens=3000, valid_tokens=300, test_tokens=300)
    lines = []
    seen_when_epoch_2_began = []

    class Spy(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                seen_when_epoch_2_began.extend(lines)

    import keras_mogrifier.pipeline.language_modeling as pipeline

    extra = pipeline.training_callbacks
    try:
        pipeline.training_callbacks = lambda *a, **k: extra(*a, **k) + [Spy()]
        results = run_experiment(
            corpus, "tiny", log=lines.append, verbose="auto",  # not a terminal: 2
            model_overrides={"units": 8, "embedding_dim": 8, "mogrifier_rank": 2,
                             "num_layers": 1},
            training_overrides={"epochs": 2, "batch_size": 4, "sequence_length": 10,
                                "eval_batch_size": 4},
            # The second decay rate is tried at the best η only: 3 passes, and
            # (1e-4, 2e-3) is not run twice.
            dynamic_options={"learning_rates": (1e-4, 3e-4), "decay_rates": (2e-3, 1e-2),
                             "tuning_tokens": 100, "statistics_batches": 2},
            plot_path=str(tmp_path / "curves.png"),
        )
    finally:
        pipeline.training_callbacks = extra
    text = "\n".join(lines)
    # Epoch lines appear as each epoch ends, not after training.
    assert any(line.startswith("epoch 1/2: training perplexity") for line in seen_when_epoch_2_began)
    for phase in ("softmax temperature", "static evaluation (τ", "gradient statistics",
                  "setting 1/3:", "setting 3/3:", "dynamic evaluation of test",
                  "curves drawn to"):
        assert phase in text, phase
    settings = [(r["learning_rate"], r["decay_rate"]) for r in results["dynamic"]["results"]]
    assert len(settings) == 3 == len(set(settings))
    # No progress bars in log mode; a short log.
    out = capsys.readouterr().out
    assert "━" not in out and "\r" not in out
    assert len(lines) < 32
    # The summary table: every row says how its figure was taken.
    tau = f"τ {results['temperature']:.2f}"
    table = text[text.index("\nperplexity") + 1:]
    assert re.search(r"^perplexity +valid +test$", table, re.M)
    for row, valid, test in (
        (f"static, {tau}, 4 streams", "valid_perplexity", "test_perplexity"),
        ("static, τ 1, 1 stream (the papers' way)", "valid_perplexity_tau1_one_stream",
         "test_perplexity_tau1_one_stream"),
        (f"static, {tau}, 1 stream", "valid_perplexity_one_stream", "test_perplexity_one_stream"),
    ):
        assert re.search(
            re.escape(row) + rf" +{results[valid]:.2f} +{results[test]:.2f}$", table, re.M
        ), row
    assert re.search(
        re.escape(f"dynamic, {tau}, 1 stream") + rf" +— +{results['test_dynamic_perplexity']:.2f}$",
        table, re.M,
    )
    d = results["dynamic"]
    assert (
        f"dynamic: η {d['learning_rate']:g}, λ {d['decay_rate']:g}, ε {d['epsilon']:g}, "
        f"segments of 5 tokens; tuned on the first 100 validation tokens" in table
    )
    assert "dynamic vs static" in table and "time: training" in table
    # Static one stream at the tuned τ is what the test losses of the curve
    # average to, and the gain is taken against it.
    static = np.asarray(results["test_token_losses"]["static"])
    assert len(static) == len(corpus.test) - 1
    assert np.exp(static.mean()) == pytest.approx(results["test_perplexity_one_stream"])
    assert results["dynamic_gain"] == pytest.approx(
        1 - results["test_dynamic_perplexity"] / results["test_perplexity_one_stream"]
    )
    dynamic = np.asarray(results["test_token_losses"]["dynamic"])
    assert np.exp(dynamic.mean()) == pytest.approx(results["test_dynamic_perplexity"], rel=1e-5)
    # Seconds and CPU seconds of every phase, and the sample.
    for key in ("seconds", "cpu_seconds"):
        assert set(results[key]) == {"training", "temperature", "static evaluation",
                                     "dynamic evaluation", "sample"}
    assert set(results["sample"]) == {"prompt", "continuation"}
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_the_sample_is_a_test_prompt_and_a_continuation_of_at_least_five_tokens():
    from keras_mogrifier.data import load_text
    from keras_mogrifier.pipeline import format_sample
    from keras_mogrifier.pipeline import generation_sample

    corpus = synthetic_corpus(train_tokens=2000, valid_tokens=300, test_tokens=300)
    keras.utils.set_random_seed(0)
    results = run_experiment(
        corpus, "tiny", log=lambda *_: None, verbose=0, dynamic=False, like_for_like=False,
        model_overrides={"units": 8, "embedding_dim": 8, "mogrifier_rank": 2, "num_layers": 1},
        training_overrides={"epochs": 1, "batch_size": 4, "sequence_length": 10,
                            "eval_batch_size": 4},
    )
    model, sample = results["model_object"], results["sample"]
    # The prompt: the start (8 words) of the first test line of 16 words or more.
    lines = [line.split() for line in corpus.vocabulary.decode(corpus.test).split(" <eos> ")]
    first_long = next(line for line in lines if len(line) >= 16)
    assert sample["prompt"] == " ".join(first_long[:8])
    words = sample["continuation"].split()
    assert len(words) == 20 and set(words) != {"<eos>"}
    # Fixed seed: the same sample again.
    assert generation_sample(model, corpus) == sample
    printed = format_sample(sample).splitlines()
    assert printed[1] == "  prompt:       " + sample["prompt"]
    assert printed[2] == "  continuation: " + sample["continuation"]


def test_byte_level_sample_prompts_end_on_a_character(tmp_path):
    from keras_mogrifier.data import load_text
    from keras_mogrifier.pipeline import generation_sample
    from keras_mogrifier.pipeline.language_modeling import build_language_model

    path = tmp_path / "t.txt"
    path.write_text("Ελληνικά και Русский и 日本語のテキストです\n" * 30, encoding="utf-8")
    corpus = load_text(path, level="byte")
    model = build_language_model(257, {"units": 8, "num_layers": 1}, 1, corpus.vocabulary)
    sample = generation_sample(model, corpus)
    # 40 bytes would cut a character; the prompt stops before it.
    assert sample["prompt"] == "Ελληνικά και Русский"[: len(sample["prompt"])]
    assert "\ufffd" not in sample["prompt"] and len(sample["prompt"].encode()) <= 40
    assert len(sample["prompt"].encode()) > 30
