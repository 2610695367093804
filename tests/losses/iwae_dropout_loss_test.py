import keras
import numpy as np
import pytest
from keras import layers
from keras import ops

from keras_mogrifier.losses import IWAEDropoutLoss
from keras_mogrifier.metrics import Perplexity

import reference
from testing import backend_specific

np_token_nll = reference.token_nll


@pytest.mark.parametrize("samples", [1, 3, 8])
def test_mean_over_tokens_matches_numpy(samples):
    rng = np.random.default_rng(samples)
    logits = rng.normal(scale=2.0, size=(3, samples, 4, 10)).astype("float32")
    ids = rng.integers(0, 10, size=(3, 4))
    loss = IWAEDropoutLoss()
    expected = np_token_nll(ids, logits).mean()
    assert float(loss(ids, logits)) == pytest.approx(expected, rel=1e-5)
    assert float(IWAEDropoutLoss(samples=samples)(ids, logits)) == pytest.approx(
        expected, rel=1e-5
    )


@pytest.mark.parametrize("samples", [1, 3, 8])
def test_extreme_logits(samples):
    rng = np.random.default_rng(20 + samples)
    logits = rng.choice([-1e4, 1e4], size=(2, samples, 5, 7)).astype("float32")
    ids = rng.integers(0, 7, size=(2, 5))
    got = float(IWAEDropoutLoss()(ids, logits))
    assert np.isfinite(got)
    assert got == pytest.approx(np_token_nll(ids, logits).mean(), rel=1e-6, abs=1e-2)


def test_single_sample_equals_keras_sparse_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(scale=4.0, size=(4, 6, 9)).astype("float32")
    ids = rng.integers(0, 9, size=(4, 6))
    reference = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    expected = float(reference(ids, logits))
    assert float(IWAEDropoutLoss()(ids, logits)) == pytest.approx(expected, rel=1e-6)
    assert float(IWAEDropoutLoss()(ids, logits[:, None])) == pytest.approx(
        expected, rel=1e-6
    )


def test_sample_weight_gives_weighted_token_mean():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 2, 5, 6)).astype("float32")
    ids = rng.integers(0, 6, size=(3, 5))
    weights = rng.integers(0, 2, size=(3, 5)).astype("float32")
    weights[0, 0] = 1.0
    nll = np_token_nll(ids, logits)
    got = float(IWAEDropoutLoss()(ids, logits, sample_weight=weights))
    assert got == pytest.approx((nll * weights).sum() / weights.sum(), rel=1e-5)
    # Per-sequence weights broadcast over time.
    seq_weights = np.array([1.0, 0.0, 2.0], "float32")
    got = float(IWAEDropoutLoss()(ids, logits, sample_weight=seq_weights))
    expected = (nll * seq_weights[:, None]).sum() / (seq_weights.sum() * 5)
    assert got == pytest.approx(expected, rel=1e-5)


def test_padding_with_zero_weight_does_not_change_the_loss():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 4, 5)).astype("float32")
    ids = rng.integers(0, 5, size=(2, 4))
    padded_logits = np.concatenate([logits, rng.normal(size=(2, 3, 2, 5))], axis=2)
    padded_ids = np.concatenate([ids, np.zeros((2, 2), int)], axis=1)
    weights = np.concatenate([np.ones((2, 4)), np.zeros((2, 2))], axis=1)
    loss = IWAEDropoutLoss()
    assert float(loss(padded_ids, padded_logits, sample_weight=weights)) == (
        pytest.approx(float(loss(ids, logits)), rel=1e-6)
    )


def test_bad_inputs_raise_value_error():
    ids = np.zeros((2, 3), "int32")
    with pytest.raises(ValueError, match="sample axis of size 4"):
        IWAEDropoutLoss(samples=4)(ids, np.zeros((2, 3, 5), "float32"))
    with pytest.raises(ValueError, match="vocab=5"):
        IWAEDropoutLoss()(np.array([[0, 5, 1], [0, 0, 0]]), np.zeros((2, 2, 3, 5)))
    with pytest.raises(ValueError, match="vocab=5"):
        IWAEDropoutLoss()(np.array([[0, -1, 1], [0, 0, 0]]), np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="at least one sample"):
        IWAEDropoutLoss()(ids, np.zeros((2, 0, 3, 5), "float32"))
    for samples in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="Expected `samples`"):
            IWAEDropoutLoss(samples=samples)
    with pytest.raises(ValueError, match="reduction"):
        IWAEDropoutLoss(reduction="median")


def test_config_round_trip_and_registration():
    loss = IWAEDropoutLoss(samples=3, reduction="sum", name="objective")
    config = loss.get_config()
    assert config["samples"] == 3
    revived = IWAEDropoutLoss.from_config(config)
    assert revived.get_config() == config
    serialized = keras.saving.serialize_keras_object(loss)
    assert serialized["registered_name"] == "keras_mogrifier>IWAEDropoutLoss"
    revived = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(revived, IWAEDropoutLoss) and revived.samples == 3


class _Samples(layers.Layer):
    """Repeats its input D times on a new axis 1 (each copy gets its own dropout)."""

    def __init__(self, samples, **kwargs):
        super().__init__(**kwargs)
        self.samples = samples

    def call(self, x):
        return ops.repeat(ops.expand_dims(x, 1), self.samples, axis=1)

    def get_config(self):
        return {**super().get_config(), "samples": self.samples}


def _multi_sample_model(vocab, time, samples, seed=0):
    inputs = keras.Input((time,), dtype="int32")
    h = layers.Embedding(vocab, 16)(inputs)
    h = _Samples(samples)(h)
    h = layers.Dropout(0.3, seed=seed)(h)
    logits = layers.Dense(vocab)(h)  # (batch, samples, time, vocab)
    return keras.Model(inputs, logits)


# jit_compile=True: XLA on TensorFlow and JAX. On PyTorch, Keras hands the
# whole train step to torch.compile, where Keras's own dropout seeds break
# the graph into pieces compiled one by one (47 s for this tiny model on a
# quiet core); the loss under torch.compile is tested on its own below.
@pytest.mark.parametrize(
    "jit_compile",
    [False, pytest.param(True, marks=pytest.mark.skipif(
        keras.backend.backend() == "torch",
        reason="torch.compile of the loss: test_loss_and_gradient_under_torch_compile"))],
)
def test_fit_with_samples_decreases_the_loss(jit_compile):
    keras.utils.set_random_seed(0)
    vocab, time = 12, 6
    x = np.random.default_rng(0).integers(0, vocab, size=(64, time))
    y = (x + 1) % vocab  # a learnable next-token rule
    model = _multi_sample_model(vocab, time, samples=2)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=IWAEDropoutLoss(samples=2),
        metrics=[Perplexity()],
        jit_compile=jit_compile,
    )
    history = model.fit(x, y, batch_size=16, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    assert np.all(np.isfinite(losses))
    # The metric sees the same (multi-sample) objective over the same tokens.
    assert "perplexity" in history.history


@backend_specific("torch", reason="torch.compile is PyTorch's compiler")
def test_loss_and_gradient_under_torch_compile():
    import torch

    rng = np.random.default_rng(4)
    ids = torch.as_tensor(rng.integers(0, 10, size=(3, 4)))
    logits = rng.normal(scale=2.0, size=(3, 2, 4, 10)).astype("float32")
    loss = IWAEDropoutLoss(samples=2)

    def value(logits):
        return loss(ids, logits)

    # One graph: the id check (ids outside the vocabulary raise eagerly) is
    # skipped while compiling (once the backend module is imported: an
    # eager call first).
    value(torch.as_tensor(logits))
    explanation = torch._dynamo.explain(value)(torch.as_tensor(logits))
    assert explanation.graph_break_count == 0, explanation.break_reasons

    def value_and_gradient(function):
        tensor = torch.as_tensor(logits).requires_grad_(True)
        result = function(tensor)
        result.backward()
        return float(result), tensor.grad.numpy()

    compiled_value, compiled_gradient = value_and_gradient(torch.compile(value))
    eager_value, eager_gradient = value_and_gradient(value)
    assert compiled_value == pytest.approx(np_token_nll(ids.numpy(), logits).mean(), rel=1e-5)
    assert compiled_value == pytest.approx(eager_value, rel=1e-6)
    np.testing.assert_allclose(compiled_gradient, eager_gradient, rtol=1e-5, atol=1e-7)


def test_mask_excludes_padded_tokens_in_evaluate():
    keras.utils.set_random_seed(1)
    vocab, time = 7, 5
    inputs = keras.Input((time,), dtype="int32")
    h = layers.Embedding(vocab, 8, mask_zero=True)(inputs)
    logits = layers.Dense(vocab)(h)  # carries the mask of the inputs
    model = keras.Model(inputs, logits)
    model.compile(loss=IWAEDropoutLoss(), metrics=[Perplexity()])
    rng = np.random.default_rng(0)
    x = rng.integers(1, vocab, size=(4, time))
    x[:, 3:] = 0  # padding
    y = rng.integers(0, vocab, size=(4, time))
    results = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    nll = np_token_nll(y, model.predict(x, verbose=0))
    expected = nll[:, :3].mean()
    assert results["loss"] == pytest.approx(expected, rel=1e-5)
    assert results["perplexity"] == pytest.approx(np.exp(expected), rel=1e-5)


def _out_of_range_problem():
    vocab, time = 5, 3
    inputs = keras.Input((time,), dtype="int32")
    logits = layers.Dense(vocab)(layers.Embedding(vocab, 4)(inputs))
    model = keras.Model(inputs, logits)
    x = np.zeros((2, time), "int32")
    y = np.array([[0, 1, 2], [3, 4, vocab]])
    return model, x, y


@backend_specific(
    "tensorflow",
    "jax",
    reason="PyTorch's evaluate runs eagerly (no trace where the ids have no "
    "value): there an out-of-range id raises, as tested below",
)
@pytest.mark.compiled
def test_out_of_range_targets_in_compiled_evaluate_give_nan():
    model, x, y = _out_of_range_problem()
    model.compile(loss=IWAEDropoutLoss())
    loss = model.evaluate(x, y, verbose=0)
    assert np.isnan(loss)


def test_out_of_range_targets_in_eager_evaluate_raise():
    # Eagerly (run_eagerly=True) the same batch is a clear error.
    model, x, y = _out_of_range_problem()
    model.compile(loss=IWAEDropoutLoss(), run_eagerly=True)
    with pytest.raises(ValueError, match="vocab=5"):
        model.evaluate(x, y, verbose=0)


def test_saved_model_reloads_with_the_loss(tmp_path):
    vocab, time = 6, 4
    inputs = keras.Input((time,), dtype="int32")
    logits = layers.Dense(vocab)(layers.Embedding(vocab, 4)(inputs))
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer="sgd", loss=IWAEDropoutLoss(samples=1), metrics=[Perplexity()]
    )
    x = np.arange(8).reshape(2, time) % vocab
    model.fit(x, x, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    revived = keras.saving.load_model(path)
    assert isinstance(revived.loss, IWAEDropoutLoss)
    assert revived.loss.samples == 1
    assert model.evaluate(x, x, verbose=0, return_dict=True) == pytest.approx(
        revived.evaluate(x, x, verbose=0, return_dict=True)
    )
