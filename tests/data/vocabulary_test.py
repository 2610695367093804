import json

import numpy as np
import pytest

from keras_mogrifier.data import Vocabulary


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
