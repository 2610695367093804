"""The two search scripts run end to end on a tiny corpus, offline, and resume."""

import importlib.util
import json
import os

import keras
import pytest

from keras_mogrifier import pipeline
from keras_mogrifier.data import load_corpus
from keras_mogrifier.data import synthetic_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_script(name):
    path = os.path.join(ROOT, "tuning", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tuning_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_ptb(tmp_path_factory):
    data = tmp_path_factory.mktemp("ptb")
    for split, size in {"train": 500, "valid": 120, "test": 120}.items():
        lines = synthetic_lines(size, seed=2, split=split)
        (data / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return data


def test_search_ptb_prints_trials_and_resumes(tiny_ptb, tmp_path, capsys):
    script = _load_script("search_ptb")
    flags = [
        "--data-dir", str(tiny_ptb), "--max-trials", "1", "--epochs", "1",
        "--units", "8", "--layers", "1", "--batch-size", "4", "--bptt", "10",
        "--cells", "lstm", "--verbose", "0",
        "--directory", str(tmp_path), "--results-json", str(tmp_path / "best.json"),
    ]
    if keras.backend.backend() != "jax":  # op-by-op JAX would take minutes
        flags.append("--no-jit-compile")
    best = script.main(flags)
    out = capsys.readouterr().out
    assert "corpus: directory" in out
    assert "val_perplexity" in out and "COMPLETED" in out and "best: trial 0" in out
    assert best["configuration"]["model"]["units"] == 8
    with open(tmp_path / "best.json") as f:
        assert json.load(f)["trial_id"] == "0"
    again = script.main(flags)  # same directory: nothing runs again
    assert "Reloading Tuner" in capsys.readouterr().out
    assert again["score"] == best["score"]


def test_search_dyneval_on_a_saved_model(tiny_ptb, tmp_path, capsys):
    corpus = load_corpus(str(tiny_ptb))
    model = pipeline.build_language_model(
        len(corpus.vocabulary), {"units": 8, "num_layers": 1, "mogrifier_rounds": 1}, 2
    )
    path = str(tmp_path / "model.keras")
    model.save(path)
    script = _load_script("search_dyneval")
    best, results = script.main([
        "--data-dir", str(tiny_ptb), "--model", path, "--max-trials", "2",
        "--segment-length", "3", "--statistics-batch-size", "4", "--max-tokens", "60",
        "--test-tokens", "60", "--verbose", "0", "--directory", str(tmp_path),
    ])
    out = capsys.readouterr().out
    assert "val_dynamic_loss" in out and "evaluator settings" in out
    assert best["configuration"]["segment_length"] == 3
    assert results["test_dynamic"]["num_tokens"] == 60
    assert "test (60 tokens): static perplexity" in out
