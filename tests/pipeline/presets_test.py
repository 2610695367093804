import math

import pytest

from keras_mogrifier.pipeline import get_preset


def test_small_preset_is_zaremba_exactly():
    p = get_preset("small")
    m, t = p["model"], p["training"]
    assert m["cell"] == "lstm" and m["units"] == 200 and m["num_layers"] == 2
    assert not m["capped_input_gate"] and not m["residual"] and not m["tie_embeddings"]
    assert all(m.get(k, 0.0) == 0.0 for k in ("input_dropout", "state_dropout", "output_dropout", "cell_output_dropout"))
    assert m["initializer"]["config"]["minval"] == -0.1 and m["initializer"]["config"]["maxval"] == 0.1
    assert (t["batch_size"], t["sequence_length"], t["epochs"]) == (20, 20, 13)
    # Zaremba: SGD at 1, clip 5, on the loss summed over the T = 20 steps;
    # the same updates on the per-token mean loss: lr × T, clip / T.
    T = t["sequence_length"]
    assert (t["optimizer"], t["halve_after_epoch"]) == ("sgd", 4)
    assert t["learning_rate"] / T == 1.0 and t["global_clipnorm"] * T == 5.0


def test_paper_preset_follows_circling_back():
    p = get_preset("paper")
    m, t = p["model"], p["training"]
    assert m["cell"] == "mogrifier_rlstm" and m["mogrifier_rounds"] == 5 and m["mogrifier_rank"] == 84
    assert m["samples"] == 8 and m["residual"] and m["tie_embeddings"]
    assert m["softmax_chunk_size"] == 1024
    assert math.e**2 <= m["chrono_t_max"] <= math.e**5
    assert t["optimizer"] == "radam" and t["two_tailed_averaging"] and t["divergence_recovery"]
    assert (t["batch_size"], t["sequence_length"]) == (128, 70)


def test_overrides_and_errors():
    p = get_preset("tiny", model={"units": 8}, training={"epochs": 2})
    assert p["model"]["units"] == 8 and p["training"]["epochs"] == 2
    assert get_preset("tiny")["model"]["units"] != 8  # presets are copied
    with pytest.raises(ValueError, match="Expected `preset`"):
        get_preset("huge")
    with pytest.raises(ValueError, match="unknown: \\['epoch'\\]"):
        get_preset("tiny", training={"epoch": 2})
