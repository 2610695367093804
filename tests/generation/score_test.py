"""LanguageModel.score: the numbers `evaluate` gives, per text and per token."""

import math

import keras
import numpy as np
import pytest
from generate_test import V
from generate_test import WORDS
from generate_test import full_pass_log_probs
from generate_test import make_model

from keras_mogrifier.data import Vocabulary
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.generation import decode
from keras_mogrifier.generation import encode
from keras_mogrifier.metrics import Perplexity
from keras_mogrifier.models import LanguageModel


def test_score_equals_evaluate_on_the_same_text():
    model = make_model(cell="mogrifier_lstm", scale=0.3)
    model.set_temperature(0.9)
    text = np.random.default_rng(0).integers(0, V, 150).astype("int32")  # > one window
    result = model.score(text)
    assert result["num_tokens"] == 149
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[Perplexity()],
    )
    logs = model.evaluate(text[None, :-1], text[None, 1:], batch_size=1, verbose=0, return_dict=True)
    np.testing.assert_allclose(-result["log_probability"] / 149, logs["loss"], rtol=1e-5)
    np.testing.assert_allclose(result["perplexity"], logs["perplexity"], rtol=1e-4)
    # And the static scores of the dynamic evaluator, token by token.
    static = DynamicEvaluator(model).evaluate(text, adapt=False, verbose=0, return_token_losses=True)
    np.testing.assert_allclose(-result["token_log_probabilities"], static["token_losses"][0], atol=1e-5)


@pytest.mark.compiled  # bitwise across group sizes: XLA's optimisations on (tests/conftest.py)
def test_per_token_log_probabilities_of_a_batch_of_texts():
    model = make_model(dual=True, cell="rlstm")
    texts = ["the company said", "<eos> the stock fell in the first quarter <eos>", "a N"]
    results = model.score(texts)
    for text, result in zip(texts, results):
        ids = WORDS.to_ids(text.split())
        expected = full_pass_log_probs(model, [ids])[0][np.arange(len(ids) - 1), ids[1:]]
        np.testing.assert_allclose(result["token_log_probabilities"], expected, atol=1e-5)
        assert result["tokens"] == text.split()[1:]
        assert result["num_tokens"] == len(ids) - 1
        np.testing.assert_allclose(result["log_probability"], expected.sum(), rtol=1e-5)
        np.testing.assert_allclose(result["perplexity"], math.exp(-expected.mean()), rtol=1e-5)
        # A text scores the same alone as in a batch.
        alone = model.score(text)
        np.testing.assert_allclose(alone["token_log_probabilities"], result["token_log_probabilities"], atol=1e-6)
    # More texts than state rows: groups.
    many = model.score([[1, 2, 3]] * 7)
    assert len(many) == 7 and len({r["log_probability"] for r in many}) == 1
    assert "tokens" not in make_model(vocabulary=None).score([1, 2, 3])


def test_score_errors():
    model = make_model()
    with pytest.raises(ValueError, match=r"at least 2 tokens \(the first is context only\). Received: text 1 with 1 token"):
        model.score(["the company", "said"])
    with pytest.raises(ValueError, match="Expected at least one text"):
        model.score([])
    with pytest.raises(ValueError, match=rf"Expected token ids in \[0, {V}\) in text. Received: id 99"):
        model.score([1, 99])


def test_character_level_text():
    chars = Vocabulary(["a", " ", "b", "<eos>", "c"])
    ids = encode(chars, "ab  c\nba")
    assert chars.to_tokens(ids) == ["a", "b", " ", "c", "<eos>", "b", "a"]
    assert decode(chars, ids) == "ab c\nba"
    keras.utils.set_random_seed(0)
    model = LanguageModel(5, units=4, num_layers=1, batch_size=2, vocabulary=chars)
    model.build((2, None))
    assert model.score("abc")["tokens"] == ["b", "c"]
    assert model.generate("ab c", max_length=8, stop_token_ids=None).startswith("ab c")
    assert len(model.generate(encode(chars, "ab c"), max_length=8, stop_token_ids=None)) == 8
