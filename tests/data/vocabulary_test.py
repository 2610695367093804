import json

import numpy as np
import pytest

from keras_mogrifier.data import Vocabulary

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite


def test_build_orders_by_count_then_lexicographically():
    tokens = "b a c a b d <eos> a <eos> c".split()
    vocab = Vocabulary.build(tokens)
    # counts: a 3, b 2, c 2, <eos> 2, d 1; ties by code point ('<' < 'b' < 'c')
    assert vocab.tokens == ["a", "<eos>", "b", "c", "d"]
    assert vocab.eos_id == 1
    assert vocab.unk_id is None
    assert len(vocab) == 5
    # Deterministic whatever the order of the stream.
    assert Vocabulary.build(list(reversed(tokens))) == vocab


def test_eos_is_always_present():
    vocab = Vocabulary.build(["x", "y", "x"])
    assert vocab.tokens == ["x", "y", "<eos>"]
    with pytest.raises(ValueError, match="end-of-sentence token '<eos>'"):
        Vocabulary(["x", "y"])


def test_round_trip_ids_and_tokens():
    vocab = Vocabulary.build("the cat sat on the mat <eos>".split())
    tokens = "the mat sat <eos>".split()
    ids = vocab.to_ids(tokens)
    assert ids.dtype == np.int32
    assert ids.tolist() == [vocab.tokens.index(t) for t in tokens]
    assert vocab.to_tokens(ids) == tokens
    assert vocab.token_to_id("cat") == vocab.tokens.index("cat")
    assert vocab.id_to_token(0) == "the"
    assert "cat" in vocab and "dog" not in vocab


def test_unknown_tokens_map_to_unk_when_present():
    vocab = Vocabulary.build("a <unk> b <eos>".split())
    ids = vocab.to_ids(["a", "zebra", "b"])
    assert vocab.to_tokens(ids) == ["a", "<unk>", "b"]


def test_unknown_tokens_without_unk_raise_with_location():
    vocab = Vocabulary.build("a b <eos>".split())
    with pytest.raises(
        ValueError, match=r"Token 'zebra' \(position 1 of my text\).*no '<unk>'"
    ):
        vocab.to_ids(["a", "zebra", "b"], where="my text")
    with pytest.raises(ValueError, match=r"'zebra' \(here 1\)"):
        vocab.to_ids(iter(["a", "zebra"]), where=lambda i: f"here {i}")


def test_invalid_arguments():
    with pytest.raises(ValueError, match="duplicates"):
        Vocabulary(["a", "<eos>", "a"])
    with pytest.raises(ValueError, match="non-empty string"):
        Vocabulary(["a", "<eos>", ""])
    with pytest.raises(ValueError, match="not one string"):
        Vocabulary("abc")
    with pytest.raises(ValueError, match="eos_token"):
        Vocabulary(["a"], eos_token="")
    vocab = Vocabulary(["a", "<eos>"])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        vocab.to_tokens([0, 2])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        vocab.to_tokens([-1])
    with pytest.raises(ValueError, match="not one string"):
        vocab.to_ids("a")


def test_decode_says_what_ids_it_expected_and_the_first_it_could_not_take():
    vocab = Vocabulary(["<eos>", "the", "cat"])
    with pytest.raises(
        ValueError,
        match=r"Expected `ids` to hold integer token ids\. Received: "
        r"ids\.dtype=<U3, e\.g\. 'the' at position \(0,\)",
    ):
        vocab.decode(["the", "cat"])
    with pytest.raises(ValueError, match=r"ids\.dtype=float64, e\.g\. 1\.0 at position \(0,\)"):
        vocab.decode([1.0, 2.0])
    with pytest.raises(ValueError, match=r"ids\.dtype=bool, e\.g\. True"):
        vocab.decode([True])
    with pytest.raises(
        ValueError,
        match=r"Expected `ids` to hold token ids in \[0, 3\)\. Received: an id 3 "
        r"at position \(1, 0\)",
    ):
        vocab.decode([[0, 1], [3, -1]])
    with pytest.raises(ValueError, match=r"an id -1 at position \(1,\)"):
        Vocabulary.bytes().decode(np.array([104, -1], np.int8))
    with pytest.raises(ValueError, match=r"`encode` reads text.*ids='the cat'"):
        vocab.decode("the cat")
    for ragged in ([0, [1]], [None]):
        with pytest.raises(ValueError, match="Expected `ids`"):
            vocab.decode(ragged)
    # Valid ids in any integer array, list or iterator; nothing is "".
    assert vocab.decode(np.array([1, 2], np.uint8)) == "the cat"
    assert vocab.decode(iter([1, 2])) == "the cat"
    assert vocab.decode([]) == "" and vocab.to_tokens(()) == []


def test_encode_says_what_text_it_expected():
    vocab = Vocabulary(["<eos>", "the", "cat"])
    with pytest.raises(ValueError, match=r"Expected `text` to be a string\. Received: text of type NoneType"):
        vocab.encode(None)
    with pytest.raises(ValueError, match=r"Expected `text` to be a string or bytes"):
        Vocabulary.bytes().encode([104, 105])
    # Text the encoding cannot write: a ValueError of ours, not the codec's.
    with pytest.raises(ValueError, match=r"`text` \(prompt 0\).*'latin-1'.*'日' at position 2") as info:
        Vocabulary.bytes("latin-1").encode("ab日", where="prompt 0")
    assert not isinstance(info.value, UnicodeError)
    with pytest.raises(ValueError, match=r"'utf-8'.*'\\ud800' at position 0"):
        Vocabulary.bytes().encode("\ud800")


def test_save_and_load_json(tmp_path):
    vocab = Vocabulary(["é", " ", "<eos>", "<unk>", "N"], unk_token="<unk>")
    path = tmp_path / "vocab.json"
    vocab.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["tokens"] == ["é", " ", "<eos>", "<unk>", "N"]
    revived = Vocabulary.load(path)
    assert revived == vocab
    assert revived.unk_id == 3
    assert Vocabulary.from_config(vocab.get_config()) == vocab
    (tmp_path / "other.json").write_text('{"tokens": []}')
    with pytest.raises(ValueError, match="format tag"):
        Vocabulary.load(tmp_path / "other.json")


# === Levels: text in and out ===

MIXED = "Zürich, Ελληνικά, Русский, 日本語 🙂\nnaïve café"


def test_level_is_given_or_inferred():
    assert Vocabulary(["a", "<eos>"]).level == "word"
    assert Vocabulary(["a", " ", "<eos>"]).level == "char"
    assert Vocabulary.bytes().level == "byte"
    assert Vocabulary(Vocabulary.bytes().tokens).level == "byte"
    assert Vocabulary(["ab", "<eos>"], level="word").level == "word"
    with pytest.raises(ValueError, match="level"):
        Vocabulary(["a", "<eos>"], level="bytes")
    with pytest.raises(ValueError, match="single characters.*'ab'"):
        Vocabulary(["ab", " ", "<eos>"], level="char")
    with pytest.raises(ValueError, match="Vocabulary.bytes"):
        Vocabulary(["a", "<eos>"], level="byte")
    with pytest.raises(ValueError, match="encoding"):
        Vocabulary.bytes(encoding="no-such-codec")


def test_word_level_encode_and_decode():
    vocab = Vocabulary(["<eos>", "the", "cat", "<unk>"])
    ids = vocab.encode("the  cat\nthe dog")
    assert vocab.to_tokens(ids) == ["the", "cat", "<eos>", "the", "<unk>"]
    assert vocab.decode(ids) == "the cat <eos> the <unk>"
    # <eos> may be written out.
    assert vocab.encode("the <eos> cat").tolist() == [1, 0, 2]
    strict = Vocabulary(["<eos>", "the"])
    with pytest.raises(ValueError, match=r"'cat' \(position 1 of prompt 2\)"):
        strict.encode("the cat", where="prompt 2")
    with pytest.raises(ValueError, match="string"):
        vocab.encode(b"the cat")


def test_char_level_encode_and_decode():
    vocab = Vocabulary(["a", " ", "b", "<eos>", "c"])
    ids = vocab.encode("ab  c\n ba ")
    assert vocab.to_tokens(ids) == ["a", "b", " ", "c", "<eos>", "b", "a"]
    assert vocab.decode(ids) == "ab c\nba"


def test_byte_level_round_trips_any_text_exactly():
    vocab = Vocabulary.bytes()
    assert len(vocab) == 257 and vocab.eos_id == 256 and vocab.unk_id is None
    ids = vocab.encode(MIXED)
    raw = np.frombuffer(MIXED.encode("utf-8"), np.uint8).astype(int)
    np.testing.assert_array_equal(ids, np.where(raw == 10, 256, raw))
    assert vocab.decode(ids) == MIXED
    assert vocab.to_tokens(vocab.encode("a\n\x00é")) == ["a", "<eos>", "<0x00>", "<0xC3>", "<0xA9>"]
    # Bytes go in as they are; a sampled sequence that is not UTF-8 decodes
    # with U+FFFD instead of failing.
    assert vocab.encode(b"\xff\n").tolist() == [255, 256]
    assert vocab.decode([0xC3]) == "\ufffd"
    latin = Vocabulary.bytes(encoding="latin-1")
    assert latin.decode(latin.encode("café")) == "café"
    assert latin.encode("é").tolist() == [0xE9]


def test_levels_are_saved_and_old_configs_without_one_still_load(tmp_path):
    for vocab in (Vocabulary(["<eos>", "the"]), Vocabulary(["a", " ", "<eos>"]),
                  Vocabulary.bytes("latin-1")):
        config = vocab.get_config()
        assert config["level"] == vocab.level
        assert Vocabulary.from_config(config) == vocab
        path = tmp_path / f"{vocab.level}.json"
        vocab.save(path)
        assert Vocabulary.load(path) == vocab
        assert Vocabulary.load(path).encoding == vocab.encoding
    # Saved before levels existed: the tokens tell.
    old = {"tokens": ["a", " ", "<eos>"], "eos_token": "<eos>", "unk_token": "<unk>"}
    assert Vocabulary.from_config(old).level == "char"
    old["tokens"] = ["a", "<eos>"]
    assert Vocabulary.from_config(old).level == "word"
    (tmp_path / "v1.json").write_text(json.dumps({"format": "keras_mogrifier.Vocabulary", "version": 1, **old}))
    assert Vocabulary.load(tmp_path / "v1.json").level == "word"
    # The level is part of equality: same tokens, other level, other vocabulary.
    assert Vocabulary(["a", "<eos>"], level="char") != Vocabulary(["a", "<eos>"], level="word")
