"""Text prompts at every level, before and after saving: the vocabulary travels."""

import os

import keras
import numpy as np
import pytest

import keras_mogrifier  # noqa: F401  (registers the classes)
from keras_mogrifier.data import Vocabulary
from keras_mogrifier.data import load_text
from keras_mogrifier.models import LanguageModel

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
TEXT = "Zürich est en Suisse.\nΕλληνικά και Русский.\n日本語 🙂 naïve café\n" * 8


@pytest.mark.parametrize("level", ["word", "char", "byte"])
def test_generate_and_score_text_after_reload(tmp_path, level):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    corpus = load_text(path, level=level, valid_fraction=0.2, test_fraction=0.2)
    keras.utils.set_random_seed(0)
    model = LanguageModel(len(corpus.vocabulary), units=8, num_layers=1, batch_size=2,
                          vocabulary=corpus.vocabulary)
    model.build((2, None))
    prompt = {"word": "Zürich est", "char": "Zürich e", "byte": "Zürich e"}[level]
    before = model.generate(prompt, max_length=20, sampler="top_p", p=0.9, seed=3,
                            stop_token_ids=None)
    scored = model.score(prompt + " en")
    saved = str(tmp_path / "model.keras")
    model.save(saved)
    revived = keras.saving.load_model(saved)
    assert revived.vocabulary == corpus.vocabulary
    assert revived.vocabulary.level == level
    after = revived.generate(prompt, max_length=20, sampler="top_p", p=0.9, seed=3,
                             stop_token_ids=None)
    assert isinstance(after, str) and after == before
    assert after.startswith(prompt)
    again = revived.score(prompt + " en")
    assert again["num_tokens"] == scored["num_tokens"]
    np.testing.assert_allclose(again["log_probability"], scored["log_probability"], rtol=1e-5)
    if level == "byte":
        # Byte level: one token per byte of the UTF-8 text.
        assert scored["num_tokens"] == len((prompt + " en").encode("utf-8")) - 1


@pytest.mark.parametrize("level", ["word", "char"])
def test_models_saved_before_vocabularies_had_a_level_still_read_text(level):
    # Saved by the release before this one (vocabulary config without a
    # level); the level comes from the tokens.
    model = keras.saving.load_model(
        os.path.join(FIXTURES, f"release2_{level}_vocabulary.keras")
    )
    assert model.vocabulary.level == level
    prompt = {"word": "the cat", "char": "ab c"}[level]
    out = model.generate(prompt, max_length=6, stop_token_ids=None)
    assert out.startswith(prompt)
    expected = {"word": ["cat"], "char": ["b", " ", "c"]}[level]
    assert model.score(prompt)["tokens"] == expected


def test_a_vocabulary_of_another_level_cannot_be_read_with_a_byte_model():
    vocab = Vocabulary.bytes()
    model = LanguageModel(257, units=4, num_layers=1, batch_size=1, vocabulary=vocab)
    model.build((1, None))
    out = model.generate(b"\xff".decode("latin-1"), max_length=4, seed=0, stop_token_ids=None)
    assert isinstance(out, str)
    with pytest.raises(ValueError, match="257 tokens"):
        model.generate("a", max_length=4, vocabulary=Vocabulary(["a", "<eos>"]))
