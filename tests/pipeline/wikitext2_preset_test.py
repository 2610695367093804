"""The `wikitext2` preset: lamb's released Wikitext-2 MoS configuration,
converted to the library's per-token units (SPEC §6)."""

import numpy as np
import pytest

from keras_mogrifier.models import LanguageModel
from keras_mogrifier.pipeline import units
from keras_mogrifier.pipeline.presets import get_preset

# deepmind/lamb experiment/mogrifier/config/
# c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747/config
LAMB = {
    "mos_num_components": 2, "input_dropout": 0.5469087645499495,
    "output_dropout": 0.34766651193735193, "inter_layer_dropout": 0.1988228263748591,
    "state_dropout": 0.22137985867236876, "l2_penalty": 0.00018994987193751323,
    "max_grad_norm": 10.0, "max_time_steps": 70, "batch_size": 64,
    "learning_rate": 0.003287792100749033, "feature_mask_rounds": 6,
    "feature_mask_rank": 48, "input_embedding_ratio": 0.1993194960596213,
}


def test_wikitext2_preset_is_lambs_configuration_in_our_units():
    preset = get_preset("wikitext2")
    model, training = preset["model"], preset["training"]
    assert model["mixture_of_softmaxes"] == LAMB["mos_num_components"]
    assert model["input_dropout"] == LAMB["input_dropout"]
    assert model["output_dropout"] == LAMB["output_dropout"]
    assert model["cell_output_dropout"] == LAMB["inter_layer_dropout"]
    assert model["state_dropout"] == LAMB["state_dropout"]
    assert (model["residual"], model["skip_connections"]) == (False, True)
    assert (model["mogrifier_rounds"], model["mogrifier_rank"]) == (6, 48)
    assert model["embedding_dim"] == int(LAMB["input_embedding_ratio"] * model["units"])
    t = LAMB["max_time_steps"]
    assert training["sequence_length"] == t
    np.testing.assert_allclose(model["l2"], LAMB["l2_penalty"] / (2 * t))
    assert model["l2"] == units.summed_loss_l2(LAMB["l2_penalty"], t)
    np.testing.assert_allclose(training["global_clipnorm"], LAMB["max_grad_norm"] / t)
    assert training["batch_size"] == LAMB["batch_size"]
    assert training["learning_rate"] == LAMB["learning_rate"]
    assert (training["optimizer"], training["beta_1"]) == ("adam", 0.0)


def test_wikitext2_preset_is_the_largest_model_within_35m_parameters():
    def count(model_args, units_):
        args = dict(model_args, units=units_, embedding_dim=int(
            LAMB["input_embedding_ratio"] * units_), stateful=False)
        model = LanguageModel(33278, **args)
        model.build((None, None))
        return sum(int(np.prod(v.shape)) for v in model.trainable_weights)

    model_args = get_preset("wikitext2")["model"]
    assert count(model_args, model_args["units"]) <= 35_000_000
    assert count(model_args, model_args["units"] + 1) > 35_000_000


def test_wikitext2_preset_builds_lambs_model_and_optimizer():
    """What the pipeline builds from the preset, not only the dict: a change in
    how the model or optimizer reads a setting (a dropped `beta_1`, a mixture
    without its context dropout, plain stacking instead of skips) fails here."""
    import keras

    from keras_mogrifier.pipeline.language_modeling import build_language_model
    from keras_mogrifier.pipeline.language_modeling import build_optimizer

    preset = get_preset("wikitext2", model={"units": 12, "embedding_dim": 4,
                                            "mogrifier_rank": 3})
    model = build_language_model(50, preset["model"], batch_size=2)
    t = LAMB["max_time_steps"]
    # The mixture of 2 softmaxes, its contexts dropped at lamb's
    # downprojected_output_dropout (-1, line 18: the output dropout).
    assert model.mixture.components == LAMB["mos_num_components"]
    assert model.mixture.dropout_layer.rate == LAMB["output_dropout"]
    assert model.input_dropout_layer.rate == LAMB["input_dropout"]
    assert model.output_dropout_layer.rate == LAMB["output_dropout"]
    assert model.cell_output_dropout_layers[0].rate == LAMB["inter_layer_dropout"]
    for rnn in model.recurrent_layers:
        assert rnn.cell.recurrent_dropout == LAMB["state_dropout"]
        assert rnn.cell.capped_input_gate
        assert rnn.cell.mogrifier_rounds == LAMB["feature_mask_rounds"]
    # lamb's skip connections: the output reads the sum of both layers.
    assert (model.residual, model.skip_connections) == (False, True)
    x = np.zeros((2, 3), "int32")
    features, _ = model.features_and_logits(x)
    model.reset_states()
    outputs = []
    h = model.embedding(x)
    for rnn in model.recurrent_layers:
        h, _, _ = rnn(h)
        outputs.append(keras.ops.convert_to_numpy(h))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(features), sum(outputs), atol=1e-5)
    # Every trainable variable carries lamb's penalty, in our units.
    assert len(model.losses) == len(model.trainable_weights)
    optimizer = build_optimizer(dict(preset["training"], two_tailed_averaging=False))
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert optimizer.beta_1 == 0.0 and optimizer.beta_2 == 0.999  # lamb lines 61-62
    assert optimizer.epsilon == pytest.approx(1e-8 / t)  # line 63, ÷ T
    assert optimizer.global_clipnorm == pytest.approx(LAMB["max_grad_norm"] / t)
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
                               LAMB["learning_rate"], rtol=1e-6)
