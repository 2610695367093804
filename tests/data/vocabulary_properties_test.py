"""Properties of the text readers and `Vocabulary`, on generated inputs.

Each test states what must hold for *every* input of a kind (any bytes, any
Unicode text, any file, any array of ids) and lets `hypothesis` look for a
counterexample. The searches are derandomised (the same examples in every
run) and bounded, so the file takes a few seconds.
"""

import collections
import gzip
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_mogrifier.data import Corpus
from keras_mogrifier.data import Vocabulary
from keras_mogrifier.data import load_text

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite


def _settings(examples):
    return settings(
        max_examples=examples, derandomize=True, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _reading_of(text):
    """The lines of `text` as the readers see them (a last line may lack "\\n")."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _kept(tokens, min_count, max_size, specials=("<eos>", "<unk>")):
    """The tokens a training stream keeps: the reference of the documented rule."""
    counts = collections.Counter(t for t in tokens if t not in specials)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = [t for t, c in ranked if c >= min_count]
    return set(kept if max_size is None else kept[:max_size])


def _assert_ours(error):
    """A ValueError of the library, not a codec's (UnicodeError is a ValueError)."""
    assert not isinstance(error, UnicodeError), repr(error)
    assert str(error).startswith(("Expected", "Token")), str(error)


# === Byte level ===


@_settings(150)
@given(data=st.binary(max_size=300))
def test_byte_level_ids_are_the_bytes_and_decode_back(data):
    vocab = Vocabulary.bytes()
    ids = vocab.encode(data)
    raw = np.frombuffer(data, np.uint8).astype(np.int64)
    np.testing.assert_array_equal(ids, np.where(raw == 10, 256, raw))
    # Any bytes: exactly back through an encoding that maps every byte...
    latin = Vocabulary.bytes("latin-1")
    assert latin.decode(latin.encode(data)).encode("latin-1") == data
    # ...and through UTF-8 as Python decodes them (U+FFFD where invalid).
    assert vocab.decode(ids) == data.decode("utf-8", errors="replace")


@_settings(150)
@given(
    text=st.text(max_size=200),
    encoding=st.sampled_from(["utf-8", "utf-16", "utf-32"]),
)
def test_byte_level_round_trips_any_text_exactly(text, encoding):
    vocab = Vocabulary.bytes(encoding)
    assert vocab.decode(vocab.encode(text)) == text


@_settings(100)
@given(
    text=st.text(
        alphabet=st.one_of(
            st.characters(max_codepoint=0x2FF),
            st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates
            st.sampled_from("日本語🙂"),
        ),
        max_size=20,
    ),
    encoding=st.sampled_from(["utf-8", "latin-1", "ascii"]),
)
def test_byte_level_encode_of_text_the_encoding_cannot_write_is_a_value_error(text, encoding):
    vocab = Vocabulary.bytes(encoding)
    try:
        expected = text.encode(encoding)
    except UnicodeEncodeError:
        with pytest.raises(ValueError, match=f"Expected `text`.*{encoding!r}") as info:
            vocab.encode(text)
        _assert_ours(info.value)
    else:
        raw = np.frombuffer(expected, np.uint8).astype(np.int64)
        np.testing.assert_array_equal(vocab.encode(text), np.where(raw == 10, 256, raw))


# === Char level ===

CHAR_TEXT = st.one_of(
    # Mostly whitespace that str.split sees, and line ends...
    st.text(alphabet=st.sampled_from("ab \t\n\r\x0b\x0c\x1c\x85\u00a0\u2028\u3000é"), max_size=40),
    st.text(max_size=120),  # ...or any code point, lone surrogates too
)


@_settings(150)
@given(
    text=CHAR_TEXT,
    min_count=st.integers(1, 3),
    max_size=st.one_of(st.none(), st.integers(1, 6)),
)
# Found by this test: a blank last line without "\n" lost its <eos>; a lone
# surrogate was a UnicodeEncodeError.
@example(text="0\n\x85", min_count=1, max_size=None)
@example(text="ab\n \t", min_count=1, max_size=None)
@example(text="\ud800", min_count=1, max_size=None)
def test_char_level_round_trips_and_unk_is_exactly_the_dropped_characters(
    text, min_count, max_size
):
    lines = [" ".join(line.split()) for line in _reading_of(text)]
    chars = [c for line in lines for c in line]
    if any("\ud800" <= c <= "\udfff" for c in text):  # not a whole character
        with pytest.raises(ValueError, match="'train' split.*lone surrogate") as info:
            Corpus.from_texts({"train": text}, "char")
        _assert_ours(info.value)
        return
    if not chars:
        with pytest.raises(ValueError, match="'train' split.*contain tokens"):
            Corpus.from_texts({"train": text}, "char", min_count=min_count, max_size=max_size)
        return
    corpus = Corpus.from_texts({"train": text}, "char", min_count=min_count, max_size=max_size)
    vocab = corpus.vocabulary
    kept = _kept(chars, min_count, max_size)
    expected = []
    for line in lines:
        expected += [c if c in kept else "<unk>" for c in line] + ["<eos>"]
    assert vocab.to_tokens(corpus.train) == expected
    assert ("<unk>" in vocab) == (set(chars) != kept)
    assert set(vocab.tokens) == kept | {"<eos>"} | ({"<unk>"} if set(chars) != kept else set())
    # decode writes <eos> as a newline and <unk> as itself.
    assert vocab.decode(corpus.train) == "".join("\n" if t == "<eos>" else t for t in expected)
    if min_count == 1 and max_size is None:
        assert vocab.decode(corpus.train) == "".join(line + "\n" for line in lines)
        # encode reads a string the way the corpus read it (no <eos> after the last line).
        ids = vocab.encode("\n".join(lines))
        np.testing.assert_array_equal(ids, corpus.train[:-1])


# === Word level ===

WORDS = st.sampled_from(["the", "cat", "sat", "a", "dog", "é", "日本", "<unk>", "x1", "ran"])
LINES = st.lists(st.lists(WORDS, max_size=6), max_size=8)


def _text_of(lines, sep):
    return "".join(sep.join(words) + "\n" for words in lines)


@_settings(150)
@given(
    train=LINES, valid=LINES, test=LINES,
    min_count=st.integers(1, 4),
    max_size=st.one_of(st.none(), st.integers(1, 5)),
    sep=st.sampled_from([" ", "  ", "\t", " \u00a0 "]),
)
def test_word_level_unk_is_exactly_the_words_the_rules_exclude(
    train, valid, test, min_count, max_size, sep
):
    splits = {"train": train, "valid": valid, "test": test}
    texts = {split: _text_of(lines, sep) for split, lines in splits.items()}
    empty = [s for s, lines in splits.items() if not any(lines)]
    if empty:
        with pytest.raises(ValueError, match=f"{empty[0]!r} split.*contain tokens"):
            Corpus.from_texts(texts, min_count=min_count, max_size=max_size)
        return
    corpus = Corpus.from_texts(texts, min_count=min_count, max_size=max_size)
    vocab = corpus.vocabulary
    kept = _kept([w for line in train for w in line], min_count, max_size)
    for split, lines in splits.items():
        ids = corpus[split]
        assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < len(vocab)
        expected = []
        for words in lines:
            expected += [w if w in kept else "<unk>" for w in words] + ["<eos>"]
        assert vocab.to_tokens(ids) == expected, split
    assert set(vocab.tokens) - {"<eos>", "<unk>"} == kept
    if max_size is not None:
        assert len(vocab) <= max_size + 2
    # The vocabulary reads the same words the same way.
    np.testing.assert_array_equal(vocab.encode(texts["train"][:-1]), corpus.train[:-1])


# === load_text on any file ===

PIECES = st.sampled_from([
    b"\n", b"\r\n", b"\r", b"\x00", b"\xef\xbb\xbf", b"the", b"cat ", b" ", b"\t",
    b"\xff", b"\xc3", b"\xc3\xa9", "日本".encode(), b"<unk>", b"<eos>", b"\x1c",
    "\u2028".encode(), b"\x85", b"\xe2\x80",
])
FILE_BYTES = st.one_of(st.binary(max_size=200), st.lists(PIECES, max_size=60).map(b"".join))
FRACTIONS = st.sampled_from([(0.05, 0.05), (0.0, 0.0), (0.3, 0.3), (0.0, 0.5), (0.5, 0.0)])


@pytest.fixture(scope="module")
def directory():
    with tempfile.TemporaryDirectory() as name:
        yield name


def _write(path, data, compress):
    if compress:
        path += ".gz"
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return path


def _check_loaded(corpus, level, one_file=False):
    vocab = corpus.vocabulary
    assert vocab.level == level
    splits = list(corpus.splits.items())
    for k, (split, ids) in enumerate(splits):
        assert ids.dtype == np.int32 and ids.size, split
        assert ids.min() >= 0 and ids.max() < len(vocab), split
        assert isinstance(vocab.decode(ids), str)
        # Whole lines: each ends with <eos>, but at byte level the end of a
        # file without a last newline (the newline byte is the <eos>).
        if level != "byte" or (one_file and k < len(splits) - 1):
            assert ids[-1] == vocab.eos_id, split


@_settings(250)
@given(
    data=FILE_BYTES,
    level=st.sampled_from(["word", "char", "byte"]),
    fractions=FRACTIONS,
    compress=st.booleans(),
    encoding=st.sampled_from(["utf-8", "utf-8", "latin-1", "utf-16", "ascii"]),
)
def test_load_text_of_any_file_loads_or_says_what_is_wrong_with_it(
    directory, data, level, fractions, compress, encoding
):
    path = _write(os.path.join(directory, "any file.txt"), data, compress)
    try:
        corpus = load_text(
            path, level, valid_fraction=fractions[0], test_fraction=fractions[1],
            encoding=encoding,
        )
    except ValueError as error:
        _assert_ours(error)
        assert path in str(error), str(error)
        return
    _check_loaded(corpus, level, one_file=True)
    everything = np.concatenate(list(corpus.splits.values()))
    if level == "byte":  # nothing lost: the file's bytes, in order
        raw = np.frombuffer(data, np.uint8).astype(np.int64)
        np.testing.assert_array_equal(everything, np.where(raw == 10, 256, raw))
        assert corpus.vocabulary.encoding == encoding
    else:  # the same tokens as the text read in memory (line ends translated)
        text = data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
        whole = Corpus.from_texts({"train": text}, level)
        tokens = whole.vocabulary.to_tokens(whole.train)
        # Valid and test tokens unseen in training are <unk>.
        expected = [t if t in corpus.vocabulary else "<unk>" for t in tokens]
        assert corpus.vocabulary.to_tokens(everything) == expected


@_settings(100)
@given(
    files=st.fixed_dictionaries({"train": FILE_BYTES}, optional={"valid": FILE_BYTES, "test": FILE_BYTES}),
    level=st.sampled_from(["word", "char", "byte"]),
)
def test_load_text_of_any_files_loads_or_names_the_file_at_fault(directory, files, level):
    paths = {}
    for split, data in files.items():
        paths[split] = _write(os.path.join(directory, f"{split} file.txt"), data, False)
    try:
        corpus = load_text(paths, level)
    except ValueError as error:
        _assert_ours(error)
        assert any(p in str(error) for p in paths.values()), str(error)
        return
    _check_loaded(corpus, level)
    assert sorted(corpus.splits) == sorted(files)


# === Tokenizers ===

# What a tokenizer returns for a line; ("iter", [...]) is a fresh iterator.
TOKENIZER_ANSWERS = st.one_of(
    st.lists(st.text(min_size=1, max_size=4), max_size=4),  # fine
    st.lists(st.text(min_size=1, max_size=4), max_size=4).map(tuple),  # fine
    st.lists(st.text(min_size=1, max_size=4), max_size=4).map(lambda t: ("iter", t)),  # fine
    st.none(),
    st.text(max_size=5),
    st.integers(),
    st.lists(st.one_of(st.text(max_size=4), st.integers(), st.none(), st.binary(max_size=2)), max_size=4),
    st.just(ZeroDivisionError("boom")),
)


def _fine(answer):
    if isinstance(answer, tuple) and answer[:1] == ("iter",):
        answer = answer[1]
    return isinstance(answer, (list, tuple)) and all(isinstance(t, str) and t for t in answer)


@_settings(150)
@given(answers=st.lists(TOKENIZER_ANSWERS, min_size=1, max_size=6))
def test_a_tokenizer_that_returns_anything_loads_or_names_itself_the_file_and_line(
    directory, answers
):
    lines = [f"line {i}" for i in range(len(answers))]
    path = _write(os.path.join(directory, "tokenized.txt"), "\n".join(lines).encode(), False)
    by_line = dict(zip(lines, answers))

    def odd_tokenizer(line):
        answer = by_line[line]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, tuple) and answer[:1] == ("iter",):
            return iter(answer[1])
        return answer

    first_bad = next((i for i, a in enumerate(answers) if not _fine(a)), None)
    try:
        corpus = load_text(path, tokenizer=odd_tokenizer, valid_fraction=0, test_fraction=0)
    except ValueError as error:
        _assert_ours(error)
        message = str(error)
        if first_bad is None:
            assert "without any token" in message and repr(path) in message, message
            return
        assert "odd_tokenizer" in message and repr(path) in message, message
        assert f"line {first_bad + 1} " in message, message
        if isinstance(answers[first_bad], Exception):
            assert error.__cause__ is answers[first_bad]
        return
    assert first_bad is None, "a bad tokenizer answer was accepted"
    _check_loaded(corpus, "word")


# === decode on any array ===

ANY_DTYPE = st.one_of(
    hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(), hnp.floating_dtypes(),
    hnp.boolean_dtypes(), hnp.complex_number_dtypes(), hnp.unicode_string_dtypes(max_len=3),
    hnp.datetime64_dtypes(),
)


@pytest.mark.parametrize(
    "vocab",
    [Vocabulary(["<eos>", "the", "cat", "<unk>"]), Vocabulary(["a", " ", "<eos>"]), Vocabulary.bytes()],
    ids=["word", "char", "byte"],
)
@_settings(120)
@given(data=st.data())
def test_decode_of_any_array_decodes_valid_ids_or_raises_a_value_error(vocab, data):
    size = len(vocab)
    dtype = data.draw(ANY_DTYPE, label="dtype")
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4), label="shape")
    ids = data.draw(hnp.arrays(dtype, shape), label="ids")
    # Integer ids (not bool) in range; an empty array too, if of integers.
    valid = np.issubdtype(ids.dtype, np.integer) and (
        ids.size == 0 or (ids.min() >= 0 and ids.max() < size)
    )
    if not valid:
        with pytest.raises(ValueError, match=r"Expected `ids`.*Received") as info:
            vocab.decode(ids)
        _assert_ours(info.value)
        return
    tokens = [vocab.tokens[i] for i in ids.reshape(-1).tolist()]
    text = vocab.decode(ids)
    assert vocab.to_tokens(ids) == tokens
    if vocab.level == "word":
        assert text == " ".join(tokens)
    elif vocab.level == "char":
        assert text == "".join("\n" if t == "<eos>" else t for t in tokens)
    else:
        values = ids.reshape(-1).astype(np.int64)
        assert text == bytes(np.where(values == 256, 10, values).astype(np.uint8)).decode(
            "utf-8", errors="replace"
        )


@_settings(100)
@given(
    ids=st.recursive(
        st.one_of(
            st.integers(-3, 300), st.floats(allow_nan=True), st.booleans(), st.none(),
            st.text(max_size=3), st.binary(max_size=2),
        ),
        lambda inner: st.lists(inner, max_size=4),
        max_leaves=8,
    )
)
def test_decode_of_any_python_value_decodes_valid_ids_or_raises_a_value_error(ids):
    vocab = Vocabulary.bytes()
    try:
        text = vocab.decode(ids)
    except ValueError as error:
        _assert_ours(error)
        assert "Expected `ids`" in str(error), str(error)
        return
    # Decoded: integer ids (no bool) in range, or an empty list.
    array = np.asarray(ids)
    assert ids == [] or (
        np.issubdtype(array.dtype, np.integer) and array.min() >= 0 and array.max() < 257
    ), ids
    assert text == vocab.decode(array.reshape(-1).astype(np.int64))
