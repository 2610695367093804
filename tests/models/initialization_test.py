"""The initialisers of a default `LanguageModel`, as docs/fidelity.md lists
them against deepmind/lamb's ("Initialisation: lamb's and ours"): a change of
a default fails here until the table is updated."""

import keras
import numpy as np
import pytest

from keras_mogrifier.layers.mogrifier import MogrifierFactorInitializer
from keras_mogrifier.models import LanguageModel
from testing import to_numpy


def _built(**kwargs):
    model = LanguageModel(300, units=64, num_layers=1, **kwargs)
    model.build((2, None))
    return model


def _weights(model):
    return {v.path.split("/", 1)[-1]: to_numpy(v) for v in model.weights}


def test_defaults_are_the_ones_fidelity_md_lists():
    model = _built(embedding_dim=48, mogrifier_rank=4)
    cell = model.recurrent_layers[0].cell
    assert isinstance(cell.kernel_initializer, keras.initializers.GlorotUniform)
    assert isinstance(cell.recurrent_initializer, keras.initializers.Orthogonal)
    assert isinstance(cell.bias_initializer, keras.initializers.Zeros)
    assert cell.unit_forget_bias and cell.capped_input_gate
    assert isinstance(model.embedding.embeddings_initializer, keras.initializers.RandomUniform)
    assert model.embedding.embeddings_initializer.get_config()["maxval"] == 0.05
    assert isinstance(model.projection.kernel_initializer, keras.initializers.GlorotUniform)
    mixture = _built(mixture_of_softmaxes=2).mixture
    assert isinstance(mixture.kernel_initializer, keras.initializers.GlorotUniform)
    assert isinstance(mixture.bias_initializer, keras.initializers.Zeros)
    # The values: gate biases 0 but the forget gate's 1; state and output
    # bias zero; mogrifier biases zero.
    w = _weights(model)
    bias = w["recurrent_0/cell_0/bias"].reshape(4, 64)
    np.testing.assert_array_equal(bias[[0, 2, 3]], 0.0)
    np.testing.assert_array_equal(bias[1], 1.0)
    np.testing.assert_array_equal(w["output_bias"], 0.0)
    for name, value in w.items():
        if name.startswith("state_") or "round_" in name and name.endswith("_bias"):
            np.testing.assert_array_equal(value, 0.0, err_msg=name)


@pytest.mark.parametrize("rank", [None, 4])
def test_mogrifier_factors_are_lambs(rank):
    """lamb/utils.py 640-649: a truncated normal of std (1/(fan_in·k))^(1/4)
    per factor (the same before truncation as ours); full rank sqrt(1/fan_in)."""
    # Seeded: unseeded, this failed in 3 of ~10 runs of the mutation check's
    # copies (never in a checkout); the draws are then the same every run.
    keras.utils.set_random_seed(0)
    model = _built(mogrifier_rank=rank, mogrifier_rounds=2)
    mogrifier = model.recurrent_layers[0].cell.mogrifier
    assert mogrifier.kernel_initializer is None  # the authors' default
    w = _weights(model)
    factor = w["recurrent_0/cell_0/mogrifier/round_1_kernel" + ("" if rank is None else "_a")]
    expected = MogrifierFactorInitializer(64, rank).stddev
    assert expected == pytest.approx(
        np.sqrt(1 / 64) if rank is None else (1 / (64 * 4)) ** 0.25)
    # A normal truncated at two standard deviations keeps 0.88 of its std.
    assert np.abs(factor).max() <= 2 * expected + 1e-6
    assert factor.std() == pytest.approx(0.88 * expected, rel=0.1)


def test_each_rounds_factors_take_the_fan_in_of_the_vector_they_read():
    """Round 1 reads the state h (64 units) to gate the input x (48), round 2
    reads x to gate h: each round's kernel has the std of the fan-in of what
    it reads (lamb/utils.py 640-649: `fan_in` of the matrix applied to the
    source), sqrt(1/64) and sqrt(1/48), 15% apart."""
    keras.utils.set_random_seed(0)
    model = _built(embedding_dim=48, mogrifier_rounds=2)
    w = _weights(model)
    for round_, fan_in in ((1, 64), (2, 48)):
        factor = w[f"recurrent_0/cell_0/mogrifier/round_{round_}_kernel"]
        expected = MogrifierFactorInitializer(fan_in, None).stddev
        # 3,072 draws: the std is estimated within ~1.3% (one SE).
        assert factor.std() == pytest.approx(0.88 * expected, rel=0.05), round_
