"""load_wikitext2: the standard token files, read as PTB is (small files)."""

import numpy as np
import pytest

from keras_mogrifier.data import load_wikitext2

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite

TRAIN = " \n = Valkyria = \n \n the cat sat on the <unk> mat \n"
VALID = " = Title = \n the dog sat \n"


def _write(directory, texts):
    for split, text in texts.items():
        (directory / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")


def test_every_line_blank_and_heading_ends_with_eos(tmp_path):
    _write(tmp_path, {"train": TRAIN, "valid": VALID, "test": TRAIN})
    corpus = load_wikitext2(tmp_path)
    tokens = corpus.vocabulary.to_tokens(corpus.train)
    assert tokens == ["<eos>", "=", "Valkyria", "=", "<eos>", "<eos>", "the", "cat",
                      "sat", "on", "the", "<unk>", "mat", "<eos>"]
    # "dog" is not in the training split: it reads as <unk>.
    valid = corpus.vocabulary.to_tokens(corpus.valid)
    assert valid == ["=", "<unk>", "=", "<eos>", "the", "<unk>", "sat", "<eos>"]
    np.testing.assert_array_equal(corpus.test, corpus.train)
    assert corpus.source == "directory"


def test_gzip_files_and_missing_files(tmp_path):
    import gzip

    for split in ("train", "valid", "test"):
        with gzip.open(tmp_path / f"wiki.{split}.tokens.gz", "wt", encoding="utf-8") as f:
            f.write(TRAIN)
    assert len(load_wikitext2(tmp_path).train) == 14
    with pytest.raises(FileNotFoundError):
        load_wikitext2(tmp_path / "missing")
