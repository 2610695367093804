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
    assert results["uniform_cross_entropy"] == pytest.approx(math.log(10))
    # Well under a uniform guess (2.30 nats): the sequences are learned.
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
