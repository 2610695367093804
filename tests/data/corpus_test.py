import gzip

import numpy as np
import pytest

from keras_mogrifier.data import Corpus
from keras_mogrifier.data import Vocabulary
from keras_mogrifier.data import load_corpus
from keras_mogrifier.data import read_lines
from keras_mogrifier.data import tokenize_line

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite

TRAIN = " the cat sat on the mat \n the dog sat \n <unk> ran \n"
VALID = " the cat ran \n a dog sat \n"
TEST = " the mat \n"


def _write(directory, texts, pattern="ptb.{split}.txt", compress=()):
    for split, text in texts.items():
        name = pattern.format(split=split)
        if split in compress:
            with gzip.open(directory / (name + ".gz"), "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            (directory / name).write_text(text, encoding="utf-8")


def _reference_ids(text, vocab_tokens):
    """NumPy-free reference: PTB reader — split lines, append <eos>, look up."""
    index = {t: i for i, t in enumerate(vocab_tokens)}
    unk = index.get("<unk>")
    words = []
    for line in text.split("\n")[:-1]:
        words += line.split() + ["<eos>"]
    return [index.get(w, unk) for w in words]


def test_tokenize_line_word_and_char():
    assert tokenize_line("  the  cat \n") == ["the", "cat"]
    assert tokenize_line("  the  cat \n", "char") == list("the cat")
    assert tokenize_line("", "char") == []
    with pytest.raises(ValueError, match="level"):
        tokenize_line("a", "byte")


def test_load_plain_and_gz_give_the_same_corpus(tmp_path):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    texts = {"train": TRAIN, "valid": VALID, "test": TEST}
    _write(plain, texts)
    _write(packed, texts, compress=("train", "valid", "test"))
    a, b = load_corpus(plain), load_corpus(packed)
    assert a.vocabulary == b.vocabulary
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(a[split], b[split])
    assert b.paths["valid"].endswith("ptb.valid.txt.gz")
    assert a.source == "directory"


def test_word_level_ids_vocabulary_and_unk(tmp_path):
    _write(tmp_path, {"train": TRAIN, "valid": VALID, "test": TEST})
    corpus = load_corpus(tmp_path)
    vocab = corpus.vocabulary
    # counts: the 3, <eos> 3, sat 2, then 1 each in code-point order.
    assert vocab.tokens == [
        "<eos>",
        "the",
        "sat",
        "<unk>",
        "cat",
        "dog",
        "mat",
        "on",
        "ran",
    ]
    for split, text in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        assert corpus[split].tolist() == _reference_ids(text, vocab.tokens)
    # 'a' of the validation split is unknown and maps to <unk>.
    assert vocab.to_tokens(corpus.valid[4:5]) == ["<unk>"]
    assert corpus.valid.dtype == np.int32


def test_char_level_spaces_and_eos(tmp_path):
    _write(tmp_path, {"train": " ab  b \n ba \n", "valid": "a\n", "test": "b a\n"})
    corpus = load_corpus(tmp_path, level="char")
    tokens = corpus.vocabulary.to_tokens(corpus.train)
    assert tokens == ["a", "b", " ", "b", "<eos>", "b", "a", "<eos>"]
    assert corpus.vocabulary.to_tokens(corpus.test) == ["b", " ", "a", "<eos>"]
    assert corpus.level == "char"


def test_unseen_tokens_add_unk_and_a_fixed_vocabulary_without_it_names_file_and_line(tmp_path):
    _write(
        tmp_path, {"train": "a b\nb a\n", "valid": "a b\nb zebra a\n", "test": "a\n"}
    )
    # Training lacks 'zebra' and holds no <unk>: <unk> is added for it.
    corpus = load_corpus(tmp_path)
    assert corpus.vocabulary.tokens == ["<eos>", "a", "b", "<unk>"]
    assert corpus.vocabulary.to_tokens(corpus.valid[3:6]) == ["b", "<unk>", "a"]
    # A given vocabulary without <unk>: an error naming token, file and line.
    with pytest.raises(ValueError) as info:
        load_corpus(tmp_path, vocabulary=Vocabulary(["<eos>", "a", "b"]))
    message = str(info.value)
    assert "'zebra'" in message
    assert "valid split" in message and "ptb.valid.txt" in message
    assert "line 2" in message


def test_missing_files_and_directory(tmp_path):
    _write(tmp_path, {"train": TRAIN, "test": TEST})
    with pytest.raises(
        FileNotFoundError, match=r"'valid'.*ptb.valid.txt.*ptb.valid.txt.gz"
    ):
        load_corpus(tmp_path)
    with pytest.raises(FileNotFoundError, match="directory"):
        load_corpus(tmp_path / "nowhere")


def test_empty_split_raises(tmp_path):
    _write(tmp_path, {"train": TRAIN, "valid": "\n  \n", "test": TEST})
    with pytest.raises(
        ValueError, match=r"'valid' split .*ptb.valid.txt.*without any token"
    ):
        load_corpus(tmp_path)
    _write(tmp_path, {"valid": ""})
    with pytest.raises(ValueError, match="'valid' split"):
        load_corpus(tmp_path)


def test_file_pattern_splits_and_given_vocabulary(tmp_path):
    _write(tmp_path, {"train": TRAIN, "valid": VALID}, pattern="wiki.{split}.tokens")
    corpus = load_corpus(
        tmp_path, file_pattern="wiki.{split}.tokens", splits=("train", "valid")
    )
    assert sorted(corpus.splits) == ["train", "valid"]
    with pytest.raises(KeyError, match="no 'test' split"):
        _ = corpus.test
    fixed = Vocabulary(["<eos>", "<unk>", "the", "cat"])
    again = load_corpus(
        tmp_path,
        file_pattern="wiki.{split}.tokens",
        splits=("valid",),
        vocabulary=fixed,
    )
    assert again.vocabulary is fixed
    assert fixed.to_tokens(again.valid[:4]) == ["the", "cat", "<unk>", "<eos>"]
    with pytest.raises(ValueError, match="file_pattern"):
        load_corpus(tmp_path, file_pattern="wiki.tokens")
    with pytest.raises(ValueError, match="level"):
        load_corpus(tmp_path, level="words")


def test_read_lines_only_splits_on_newlines(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("a b\r\nc\u2028d\n\ne\n".encode("utf-8"))
    assert read_lines(path) == ["a b", "c\u2028d", "", "e"]


def test_corpus_validates_its_arrays():
    vocab = Vocabulary(["a", "<eos>"])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        Corpus({"train": np.array([0, 2])}, vocab)
    with pytest.raises(ValueError, match="1-D integer"):
        Corpus({"train": np.zeros((2, 2), int)}, vocab)
    with pytest.raises(ValueError, match="'train' split"):
        Corpus.from_lines({"valid": ["a"]})


def test_unreadable_files_are_named(tmp_path):
    """A non-UTF-8 file or a truncated `.gz`: a ValueError naming the file
    (was a bare `UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff`)."""
    _write(tmp_path, {"train": TRAIN, "valid": TRAIN, "test": TEST})
    (tmp_path / "ptb.valid.txt").write_bytes(b"\xff\xfe a b\n")
    with pytest.raises(ValueError, match=r"ptb\.valid\.txt.*encoding 'utf-8'") as info:
        load_corpus(tmp_path)
    assert "at byte 0, line 1" in str(info.value)
    assert "level='byte'" in str(info.value) and "encoding=" in str(info.value)
    (tmp_path / "ptb.valid.txt").write_text(TRAIN)
    (tmp_path / "ptb.test.txt").unlink()
    whole = gzip.compress(TEST.encode("utf-8") * 50)
    (tmp_path / "ptb.test.txt.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"ptb\.test\.txt\.gz.*truncated or corrupt"):
        load_corpus(tmp_path)


def test_a_lone_surrogate_at_char_level_is_a_value_error_naming_the_split_and_line():
    # Half of a UTF-16 pair is no character (no encoding writes it); only
    # text in memory can hold one.
    with pytest.raises(ValueError, match=r"'train' split.*lone surrogate '\\ud800'.*character 3, line 2"):
        Corpus.from_texts({"train": "ab\n\ud800"}, "char")
