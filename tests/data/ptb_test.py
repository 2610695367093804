import gzip
import logging
import os
import socket

import keras
import numpy as np
import pytest

from keras_mogrifier.data import load_ptb
from keras_mogrifier.data import ptb

TEXTS = {
    "train": " the cat sat \n the <unk> ran \n",
    "valid": " the dog sat \n",
    "test": " a cat \n",
}


def _write_ptb(directory, compress=False):
    directory.mkdir(parents=True, exist_ok=True)
    for split, text in TEXTS.items():
        name = directory / f"ptb.{split}.txt"
        if compress:
            with gzip.open(f"{name}.gz", "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            name.write_text(text, encoding="utf-8")


@pytest.fixture
def no_network(monkeypatch):
    """Any real download attempt fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the test tried to download")

    monkeypatch.setattr(keras.utils, "get_file", forbidden)


@pytest.mark.parametrize("compress", [False, True])
def test_from_data_dir(tmp_path, no_network, compress):
    _write_ptb(tmp_path, compress)
    corpus = load_ptb(tmp_path)
    assert corpus.source == "directory"
    vocab = corpus.vocabulary
    assert vocab.to_tokens(corpus.valid) == ["the", "<unk>", "sat", "<eos>"]
    assert vocab.to_tokens(corpus.test) == ["<unk>", "cat", "<eos>"]
    # Character level: the letters of "dog" are unseen in training; <unk>
    # is added for them.
    chars = load_ptb(tmp_path, level="char")
    assert chars.vocabulary.level == "char"
    assert "".join(
        "?" if t == "<unk>" else t for t in chars.vocabulary.to_tokens(chars.valid[:7])
    ) == "the ???"


def test_missing_data_dir_is_an_error_not_a_fallback(tmp_path, no_network):
    with pytest.raises(FileNotFoundError):
        load_ptb(tmp_path / "absent")


def test_offline_fallback_without_download(no_network, caplog):
    with caplog.at_level(logging.WARNING, logger="keras_mogrifier"):
        corpus = load_ptb(download=False)
    assert corpus.source == "synthetic"
    assert "synthetic corpus" in caplog.text and "download=False" in caplog.text
    assert len(corpus.train) >= 100_000
    with pytest.raises(ValueError, match="data_dir"):
        load_ptb(download=False, fallback=False)


def test_download_goes_through_the_keras_cache(tmp_path, monkeypatch):
    source = tmp_path / "server"
    _write_ptb(source)
    calls = []

    def fake_get_file(fname, origin, cache_subdir, cache_dir):
        calls.append((fname, origin, socket.getdefaulttimeout()))
        target = os.path.join(cache_dir, cache_subdir, fname)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(source / fname, encoding="utf-8") as src, open(target, "w") as dst:
            dst.write(src.read())
        return target

    monkeypatch.setattr(keras.utils, "get_file", fake_get_file)
    before = socket.getdefaulttimeout()
    corpus = load_ptb(cache_dir=str(tmp_path / "cache"), timeout=2.5)
    assert corpus.source == "download"
    assert socket.getdefaulttimeout() == before  # restored
    assert [c[0] for c in calls] == ["ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"]
    assert all(c[1] == ptb.PTB_URL.format(split=c[0].split(".")[1]) for c in calls)
    assert all(c[2] == 2.5 for c in calls)
    np.testing.assert_array_equal(corpus.valid, load_ptb(source).valid)


def test_failed_download_falls_back_or_raises(tmp_path, monkeypatch, caplog):
    def failing_get_file(**kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(keras.utils, "get_file", failing_get_file)
    with caplog.at_level(logging.WARNING, logger="keras_mogrifier"):
        corpus = load_ptb(cache_dir=str(tmp_path))
    assert corpus.source == "synthetic"
    assert "download failed" in caplog.text and "Name or service" in caplog.text
    with pytest.raises(RuntimeError, match="download failed"):
        load_ptb(cache_dir=str(tmp_path), fallback=False)


def test_argument_validation(no_network):
    with pytest.raises(ValueError, match="level"):
        load_ptb(level="bpe", download=False)
    with pytest.raises(ValueError, match="download"):
        load_ptb(download="no")
    with pytest.raises(ValueError, match="timeout"):
        load_ptb(download=False, timeout=0)
