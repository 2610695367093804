"""load_text: your own text at word, char and byte level, in every naming form."""

import collections
import gzip

import numpy as np
import pytest

from keras_mogrifier.data import Vocabulary
from keras_mogrifier.data import load_text
from keras_mogrifier.data import reader

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite

# Accents, Greek, Cyrillic, CJK, an emoji and Arabic: more than one byte each.
MIXED = (
    "Zürich et Genève sont en Suisse.\n"
    "Ελληνικά: καλημέρα κόσμε\n"
    "Русский текст: привет, мир\n"
    "日本語のテキスト、こんにちは世界\n"
    "naïve café 🙂 مرحبا بالعالم\n"
)


def _reference_word_corpus(lines, valid_lines, test_lines, min_count=1, max_size=None):
    """Plain Python: cut whole lines, count training words, map the rest to <unk>."""
    cut_test = len(lines) - test_lines
    cut_valid = cut_test - valid_lines
    splits = {"train": lines[:cut_valid], "valid": lines[cut_valid:cut_test],
              "test": lines[cut_test:]}
    tokens = {k: [t for line in v for t in line.split() + ["<eos>"]] for k, v in splits.items()}
    counts = collections.Counter(tokens["train"])
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept, dropped, regular = [], 0, 0
    for token, count in ranked:
        if token == "<eos>":
            kept.append((token, count))
        elif count < min_count or (max_size is not None and regular >= max_size):
            dropped += count
        else:
            kept.append((token, count))
            regular += 1
    if dropped:
        kept.append(("<unk>", dropped))
        kept.sort(key=lambda kv: (-kv[1], kv[0]))
    vocab = [t for t, _ in kept]
    if any(t not in vocab for split in ("valid", "test") for t in tokens[split]) and "<unk>" not in vocab:
        vocab.append("<unk>")
    index = {t: i for i, t in enumerate(vocab)}
    ids = {k: [index.get(t, index.get("<unk>")) for t in v] for k, v in tokens.items()}
    return vocab, ids


def _text(num_lines, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{k}" for k in range(60)]
    weights = 1.0 / np.arange(1, 61)
    weights /= weights.sum()
    return [" ".join(rng.choice(words, size=rng.integers(3, 9), p=weights)) for _ in range(num_lines)]


def test_one_file_is_cut_into_contiguous_runs_of_whole_lines_in_file_order(tmp_path):
    lines = _text(200)
    path = tmp_path / "my notes.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = load_text(path, valid_fraction=0.1, test_fraction=0.05)
    # Each split is a run of whole lines: its token count matches some
    # number of the file's lines, train first, then valid, then test.
    counts = [len(line.split()) + 1 for line in lines]
    ends = np.cumsum(counts)
    train_lines = int(np.searchsorted(ends, len(corpus.train))) + 1
    valid_lines = int(np.searchsorted(ends, len(corpus.train) + len(corpus.valid))) + 1 - train_lines
    test_lines = len(lines) - train_lines - valid_lines
    assert ends[train_lines - 1] == len(corpus.train)
    assert sum(counts) == len(corpus.train) + len(corpus.valid) + len(corpus.test)
    # About the fractions of the tokens (to the nearest line end).
    total = sum(counts)
    assert abs(len(corpus.test) - 0.05 * total) <= max(counts)
    assert abs(len(corpus.valid) - 0.10 * total) <= max(counts)
    vocab, ids = _reference_word_corpus(lines, valid_lines, test_lines)
    assert corpus.vocabulary.tokens == vocab
    for split in ("train", "valid", "test"):
        assert corpus[split].tolist() == ids[split], split
    assert corpus.source == "file" and corpus.paths["test"] == str(path)
    assert corpus.vocabulary.level == "word" and corpus.level == "word"


def test_min_count_and_max_size_map_rare_words_to_unk(tmp_path):
    lines = _text(300, seed=1)
    path = tmp_path / "t.txt"
    path.write_text("\n".join(lines) + "\n")
    full = load_text(path)
    for min_count, max_size in ((5, None), (1, 10), (3, 20)):
        corpus = load_text(path, min_count=min_count, max_size=max_size)
        train_lines = int(np.searchsorted(
            np.cumsum([len(line.split()) + 1 for line in lines]), len(corpus.train))) + 1
        valid_lines = len(lines) - train_lines - int(np.searchsorted(
            np.cumsum([len(line.split()) + 1 for line in reversed(lines)]), len(corpus.test))) - 1
        vocab, ids = _reference_word_corpus(
            lines, valid_lines, len(lines) - train_lines - valid_lines, min_count, max_size
        )
        assert corpus.vocabulary.tokens == vocab, (min_count, max_size)
        for split in ("train", "valid", "test"):
            assert corpus[split].tolist() == ids[split]
        assert "<unk>" in corpus.vocabulary
        if max_size is not None:
            # <eos> and <unk> are not counted.
            assert len(corpus.vocabulary) == max_size + 2
        # Same cut as without the limits: the limits change ids, not splits.
        assert [len(corpus[s]) for s in ("train", "valid", "test")] == [
            len(full[s]) for s in ("train", "valid", "test")
        ]
    counts = collections.Counter(w for line in lines for w in line.split())
    assert any(c < 5 for c in counts.values())  # the test would prove nothing otherwise


def test_valid_and_test_words_unseen_in_training_are_unk(tmp_path):
    files = {
        "train": "the cat sat\nthe dog ran\n",
        "valid": "the zebra sat\n",
        "test": "a cat\n",
    }
    paths = {}
    for split, text in files.items():
        paths[split] = tmp_path / f"any name {split}.md"
        paths[split].write_text(text)
    corpus = load_text(paths)
    vocab = corpus.vocabulary
    assert vocab.tokens[-1] == "<unk>"  # added: training has no <unk>
    assert vocab.to_tokens(corpus.valid) == ["the", "<unk>", "sat", "<eos>"]
    assert vocab.to_tokens(corpus.test) == ["<unk>", "cat", "<eos>"]
    assert corpus.source == "files"
    # Nothing unseen: no <unk>.
    same = load_text({"train": paths["train"], "valid": paths["train"]})
    assert "<unk>" not in same.vocabulary and sorted(same.splits) == ["train", "valid"]


def test_tokenizer_hook(tmp_path):
    path = tmp_path / "csv.txt"
    path.write_text("".join(f"a,B,{i % 3}\n" for i in range(40)))

    def tokenizer(line):
        return line.lower().split(",")

    corpus = load_text(path, tokenizer=tokenizer)
    assert corpus.vocabulary.to_tokens(corpus.train[:4]) == ["a", "b", "0", "<eos>"]
    # The vocabulary keeps the tokenizer for encode.
    assert corpus.vocabulary.encode("A,b").tolist() == corpus.train[:2].tolist()
    with pytest.raises(ValueError, match="tokenizer.*level='word'"):
        load_text(path, level="char", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="callable"):
        load_text(path, tokenizer="split")
    with pytest.raises(ValueError, match="non-empty strings"):
        load_text(path, tokenizer=lambda line: line.split("a"))
    # Any iterable of strings will do, a generator too.
    generated = load_text(path, tokenizer=lambda line: (t for t in line.lower().split(",")))
    assert generated.vocabulary.tokens == corpus.vocabulary.tokens


def test_a_bad_tokenizer_is_named_with_the_file_and_line(tmp_path, monkeypatch):
    path = tmp_path / "notes.txt"
    path.write_text("one two\nthree\n\nfour five\n" * 10)

    def none_on_blank_lines(line):
        return line.split() if line else None

    with pytest.raises(ValueError) as info:
        load_text(path, tokenizer=none_on_blank_lines)
    message = str(info.value)
    assert message.startswith("Expected `tokenizer` (")
    assert "none_on_blank_lines" in message and repr(str(path)) in message
    assert "line 3 of" in message and "Received: NoneType None" in message

    def fails_on_four(line):
        if "four" in line:
            raise KeyError("four")
        return line.split()

    with pytest.raises(ValueError, match=r"fails_on_four.*line 4 of .*notes\.txt.*KeyError") as info:
        load_text(path, tokenizer=fails_on_four)
    assert isinstance(info.value.__cause__, KeyError)  # chained

    def gone_half_way(line):
        yield "ok"
        raise OSError("gone")

    with pytest.raises(ValueError, match=r"gone_half_way.*line 1 of .*OSError: gone") as info:
        load_text(path, tokenizer=gone_half_way)
    assert isinstance(info.value.__cause__, OSError)
    # A string back is a mistake (its characters would be the tokens).
    with pytest.raises(ValueError, match=r"line 1 of .*Received: str 'one two'"):
        load_text(path, tokenizer=str.strip)
    # A bad string among the tokens (line 2) comes before a bad answer (line 3).
    with pytest.raises(ValueError, match=r"line 2 of .*Received: 5 \(int\) among its tokens"):
        load_text(path, tokenizer=lambda line: [len(line)] if line == "three" else line.split() or None)
    with pytest.raises(ValueError, match=r"line 2 of .*Received: 5 \(int\) among its tokens"):
        load_text(path, tokenizer=lambda line: [len(line)] if line == "three" else line.split() or 1 / 0)
    # Several files: the message names the one at fault.
    other = tmp_path / "other.txt"
    other.write_text("one\nthree\nbad\n")
    with pytest.raises(ValueError, match=r"line 3 of .*other\.txt"):
        load_text({"train": path, "valid": other}, tokenizer=lambda line: None if line == "bad" else line.split())
    # Long files are read a chunk of lines at a time: the line still counts
    # from the start of the file.
    monkeypatch.setattr(reader, "_WORD_CHUNK_CHARACTERS", 10)
    numbered = tmp_path / "numbered.txt"
    numbered.write_text("".join(f"w{i}\n" for i in range(1, 31)))
    with pytest.raises(ValueError, match=r"line 26 of .*Received: NoneType None"):
        load_text(numbered, tokenizer=lambda line: None if line == "w26" else [line])
    with pytest.raises(ValueError, match=r"line 26 of .*Received: 0 \(int\)"):
        load_text(numbered, tokenizer=lambda line: [0] if line == "w26" else [line])
    # encode calls the tokenizer as the reader does.
    vocabulary = load_text(path, tokenizer=str.split).vocabulary
    vocabulary.tokenizer = none_on_blank_lines
    with pytest.raises(ValueError, match=r"none_on_blank_lines.*line 2 of prompt 1"):
        vocabulary.encode("one\n", where="prompt 1")
    vocabulary.tokenizer = lambda line: [line, ""]
    with pytest.raises(ValueError, match=r"line 1 of the text\. Received: '' \(str\) among its tokens"):
        vocabulary.encode("one")


def test_a_blank_last_line_without_its_newline_still_ends_with_eos(tmp_path):
    # "\x85" (NEL) and " " are whitespace: the last line is blank. It is a
    # line, with its <eos>, at char level as at word level.
    for last in ("\x85", " ", "\t "):
        path = tmp_path / "blank end.txt"
        path.write_text("ab\n" * 20 + last, encoding="utf-8")
        for level in ("word", "char"):
            corpus = load_text(path, level, valid_fraction=0, test_fraction=0)
            eos = corpus.vocabulary.eos_id
            assert int(np.sum(corpus.train == eos)) == 21, (last, level)


def test_char_level_joins_words_with_single_spaces(tmp_path):
    text = "  ab\t c  \n\nd\u3000e\x1cf \u00a0\n"
    path = tmp_path / "c.txt"
    path.write_text(text * 30)
    corpus = load_text(path, level="char", valid_fraction=0.1, test_fraction=0.1)
    assert corpus.vocabulary.level == "char"
    # The reference: each line's words (str.split: any Unicode whitespace)
    # re-joined by single spaces, then <eos>.
    expected = []
    for line in (text * 30).split("\n")[:-1]:
        expected += list(" ".join(line.split())) + ["<eos>"]
    got = corpus.vocabulary.to_tokens(np.concatenate([corpus.train, corpus.valid, corpus.test]))
    assert got == expected


def test_byte_level_reads_any_file_and_decodes_it_back_exactly(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_bytes(MIXED.encode("utf-8") * 4)
    corpus = load_text(path, level="byte", valid_fraction=0.25, test_fraction=0.25)
    vocab = corpus.vocabulary
    assert vocab == Vocabulary.bytes() and len(vocab) == 257 and vocab.unk_id is None
    everything = np.concatenate([corpus.train, corpus.valid, corpus.test])
    assert vocab.decode(everything) == MIXED * 4
    # One token per byte, the newline byte as <eos> (id 256).
    raw = np.frombuffer(MIXED.encode("utf-8") * 4, np.uint8).astype(int)
    np.testing.assert_array_equal(everything, np.where(raw == 10, 256, raw))
    # Not UTF-8 at all: still reads, and comes back byte for byte.
    noise = bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8))
    (tmp_path / "noise.bin").write_bytes(noise)
    binary = load_text(tmp_path / "noise.bin", level="byte")
    ids = np.concatenate([binary.train, binary.valid, binary.test])
    np.testing.assert_array_equal(np.where(ids == 256, 10, ids), np.frombuffer(noise, np.uint8))
    with pytest.raises(ValueError, match="min_count=1 and max_size=None at level='byte'"):
        load_text(path, level="byte", min_count=2)


def test_directories_with_the_usual_names_plain_or_gz(tmp_path):
    texts = {"train": "a b a\nb c\n", "valid": "a c\n", "test": "b\n"}
    for pattern, compress in (("ptb.{split}.txt", False), ("{split}.txt", True),
                              ("wiki.{split}.tokens", False)):
        directory = tmp_path / pattern.replace("{split}", "X")
        directory.mkdir()
        for split, text in texts.items():
            name = directory / pattern.format(split=split)
            if compress and split == "train":
                with gzip.open(str(name) + ".gz", "wt") as f:
                    f.write(text)
            else:
                name.write_text(text)
        corpus = load_text(directory)
        assert corpus.source == "directory"
        assert corpus.vocabulary.to_tokens(corpus.valid) == ["a", "c", "<eos>"]
        assert corpus.paths["train"].endswith(pattern.format(split="train") + (".gz" if compress else ""))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"'ptb.train.txt', 'train.txt', 'wiki.train.tokens'"):
        load_text(empty)
    (empty / "train.txt").write_text("a\n")
    with pytest.raises(FileNotFoundError, match=r"without 'valid.txt' and 'test.txt'"):
        load_text(empty)


def test_errors_name_the_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.txt.*an empty file"):
        load_text(empty)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    with pytest.raises(ValueError, match=r"blank\.txt.*3 line\(s\) without any token"):
        load_text(blank)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 au lait\n".encode("latin-1") * 30)
    with pytest.raises(ValueError) as info:
        load_text(latin)
    message = str(info.value)
    assert "latin.txt" in message and "'utf-8'" in message and "line 1" in message
    assert "encoding=" in message and "level='byte'" in message
    assert load_text(latin, encoding="latin-1").vocabulary.to_tokens(
        load_text(latin, encoding="latin-1").train[:1]) == ["café"]
    with pytest.raises(ValueError, match=r"`level` to be one of \['byte', 'char', 'word'\]. Received: level='bytes'"):
        load_text(latin, level="bytes")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_text(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        load_text({"train": latin, "valid": tmp_path / "nothing.txt"})
    with pytest.raises(ValueError, match="'train' entry"):
        load_text({"valid": latin})


def test_fractions(tmp_path):
    path = tmp_path / "two.txt"
    path.write_text("first line\nsecond line\n")
    # Two lines cannot give three splits: the message names the file, the
    # split and the way out.
    with pytest.raises(ValueError) as info:
        load_text(path)
    message = str(info.value)
    assert "two.txt" in message and "'valid' split" in message
    assert "valid_fraction=0" in message
    # A fraction of 0: no such split.
    corpus = load_text(path, valid_fraction=0.0, test_fraction=0.5)
    assert sorted(corpus.splits) == ["test", "train"]
    assert corpus.vocabulary.to_tokens(corpus.test) == ["<unk>", "line", "<eos>"]
    only = load_text(path, valid_fraction=0.0, test_fraction=0.0)
    assert sorted(only.splits) == ["train"]
    one_line = tmp_path / "one.txt"
    one_line.write_text("a single long line without an end")
    with pytest.raises(ValueError, match=r"'test' split.*1 line\(s\)"):
        load_text(one_line)
    for bad in (-0.1, 1.0, "0.1", float("nan")):
        with pytest.raises(ValueError, match="valid_fraction"):
            load_text(path, valid_fraction=bad)
    with pytest.raises(ValueError, match="< 1"):
        load_text(path, valid_fraction=0.5, test_fraction=0.5)
