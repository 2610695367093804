"""examples/reverse_copy.py learns short sequences quickly (Mogrifier §4.3)."""

import json
import math

import keras
import pytest

from ptb_word_test import _load_example


@pytest.mark.parametrize("cell", ["lstm", "mogrifier_lstm"])
def test_learns_length_5_vocabulary_10_in_3_epochs(tmp_path, cell):
    keras.utils.set_random_seed(0)
    example = _load_example("reverse_copy")
    path = tmp_path / "results.json"
    example.main([
        "--cell", cell, "--length", "5", "--vocabulary-size", "10",
        "--train-examples", "20000", "--evaluation-examples", "1000", "--epochs", "3",
        "--units", "48", "--embedding-size", "16", "--mogrifier-rounds", "2",
        "--verbose", "0", "--results-json", str(path),
    ])
    results = json.loads(path.read_text())
    # Ten tokens and the end-of-sequence token.
    assert results["uniform_cross_entropy"] == pytest.approx(math.log(11))
    # Well under a uniform guess (2.40 nats): the sequences are learned.
    assert results["test_cross_entropy"] < 0.3
    assert results["test_accuracy"] > 0.9
    assert results["parameters"] > 0 and results["backend"] == keras.backend.backend()


def test_units_for_a_parameter_budget():
    example = _load_example("reverse_copy")
    units = example.units_for_parameters("mogrifier_lstm", 30_000, 10, 8, rounds=2)
    model = example.build_model("mogrifier_lstm", 10, 8, units, rounds=2)
    smaller = example.build_model("mogrifier_lstm", 10, 8, units - 1, rounds=2)
    larger = example.build_model("mogrifier_lstm", 10, 8, units + 1, rounds=2)
    assert abs(model.count_params() - 30_000) <= min(
        abs(smaller.count_params() - 30_000), abs(larger.count_params() - 30_000)
    )


@pytest.mark.parametrize("cell", ["lstm", "mogrifier_lstm"])
def test_the_model_is_lambs_copy_model(cell):
    """lamb's copy configuration (tune_copy.sh, lm.py): both cells capped, the
    LSTM baseline too; separate embeddings; a down-projection to the
    embedding size before a softmax over the tokens and the end-of-sequence
    token; Adam with β₁ = 0, ε 1e-8 and clip 10 on the summed loss."""
    import keras_mogrifier as km

    example = _load_example("reverse_copy")
    model = example.build_model(cell, 10, 8, 24, rounds=2, length=5)
    for name in ("encoder", "decoder"):
        rnn = model.get_layer(name)
        assert isinstance(rnn.cell, km.MogrifierLSTMCell)
        assert rnn.cell.capped_input_gate
        assert rnn.cell.mogrifier_rounds == (0 if cell == "lstm" else 2)
    assert tuple(model.get_layer("projection").kernel.shape) == (24, 8)
    assert model.get_layer("projection").bias is None
    assert tuple(model.get_layer("output").kernel.shape) == (8, 11)
    assert model.get_layer("encoder_embedding") is not model.get_layer("decoder_embedding")
    optimizer = model.optimizer
    assert optimizer.beta_1 == 0.0
    assert optimizer.epsilon == pytest.approx(1e-8 / 6)  # T = L + 1 target tokens
    assert optimizer.global_clipnorm == pytest.approx(10 / 6)
    # Without a projection when the embedding is as wide as the cell (lamb
    # projects only then).
    square = example.build_model(cell, 10, 24, 24, rounds=2, length=5)
    assert "projection" not in [layer.name for layer in square.layers]
