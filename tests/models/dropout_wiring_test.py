"""Every dropout of `LanguageModel`, against an independent NumPy computation.

Keras's one dropout primitive (`keras.src.backend.random.dropout`, which
`keras.layers.Dropout`, `keras.random.dropout` and the cells' variational
masks all call) is replaced by one that draws its masks from NumPy and
records them, keyed by rate: each dropout of the model gets a distinct rate,
so every recorded mask is known to belong to one place. The test then
recomputes the training-mode logits in float64 NumPy from the equations
(`tests/reference.py` for the cells) with the same masks, in the places the
papers put them, and also checks how many masks each kind drew. Removing a
dropout, moving it, or adding one (e.g. a second mask on the last layer's
output) makes the logits or the counts disagree.

Where each mask belongs:

- Circling Back (Melis 2022) §3, the architecture's equations (seed
  `000_b82e325789bf71f8.txt`, lines 55-57): `x̂⁰ = E[w] ⊙ M_in`,
  `x̂ˡ = hˡ ⊙ M_cellˡ`, the state mask (variational, one per sequence) on
  `h_prev` and, in the RLSTM, on `c` inside `o`, layer l reads
  `Σ_{i<l} x̂ⁱ`, logits from `(Σ_l x̂ˡ) ⊙ M_out`.
- Plain stacking (Zaremba et al. 2014; the Dual paper, seed `002_…`,
  Table 1 "Rec. internal dropout: between the recurrent layers"):
  inter-layer dropout on the input of layers l > 1 only; the last layer's
  output gets the output dropout alone.
- Skip connections, deepmind/lamb (commit 254a0b0): `cell.py` 94-101
  (layer 0's input transform is `input_dropout`, layer l > 0's
  `inter_layer_dropout`), `tiled_lstm.py` 207-214 (the transform precedes
  the mogrifier), `skip_multi_rnn_cell.py` 89-94 (the output is the sum of
  the layers' *undropped* outputs), `lm.py` 235-238 (then output dropout).
- Dual head (*The Importance of the Current Input*, seed `002_…`, eq. 4-7
  and Table 1): "Dual input dropout" on the embedding path, "Rec. output
  dropout" on the recurrent path, "Dual output dropout" on `d_t`.
"""

import collections

import keras
import numpy as np
import pytest
from keras.src import backend as keras_backend

from keras_mogrifier.models import LanguageModel

import reference
from testing import to_numpy

V, B, T, N, L = 17, 2, 4, 6, 3
RATES = {
    "input": 0.11,
    "cell_output": 0.22,
    "state": 0.33,
    "output": 0.44,
    "dual_embedding": 0.15,
    "dual_hidden": 0.25,
}


class RecordedDropout:
    """A stand-in for the backend's `dropout` that records its masks."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.masks = collections.defaultdict(list)

    def __call__(self, inputs, rate, noise_shape=None, seed=None):
        assert noise_shape is None
        shape = tuple(int(d) for d in inputs.shape)
        keep = (self.rng.uniform(size=shape) >= rate) / (1.0 - rate)
        self.masks[round(float(rate), 6)].append(keep)
        return inputs * keras.ops.convert_to_tensor(keep.astype("float32"), inputs.dtype)

    def of(self, kind):
        return self.masks.get(RATES[kind], [])


@pytest.fixture
def recorded(monkeypatch):
    recorder = RecordedDropout()
    monkeypatch.setattr(keras_backend.random, "dropout", recorder)
    return recorder


def _model(wiring, cell, dual):
    model = LanguageModel(
        V, units=N, num_layers=L, cell=cell, mogrifier_rounds=2,
        residual=wiring == "residual", skip_connections=wiring == "skip",
        input_dropout=RATES["input"], cell_output_dropout=RATES["cell_output"],
        state_dropout=RATES["state"], output_dropout=RATES["output"],
        dual=dual, dual_embedding_dropout=RATES["dual_embedding"],
        dual_hidden_dropout=RATES["dual_hidden"], stateful=False,
    )
    ids = np.random.default_rng(0).integers(0, V, (B, T)).astype("int32")
    model(ids)
    rng = np.random.default_rng(1)
    for w in model.trainable_weights:
        w.assign(rng.normal(scale=0.4, size=w.shape))
    return model, ids


def _cell_output(model, layer, x, state_mask):
    cell = model.recurrent_layers[layer].cell
    weights = {
        "kernel": to_numpy(cell.kernel).astype("float64"),
        "recurrent_kernel": to_numpy(cell.recurrent_kernel).astype("float64"),
        "bias": to_numpy(cell.bias).astype("float64"),
    }
    rounds = []
    if cell.mogrifier is not None:
        mw = [w.astype("float64") for w in cell.mogrifier.get_weights()]
        rounds = [([mw[2 * k]], mw[2 * k + 1]) for k in range(len(mw) // 2)]
    if hasattr(cell, "forget_kernel"):
        step = reference.rlstm_step
        weights["forget_kernel"] = to_numpy(cell.forget_kernel).astype("float64")
        weights["output_kernel"] = to_numpy(cell.output_kernel).astype("float64")
    else:
        step = reference.lstm_step
    out, _, _ = reference.run_sequence(
        step, x, N, rounds=rounds, state_mask=state_mask, **weights
    )
    return out


def _expected_logits(model, ids, wiring, dual, masks):
    """The equations of the module docstring; `masks(kind)` gives the list."""
    table = to_numpy(model.embedding.embeddings).astype("float64")
    e = table[ids]
    x = e * masks("input")[0]
    outputs = []
    for layer in range(L):
        h = _cell_output(model, layer, x, masks("state")[layer])
        if wiring == "residual":
            outputs.append(h * masks("cell_output")[layer])
            x = sum(outputs)
        else:
            outputs.append(h)
            if layer < L - 1:
                x = h * masks("cell_output")[layer]
    top = outputs[-1] if wiring == "plain" else sum(outputs)
    if dual:
        w_de, w_dh, b_d = (w.astype("float64") for w in model.dual_layer.get_weights())
        d = (e * masks("dual_embedding")[0]) @ w_de + (top * masks("dual_hidden")[0]) @ w_dh
        top = np.maximum(d + b_d, 0.0) * masks("output")[0]
    else:
        top = top * masks("output")[0]
    return top @ table.T + to_numpy(model.output_bias).astype("float64")


def _expected_counts(wiring, dual):
    counts = {
        "input": 1,
        "state": L,
        # Residual: every layer's output; plain and skip: between layers.
        "cell_output": L if wiring == "residual" else L - 1,
        "output": 1,
        "dual_embedding": 1 if dual else 0,
        "dual_hidden": 1 if dual else 0,
    }
    return counts


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("cell", ["lstm", "mogrifier_rlstm"])
@pytest.mark.parametrize("wiring", ["residual", "plain", "skip"])
def test_every_dropout_mask_where_the_papers_put_it(recorded, wiring, cell, dual):
    model, ids = _model(wiring, cell, dual)
    recorded.masks.clear()
    logits = to_numpy(model(ids, training=True)).astype("float64")
    counts = {kind: len(recorded.of(kind)) for kind in RATES}
    assert counts == _expected_counts(wiring, dual)
    expected = _expected_logits(model, ids, wiring, dual, recorded.of)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    # Dropout off at evaluation: the same equations with every mask = 1.
    ones = lambda kind: [1.0] * L  # noqa: E731
    np.testing.assert_allclose(
        to_numpy(model(ids)).astype("float64"),
        _expected_logits(model, ids, wiring, dual, ones),
        rtol=1e-4, atol=1e-4,
    )


def test_one_layer_plain_stack_drops_its_output_once(recorded):
    """With one layer there is no inter-layer dropout at all: in training the
    logits differ from evaluation only by the output mask."""
    model = LanguageModel(
        V, units=N, num_layers=1, cell="lstm", residual=False,
        cell_output_dropout=0.5, output_dropout=RATES["output"], stateful=False,
    )
    ids = np.random.default_rng(2).integers(0, V, (B, T)).astype("int32")
    model(ids)
    recorded.masks.clear()
    logits = to_numpy(model(ids, training=True)).astype("float64")
    assert not recorded.masks.get(0.5)
    (mask,) = recorded.of("output")
    table = to_numpy(model.embedding.embeddings).astype("float64")
    h = _cell_output(model, 0, table[ids], None)
    expected = (h * mask) @ table.T + to_numpy(model.output_bias)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


def test_dual_dropout_shorthand_sets_both_paths(recorded):
    model = LanguageModel(V, units=N, num_layers=1, dual=True, dual_dropout=0.3,
                          dual_hidden_dropout=0.2, stateful=False)
    assert model.dual_layer.embedding_dropout_rate == 0.3
    assert model.dual_layer.hidden_dropout_rate == 0.2
    config = model.get_config()
    assert (config["dual_dropout"], config["dual_embedding_dropout"],
            config["dual_hidden_dropout"]) == (0.3, None, 0.2)
    assert LanguageModel.from_config(config).get_config() == config
    with pytest.raises(ValueError, match="Expected `dual_embedding_dropout`"):
        LanguageModel(V, units=N, dual=True, dual_embedding_dropout=1.0)


def test_skip_connections_need_residual_off():
    with pytest.raises(ValueError, match="Expected `skip_connections=True` with `residual=False`"):
        LanguageModel(V, units=N, skip_connections=True)
    model = LanguageModel(V, units=N, residual=False, skip_connections=True)
    config = model.get_config()
    assert config["skip_connections"] is True
    assert LanguageModel.from_config(config).get_config() == config
