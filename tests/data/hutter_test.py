"""load_enwik8 and load_text8 on small synthetic files of the same format."""

import gzip
import zipfile

import numpy as np
import pytest

from keras_mogrifier.data import Vocabulary
from keras_mogrifier.data import load_enwik8
from keras_mogrifier.data import load_text8

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite


def _enwik8_like(size, seed=0):
    """Wikipedia XML as enwik8 holds it: markup, UTF-8 text in several scripts."""
    rng = np.random.default_rng(seed)
    pieces = [
        "<page>\n  <title>Zürich</title>\n",
        "    <text xml:space=\"preserve\">'''Zürich''' is a city. ",
        "[[Москва|Moscow]] and [[東京]] &amp; ",
        "{{cite web|url=http://example.org}}\n",
        "== Ελληνικά ==\n* naïve café\n",
        "</text>\n</page>\n",
    ]
    data = bytearray()
    while len(data) < size:
        data += pieces[int(rng.integers(len(pieces)))].encode("utf-8")
    return bytes(data[:size])


def test_enwik8_standard_split_is_byte_exact(tmp_path):
    data = _enwik8_like(30_000)
    path = tmp_path / "enwik8"
    path.write_bytes(data)
    corpus = load_enwik8(path, valid_bytes=2_000, test_bytes=3_000)
    assert corpus.vocabulary == Vocabulary.bytes() and corpus.level == "byte"
    # Transformer-XL's prep_enwik8.py: data[:-2n], data[-2n:-n], data[-n:]
    # (here with valid and test sizes of their own).
    raw = np.frombuffer(data, np.uint8).astype(np.int64)
    expected = {"train": raw[:-5_000], "valid": raw[-5_000:-3_000], "test": raw[-3_000:]}
    for split, values in expected.items():
        ids = corpus[split]
        np.testing.assert_array_equal(np.where(ids == 256, 10, ids), values)
        assert np.all(ids != 10)  # the newline byte is <eos>
    assert corpus.vocabulary.decode(corpus.test) == data[-3_000:].decode("utf-8", "replace")
    assert len(corpus.train) + len(corpus.valid) + len(corpus.test) == len(data)


@pytest.mark.parametrize("packing", ["gz", "zip", "directory"])
def test_enwik8_packed_forms(tmp_path, packing):
    data = _enwik8_like(5_000, seed=1)
    if packing == "gz":
        path = tmp_path / "enwik8.gz"
        path.write_bytes(gzip.compress(data))
    elif packing == "zip":
        path = tmp_path / "enwik8.zip"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("enwik8", data)
    else:
        (tmp_path / "enwik8").write_bytes(data)
        path = tmp_path
    corpus = load_enwik8(path, valid_bytes=500, test_bytes=500)
    ids = np.concatenate([corpus.train, corpus.valid, corpus.test])
    np.testing.assert_array_equal(np.where(ids == 256, 10, ids), np.frombuffer(data, np.uint8))


def test_enwik8_errors(tmp_path):
    (tmp_path / "enwik8").write_bytes(b"<page>\n" * 10)
    with pytest.raises(ValueError, match=r"more than valid \+ test = 10,000,000 bytes"):
        load_enwik8(tmp_path / "enwik8")
    with pytest.raises(FileNotFoundError, match="enwik8.zip"):
        load_enwik8(tmp_path / "elsewhere")
    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    with pytest.raises(FileNotFoundError, match="none of them"):
        load_enwik8(empty_dir)
    with pytest.raises(ValueError, match="valid_bytes"):
        load_enwik8(tmp_path / "enwik8", valid_bytes=0)
    (tmp_path / "two.zip").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as archive:
        archive.writestr("a", b"x")
        archive.writestr("b", b"y")
    with pytest.raises(ValueError, match="one file"):
        load_enwik8(tmp_path / "two.zip", valid_bytes=1, test_bytes=1)


def _text8_like(size, seed=0):
    rng = np.random.default_rng(seed)
    words = ["anarchism", "originated", "as", "a", "term", "of", "abuse", "first",
             "used", "against", "early", "working", "class", "radicals", "zero", "quixotic"]
    text = ""
    while len(text) < size:
        text += " " + words[int(rng.integers(len(words)))]
    return text[:size]


def test_text8_standard_split_keeps_every_character(tmp_path):
    text = _text8_like(20_000)
    path = tmp_path / "text8"
    path.write_text(text)  # one line, no newline, as text8 is
    corpus = load_text8(path, valid_characters=1_000, test_characters=2_000)
    vocab = corpus.vocabulary
    assert vocab.level == "char"
    assert sorted(vocab.tokens) == sorted(set(text) | {"<eos>"})
    # Every character a token, no <eos> added, the split exactly 17k/1k/2k.
    for split, part in (("train", text[:-3_000]), ("valid", text[-3_000:-2_000]),
                        ("test", text[-2_000:])):
        assert vocab.decode(corpus[split]) == part
    assert vocab.eos_id not in np.concatenate([corpus.train, corpus.valid, corpus.test])
    # Ids by count: the space, the most frequent character, is id 0.
    assert vocab.tokens[0] == " "
    with zipfile.ZipFile(tmp_path / "text8.zip", "w") as archive:
        archive.writestr("text8", text)
    zipped = load_text8(tmp_path / "text8.zip", valid_characters=1_000, test_characters=2_000)
    np.testing.assert_array_equal(zipped.test, corpus.test)
    with pytest.raises(ValueError, match="valid_characters"):
        load_text8(path, valid_characters=-1)
