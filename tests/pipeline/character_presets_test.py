"""The `enwik8` and `text8` presets: the papers' character-level configurations,
converted to the library's per-token units (docs/units.md)."""

import math

import numpy as np
import pytest

from keras_mogrifier.models import LanguageModel
from keras_mogrifier.pipeline import units
from keras_mogrifier.pipeline.presets import get_preset

# deepmind/lamb (commit 254a0b0) experiment/mogrifier/config/
# 4d0a9a5bdb04+_tune_enwik8_48m_lstm_fm_d4_arms/trial_234/config, by line.
LAMB_ENWIK8_48M = {
    "num_params": 48000000,  # 7
    "share_input_and_output_embeddings": False,  # 8
    "input_embedding_ratio": 1.0,  # 11
    "input_dropout": 0.015496029112930465,  # 16
    "output_dropout": 0.138307173174503,  # 17
    "num_layers": 4,  # 23
    "residual_connections": False,  # 24
    "lstm_skip_connection": True,  # 25
    "feature_mask_rounds": 6,  # 26
    "feature_mask_rank": 79,  # 27
    "cap_input_gate": True,  # 36
    "inter_layer_dropout": 0.008633961431527571,  # 38
    "state_dropout": 0.0437288219541186,  # 39
    "num_training_samples": 1,  # 45
    "l2_penalty": 0.000993383826740019,  # 46
    "drop_state_probability": 0.01,  # 49
    "steps_per_turn": 400,  # 57
    "turns": 100,  # 59
    "batch_size": 128,  # 67
    "max_grad_norm": 10.0,  # 69
    "max_time_steps": 500,  # 70
    "learning_rate": 0.001021423409385794,  # 74
}


def _count(model_args, width, vocabulary_size):
    args = dict(model_args, units=width, embedding_dim=width, stateful=False,
                initializer="zeros")
    model = LanguageModel(vocabulary_size, **args)
    model.build((None, None))
    return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def test_enwik8_preset_is_lambs_48m_configuration_in_our_units():
    lamb = LAMB_ENWIK8_48M
    preset = get_preset("enwik8")
    model, training = preset["model"], preset["training"]
    assert model["num_layers"] == lamb["num_layers"]
    assert (model["mogrifier_rounds"], model["mogrifier_rank"]) == (
        lamb["feature_mask_rounds"], lamb["feature_mask_rank"]
    )
    assert model["tie_embeddings"] == lamb["share_input_and_output_embeddings"]
    assert model["embedding_dim"] == int(lamb["input_embedding_ratio"] * model["units"])
    assert (model["residual"], model["skip_connections"]) == (
        lamb["residual_connections"], lamb["lstm_skip_connection"]
    )
    assert model["capped_input_gate"] is lamb["cap_input_gate"]
    for ours, theirs in (("input_dropout", "input_dropout"),
                         ("output_dropout", "output_dropout"),
                         ("cell_output_dropout", "inter_layer_dropout"),
                         ("state_dropout", "state_dropout")):
        assert model[ours] == lamb[theirs]
    assert model["samples"] == lamb["num_training_samples"]
    assert model["drop_state_probability"] == lamb["drop_state_probability"]
    t = lamb["max_time_steps"]
    assert training["sequence_length"] == t
    # lamb's loss is summed over the window: l2 / (2T) per Σv², clip / T.
    np.testing.assert_allclose(model["l2"], lamb["l2_penalty"] / (2 * t))
    np.testing.assert_allclose(training["global_clipnorm"], lamb["max_grad_norm"] / t)
    # ε is added to sqrt(v̂), which is T times ours on the summed loss.
    np.testing.assert_allclose(training["epsilon"], 1e-8 / t)  # rmsprop_epsilon, line 63
    assert training["batch_size"] == lamb["batch_size"]
    assert training["learning_rate"] == lamb["learning_rate"]
    assert (training["optimizer"], training["beta_1"]) == ("adam", 0.0)
    # 40,000 steps of 128 × 500 bytes over 90M training bytes.
    steps = lamb["turns"] * lamb["steps_per_turn"]
    epochs = steps * lamb["batch_size"] * t / 90_000_000
    assert training["epochs"] == math.floor(epochs) == 28


def test_character_presets_are_the_largest_models_within_48m_parameters():
    for name, vocabulary_size in (("enwik8", 257), ("text8", 28)):
        model = get_preset(name)["model"]
        width = model["units"]
        assert _count(model, width, vocabulary_size) <= 48_000_000, name
        assert _count(model, width + 1, vocabulary_size) > 48_000_000, name


def test_text8_preset_is_circling_backs_recipe_from_the_enwik8_rates():
    preset = get_preset("text8")
    model, training = preset["model"], preset["training"]
    enwik8 = get_preset("enwik8")["model"]
    # Circling Back §7: 6 layers, batch 128, BPTT 256, 200 epochs, one
    # dropout sample; the RLSTM, residual, RAdam, 2TA, Chrono (§2-§5).
    assert model["num_layers"] == 6 and model["cell"] == "mogrifier_rlstm"
    assert model["residual"] and not model["tie_embeddings"]
    assert (training["batch_size"], training["sequence_length"], training["epochs"]) == (128, 256, 200)
    assert model["samples"] == 1
    assert training["optimizer"] == "radam" and training["two_tailed_averaging"]
    assert math.exp(2) <= model["chrono_t_max"] <= math.exp(5)
    for rate in ("input_dropout", "cell_output_dropout", "state_dropout", "output_dropout"):
        assert model[rate] == enwik8[rate]
    assert model["l2"] == pytest.approx(units.summed_loss_l2(LAMB_ENWIK8_48M["l2_penalty"], 256))
    assert training["global_clipnorm"] == pytest.approx(10.0 / 256)
    assert training["epsilon"] == pytest.approx(1e-8 / 256)
