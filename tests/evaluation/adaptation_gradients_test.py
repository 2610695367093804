"""PyTorch's hand-written backward pass of dynamic evaluation
(`backend.torch.adaptation_gradients`): the losses and the carried state of
autograd's path bit for bit, its gradients to float rounding, and the tied
table's update fused into the pass equal to the dense gradient's update."""

import keras
import numpy as np
import pytest
from testing import BACKEND

from keras_mogrifier import DynamicEvaluator
from keras_mogrifier.models import LanguageModel

pytestmark = pytest.mark.skipif(
    BACKEND != "torch", reason="PyTorch's hand-written backward pass"
)

VOCABULARY, UNITS = 40, 12

VARIANTS = {
    "rlstm": dict(cell="rlstm"),
    "lstm": dict(cell="lstm"),
    "mogrifier_rlstm_low_rank": dict(cell="mogrifier_rlstm", mogrifier_rounds=5, mogrifier_rank=3),
    "mogrifier_lstm": dict(cell="mogrifier_lstm", mogrifier_rounds=4, capped_input_gate=False),
    "mogrifier_lstm_capped": dict(cell="mogrifier_lstm", mogrifier_rounds=3, capped_input_gate=True),
    "plain": dict(cell="rlstm", residual=False),
    "skip": dict(cell="mogrifier_lstm", mogrifier_rounds=2, residual=False, skip_connections=True),
    "three_layers_temperature": dict(cell="rlstm", num_layers=3, temperature=0.7),
}


def _model(rows, steps, **options):
    options.setdefault("num_layers", 2)
    keras.utils.set_random_seed(0)
    model = LanguageModel(VOCABULARY, units=UNITS, batch_size=rows, **options)
    model.build((rows, steps))
    rng = np.random.default_rng(3)
    for variable in model.backbone.recurrent_state_variables:
        variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.5)
    return model


def _inputs(rows, steps, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCABULARY, (rows, steps)).astype("int32")
    x[:, -1] = x[:, 0]  # a repeated id: two rows of the lookup's gradient add up
    y = rng.integers(0, VOCABULARY, (rows, steps)).astype("int32")
    v = rng.random((rows, steps)).astype("float32")
    v[-1, -1] = 0.0  # a token left out of the objective (padding)
    return x, y, v


def _autograd(model, variables):
    from keras_mogrifier.backend import torch as torch_backend
    from keras_mogrifier.evaluation._adaptation_step import token_losses

    def objective(x, y, v):
        losses = token_losses(model, x, y)
        return keras.ops.sum(losses * v), losses

    return torch_backend.model_gradients(model, variables, objective, False)


def _both(model, variables, x, y, v):
    """(losses, gradients, state) of autograd's path, then of the hand-written one,
    each from the same carried state."""
    import torch

    from keras_mogrifier.backend import torch as torch_backend

    state = [keras.ops.convert_to_numpy(s).copy() for s in model.backbone.recurrent_state_variables]
    out = []
    for gradients_of in (_autograd(model, variables), torch_backend.adaptation_gradients(model, variables)):
        assert gradients_of is not None
        for variable, value in zip(model.backbone.recurrent_state_variables, state):
            variable.assign(value)
        losses, gradients = gradients_of(torch.tensor(x), torch.tensor(y), torch.tensor(v))
        out.append((
            losses.numpy(),
            [g.numpy() for g in gradients],
            [keras.ops.convert_to_numpy(s).copy() for s in model.backbone.recurrent_state_variables],
        ))
    return out


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_gradients_equal_autograds(name):
    rows, steps = 2, 5
    model = _model(rows, steps, **VARIANTS[name])
    (losses, gradients, state), (hand_losses, hand_gradients, hand_state) = _both(
        model, model.trainable_variables, *_inputs(rows, steps)
    )
    np.testing.assert_array_equal(hand_losses, losses)  # the same forward pass
    for a, b in zip(hand_state, state):
        np.testing.assert_array_equal(a, b)
    for variable, g, h in zip(model.trainable_variables, gradients, hand_gradients):
        assert np.abs(g).max() > 0, variable.path
        np.testing.assert_allclose(h, g, rtol=2e-5, atol=2e-6 * np.abs(g).max(), err_msg=variable.path)


@pytest.mark.parametrize("steps", [1, 7])
def test_other_segment_lengths_and_a_subset_of_variables(steps):
    model = _model(3, steps, cell="mogrifier_rlstm", mogrifier_rounds=3)
    # Every other variable: the table or the output bias may be left out.
    for variables in (model.trainable_variables[::2], model.trainable_variables[1::2]):
        (losses, gradients, _), (hand_losses, hand_gradients, _) = _both(
            model, variables, *_inputs(3, steps, seed=steps)
        )
        np.testing.assert_array_equal(hand_losses, losses)
        for g, h in zip(gradients, hand_gradients):
            np.testing.assert_allclose(h, g, rtol=2e-5, atol=2e-6 * np.abs(g).max())


def test_ties_split_the_gradient_as_autograd_does():
    # The cells' weights zero but for j's bias: i = σ(0) = 1 − f for the
    # RLSTM and z_i = −z_f for the capped LSTM, in every unit at every step
    # (the minimum's ties), and j ≠ 0, so that the tie's gradient is not 0.
    for options, j_block in ((dict(cell="rlstm"), 1), (dict(cell="lstm", capped_input_gate=True), 2)):
        model = _model(1, 4, **options)
        for layer in model.backbone.recurrent_layers:
            for weight in layer.cell.trainable_weights:
                value = np.zeros(weight.shape, "float32")
                if weight is layer.cell.bias:
                    value[j_block * UNITS:(j_block + 1) * UNITS] = 1.0
                weight.assign(value)
        (_, gradients, _), (_, hand_gradients, _) = _both(
            model, model.trainable_variables, *_inputs(1, 4)
        )
        for g, h in zip(gradients, hand_gradients):
            np.testing.assert_allclose(h, g, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("rule", ["sgd", "rms_global_prior", "rms_rms_prior"])
def test_the_fused_table_update_equals_the_dense_gradients_update(rule):
    import torch

    from keras_mogrifier.backend import torch as torch_backend

    rows, steps = 2, 5
    model = _model(rows, steps, cell="rlstm")
    variables = model.trainable_variables
    start = [keras.ops.convert_to_numpy(v).copy() for v in variables]
    state = [keras.ops.convert_to_numpy(s).copy() for s in model.backbone.recurrent_state_variables]
    rng = np.random.default_rng(2)
    theta_g = [torch.tensor(t) for t in start]
    rms = [torch.tensor(rng.random(t.shape).astype("float32") + 0.1) for t in start]
    hyperparameters = torch.tensor([0.05, 1e-3, 0.02, 0.5])
    results = []
    for fused in (False, True):
        for variable, value in zip(variables, start):
            variable.assign(value)
        for variable, value in zip(model.backbone.recurrent_state_variables, state):
            variable.assign(value)
        gradients_of = torch_backend.adaptation_gradients(model, variables)
        step = torch_backend.in_place_update(rule)(variables, theta_g, rms, hyperparameters)
        for segment in range(3):
            x, y, v = (torch.tensor(a) for a in _inputs(rows, steps, seed=segment))
            _, gradients = gradients_of(x, y, v, update=step if fused else None)
            table = [g for var, g in zip(variables, gradients) if var is model.backbone.embedding.embeddings]
            assert (table[0] is None) == fused  # the table: updated already
            with torch.no_grad():
                step(gradients)
        results.append([keras.ops.convert_to_numpy(v).copy() for v in variables])
    for variable, dense, fused in zip(variables, *results):
        assert not np.array_equal(dense, variable_start(start, variables, variable)), variable.path
        np.testing.assert_allclose(fused, dense, rtol=1e-6, atol=1e-7, err_msg=variable.path)


def variable_start(start, variables, variable):
    return start[[id(v) for v in variables].index(id(variable))]


@pytest.mark.parametrize(
    "options",
    [
        dict(cell="rlstm", tie_embeddings=False),
        dict(cell="rlstm", dual=True),
        dict(cell="rlstm", mixture_of_softmaxes=2),
        dict(cell="rlstm", stateful=False),
        dict(cell="rlstm", adaptation_units=UNITS, adaptation_streams=None),
    ],
    ids=["untied", "dual", "mixture", "not_stateful", "adaptation_units"],
)
def test_models_it_does_not_cover_take_autograds_path(options):
    from keras_mogrifier.backend import torch as torch_backend

    model = _model(1, 5, **options) if options.get("stateful", True) else _stateless(options)
    assert torch_backend.adaptation_gradients(model, model.trainable_variables) is None


def _stateless(options):
    keras.utils.set_random_seed(0)
    model = LanguageModel(VOCABULARY, units=UNITS, num_layers=2, **options)
    model.build((1, 5))
    return model


def test_a_variable_it_does_not_know_takes_autograds_path():
    from keras_mogrifier.backend import torch as torch_backend

    model = _model(1, 5, cell="rlstm")
    other = keras.Variable(np.zeros((3,), "float32"))
    assert torch_backend.adaptation_gradients(model, [*model.trainable_variables, other]) is None


def test_dynamic_evaluation_takes_it_and_scores_as_autograd_does(monkeypatch):
    from keras_mogrifier.backend import torch as torch_backend

    stream = np.random.default_rng(0).integers(0, VOCABULARY, 61).astype("int32")
    calls = []
    original = torch_backend.adaptation_gradients

    def spy(model, variables):
        made = original(model, variables)
        calls.append(made is not None)
        return made

    results = []
    for hand in (True, False):
        monkeypatch.setattr(
            torch_backend, "adaptation_gradients", spy if hand else (lambda m, v: None)
        )
        model = _model(1, 5, cell="mogrifier_rlstm", mogrifier_rounds=3)
        evaluator = DynamicEvaluator(model, segment_length=5, learning_rate=0.002)
        evaluator.collect_gradient_statistics(stream, batch_size=1)
        results.append(evaluator.evaluate(stream, verbose=0, return_token_losses=True))
    assert calls == [True]
    hand, autograd = (np.ravel(r["token_losses"]) for r in results)
    static = np.ravel(
        DynamicEvaluator(_model(1, 5, cell="mogrifier_rlstm", mogrifier_rounds=3), segment_length=5)
        .evaluate(stream, adapt=False, verbose=0, return_token_losses=True)["token_losses"]
    )
    assert np.abs(autograd - static).max() > 1e-3  # the weights did adapt
    np.testing.assert_allclose(hand, autograd, rtol=1e-5, atol=1e-5)
