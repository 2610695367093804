"""The main job's script runs end to end on a tiny corpus, offline."""

import importlib.util
import json
import re
import os
import sys

import keras
import numpy as np
import pytest

from keras_mogrifier.data import synthetic_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_example(name):
    path = os.path.join(ROOT, "examples", f"{name}.py")
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module



@pytest.fixture
def tiny_ptb(tmp_path):
    data = tmp_path / "ptb"
    data.mkdir()
    sizes = {"train": 3000, "valid": 400, "test": 400}
    for split, size in sizes.items():
        lines = synthetic_lines(size, seed=1, split=split)
        (data / f"ptb.{split}.txt").write_text("\n".join(" " + l + " " for l in lines) + "\n")
    return data


def _flags(tiny_ptb, tmp_path):
    return [
        "--data-dir", str(tiny_ptb), "--preset", "tiny", "--units", "16",
        "--cell", "lstm", "--layers", "1",
        "--batch-size", "4", "--bptt", "10", "--max-tokens", "400",
        # Gradient statistics over the whole (small) training stream, and
        # learning rates up to Krause's default 5e-5: tuned on 60 tokens, the
        # search cannot see that η = 1e-3 diverges over the rest of the
        # stream on a toy corpus (η·g/(RMS+ε) is large where RMS is small).
        "--dynamic-tuning-tokens", "60",
        "--dynamic-learning-rates", "1e-5", "5e-5",
        "--dynamic-decay-rates", "2e-3",
        "--checkpoint-dir", str(tmp_path / "ckpt"), "--verbose", "0",
    ]


def test_ptb_word_end_to_end_with_resume(tiny_ptb, tmp_path, capsys):
    keras.utils.set_random_seed(0)
    example = _load_example("ptb_word")
    out = tmp_path / "results.json"
    saved = tmp_path / "runs" / "model.keras"
    example.main(
        _flags(tiny_ptb, tmp_path)
        + ["--epochs", "1", "--results-json", str(out), "--save-model", str(saved)]
    )
    results = json.loads(out.read_text())
    for key in ("valid_perplexity", "test_perplexity", "test_perplexity_one_stream",
                "test_dynamic_perplexity"):
        assert 1.0 < results[key] < 1000.0
    assert results["corpus_source"] == "directory"
    assert len(results["valid_perplexity_curve"]) == 1
    assert set(results["seconds"]) >= {"training", "dynamic evaluation", "sample"}
    printed = capsys.readouterr().out
    assert "epoch 1/1: training perplexity" in printed
    assert "dynamic evaluation of test" in printed
    assert re.search(r"\ndynamic, τ [0-9.]+, 1 stream +— +[0-9.]+\n", printed)  # the table
    # The job ends with the saved model (vocabulary included) and a sample:
    # a prompt from the test text, and its continuation on a line of its own.
    tail = printed.strip().splitlines()[-3:]
    assert tail[0].startswith("sample (top-p 0.9, seed 0)")
    prompt = tail[1].removeprefix("  prompt:       ")
    continuation = tail[2].removeprefix("  continuation: ")
    loaded = keras.saving.load_model(str(saved))
    vocabulary = loaded.vocabulary
    test_words = (tiny_ptb / "ptb.test.txt").read_text().split()
    assert prompt in " ".join(w if w in vocabulary else "<unk>" for w in test_words)
    assert len(prompt.split()) == 8 and len(continuation.split()) == 20
    assert results["sample"] == {"prompt": prompt, "continuation": continuation}
    assert loaded.vocabulary is not None and len(loaded.vocabulary) == loaded.vocabulary_size
    assert loaded.generate("the", max_length=5).startswith("the ")
    first_curve = results["valid_perplexity_curve"]
    # Resume: one more epoch from the checkpoint; the curve keeps epoch 1.
    example.main(_flags(tiny_ptb, tmp_path) + ["--epochs", "2", "--resume", "--no-dynamic", "--results-json", str(out)])
    results = json.loads(out.read_text())
    assert len(results["valid_perplexity_curve"]) == 2
    assert results["valid_perplexity_curve"][:1] == first_curve
    assert results["initial_epoch"] == 1
    assert "resumed from" in capsys.readouterr().out


def test_ptb_char_reports_bits_per_character(tiny_ptb, tmp_path, capsys):
    keras.utils.set_random_seed(0)
    example = _load_example("ptb_char")
    out = tmp_path / "char.json"
    example.main(
        _flags(tiny_ptb, tmp_path)[:-4] + ["--epochs", "1", "--no-dynamic", "--results-json", str(out)],
        level="char",
    )
    printed = capsys.readouterr().out
    assert re.search(r"bits/char +valid +test\nstatic, τ [0-9.]+, 4 streams +[0-9]\.[0-9]{3} +[0-9]\.[0-9]{3}", printed)
    # A character-level sample: 40 characters of a test line, continued.
    sample = json.loads(out.read_text())["sample"]
    assert len(sample["prompt"]) == 40 and len(sample["continuation"]) >= 90
    assert sample["prompt"] in " ".join((tiny_ptb / "ptb.test.txt").read_text().split())
    assert json.loads(out.read_text())["test_perplexity"] < 100


def test_your_own_text_at_byte_level(tmp_path, capsys):
    """`--text FILE --level byte`: any file, a byte-level model, a sample in its script."""
    keras.utils.set_random_seed(0)
    text = "".join(
        f"Ligne {i} : Zürich, Genève, Ελληνικά, Русский, 日本語 🙂\n" for i in range(60)
    )
    path = tmp_path / "mine.txt"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "byte.json"
    saved = tmp_path / "byte.keras"
    example = _load_example("ptb_word")
    example.main([
        "--text", str(path), "--level", "byte", "--units", "16", "--cell", "lstm",
        "--layers", "1", "--batch-size", "4", "--bptt", "20", "--epochs", "1",
        "--dynamic-tuning-tokens", "100", "--dynamic-learning-rates", "1e-4",
        "--verbose", "0", "--results-json", str(out), "--save-model", str(saved),
    ])
    results = json.loads(out.read_text())
    assert results["level"] == "byte" and results["corpus_source"] == "file"
    assert results["dynamic"]["segment_length"] == 20
    printed = capsys.readouterr().out
    assert re.search(r"bits/byte +valid +test", printed)
    sample = results["sample"]
    assert sample["prompt"] in text and "\ufffd" not in sample["prompt"]
    loaded = keras.saving.load_model(str(saved))
    assert loaded.vocabulary.level == "byte"
    assert loaded.generate("Zürich", max_length=12, seed=0).startswith("Zürich")


def test_flags_become_preset_overrides():
    example = _load_example("ptb_word")
    model, training = example.overrides(
        example.parse_args(["--units", "32", "--samples", "4", "--softmax-chunk-size", "256",
                            "--bptt", "12"])
    )
    assert model == {"units": 32, "embedding_dim": 32, "samples": 4, "softmax_chunk_size": 256}
    assert training == {"sequence_length": 12}
    # 0 turns off the chunking that the paper preset sets.
    model, _ = example.overrides(example.parse_args(["--softmax-chunk-size", "0"]))
    assert model == {"softmax_chunk_size": None}


def test_word_level_text_caps_its_vocabulary_by_default_and_says_so(
    tmp_path, capsys, monkeypatch
):
    # 60 distinct words, the i-th seen i + 1 times; the default cap set to 30.
    words = [f"w{i}" for i in range(60) for _ in range(i + 1)]
    order = np.random.default_rng(0).permutation(len(words))
    lines = [" ".join(words[j] for j in order[k : k + 10]) for k in range(0, len(words), 10)]
    path = tmp_path / "notes.txt"
    path.write_text("\n".join(lines) + "\n")
    example = _load_example("ptb_word")
    monkeypatch.setattr(example, "DEFAULT_MAX_WORDS", 30)
    corpus = example.load(example.parse_args(["--text", str(path)]))
    printed = capsys.readouterr().out
    assert len(corpus.vocabulary) == 30 + 2  # and <eos>, <unk>
    assert "w59" in corpus.vocabulary and "w0" not in corpus.vocabulary
    match = re.search(r"vocabulary: the 30 most frequent words .*\(([\d.]+)% .*<unk>\); "
                      r"--max-size N to change it, --max-size 0 for every word", printed)
    assert match, printed
    unknown = np.mean(corpus.train == corpus.vocabulary.unk_id)
    assert float(match.group(1)) == round(100 * unknown, 1) and unknown > 0
    # Asked for: no note. 0: every word. Characters: no cap.
    assert len(example.load(example.parse_args(["--text", str(path), "--max-size", "40"]))
               .vocabulary) == 42
    assert len(example.load(example.parse_args(["--text", str(path), "--max-size", "0"]))
               .vocabulary) > 60
    assert capsys.readouterr().out == ""
    chars = example.load(example.parse_args(["--text", str(path), "--level", "char"]))
    assert "w" in chars.vocabulary and capsys.readouterr().out == ""
