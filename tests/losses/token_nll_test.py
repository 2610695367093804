import numpy as np
import pytest
import keras

from keras_mogrifier.losses import token_nll

from testing import backend_specific
from testing import jit
from testing import to_numpy
from testing import value_and_gradients


def np_token_nll(ids, logits):
    """NumPy float64 reference of SPEC §4: -log mean_d softmax(logits_d)[w]."""
    logits = np.asarray(logits, np.float64)
    if logits.ndim == ids.ndim + 1:
        logits = logits[:, None]
    shift = logits.max(axis=-1, keepdims=True)
    log_z = shift[..., 0] + np.log(np.exp(logits - shift).sum(-1))
    idx = np.broadcast_to(ids[:, None, ..., None], logits.shape[:-1] + (1,))
    log_p = np.take_along_axis(logits, idx, axis=-1)[..., 0] - log_z  # (b, d, t)
    m = log_p.max(axis=1, keepdims=True)
    log_mean_p = m[:, 0] + np.log(np.exp(log_p - m).mean(axis=1))
    return -log_mean_p


@pytest.mark.parametrize("samples", [1, 3, 8])
def test_matches_numpy_log_mean_exp(samples):
    rng = np.random.default_rng(samples)
    logits = rng.normal(scale=3.0, size=(4, samples, 5, 11)).astype("float32")
    ids = rng.integers(0, 11, size=(4, 5))
    got = to_numpy(token_nll(ids, logits))
    assert got.shape == (4, 5)
    np.testing.assert_allclose(got, np_token_nll(ids, logits), rtol=1e-5, atol=1e-5)


def test_averages_probabilities_not_losses():
    # Two samples: the target has probability 1/2 under one and ~0 under the
    # other. Mean probability 1/4 -> loss ln 4; mean of losses would be huge.
    logits = np.array([[[[0.0, 0.0, -1e4]], [[-1e4, 0.0, 0.0]]]], "float32")
    got = float(to_numpy(token_nll(np.array([[0]]), logits))[0, 0])
    assert got == pytest.approx(np.log(4.0), rel=1e-6)


def test_without_sample_axis_is_cross_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 13)).astype("float32")
    ids = rng.integers(0, 13, size=(3, 7))
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_softmax, ids[..., None], -1)[..., 0]
    np.testing.assert_allclose(to_numpy(token_nll(ids, logits)), expected, rtol=1e-5, atol=1e-6)
    # A sample axis of size 1 is the same thing.
    np.testing.assert_allclose(
        to_numpy(token_nll(ids, logits[:, None])), expected, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("samples", [1, 3, 8])
def test_extreme_logits_are_finite_and_exact(samples):
    rng = np.random.default_rng(10 + samples)
    logits = rng.choice([-1e4, 1e4, 0.0], size=(2, samples, 6, 9)).astype("float32")
    ids = rng.integers(0, 9, size=(2, 6))
    got = to_numpy(token_nll(ids, logits))
    expected = np_token_nll(ids, logits)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-2)


def test_gradient_matches_analytic_and_is_finite():
    rng = np.random.default_rng(3)
    for scale in (1.0, 1e4):
        logits = (rng.normal(size=(2, 3, 4, 6)) * scale).astype("float32")
        ids = rng.integers(0, 6, size=(2, 4))
        _, (grad,) = value_and_gradients(
            lambda x: keras.ops.sum(token_nll(ids, x)), [logits]
        )
        assert np.all(np.isfinite(grad))
        # d/dlogits_d of -log mean_d p_d[w] = -r_d (onehot(w) - softmax_d),
        # with r_d = p_d[w] / sum_d' p_d'[w] (the importance weights).
        x = logits.astype(np.float64)
        sm = np.exp(x - x.max(-1, keepdims=True))
        sm /= sm.sum(-1, keepdims=True)
        log_p = np.take_along_axis(
            x
            - x.max(-1, keepdims=True)
            - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
            np.broadcast_to(ids[:, None, :, None], (2, 3, 4, 1)),
            -1,
        )[..., 0]
        r = np.exp(log_p - log_p.max(1, keepdims=True))
        r /= r.sum(1, keepdims=True)
        onehot = np.eye(6)[ids][:, None]
        expected = -r[..., None] * (onehot - sm)
        np.testing.assert_allclose(grad, expected, atol=1e-5)


def test_half_precision_logits_are_promoted():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(2, 2, 3, 5)).astype("float16")
    ids = rng.integers(0, 5, size=(2, 3))
    got = token_nll(ids, logits)
    assert keras.backend.standardize_dtype(got.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(got), np_token_nll(ids, logits), rtol=1e-5)


@pytest.mark.parametrize("bad_id", [-1, 5, 99])
def test_out_of_vocabulary_ids_raise_eagerly(bad_id):
    ids = np.array([[0, 1, bad_id]])
    with pytest.raises(ValueError, match=rf"vocab=5.*id {bad_id} at index \(0, 2\)"):
        token_nll(ids, np.zeros((1, 2, 3, 5), "float32"))


@backend_specific(
    "tensorflow",
    "jax",
    reason="torch.compile: test_ids_stay_in_a_torch_compile_graph",
)
@pytest.mark.compiled
def test_out_of_vocabulary_ids_give_nan_in_a_traced_graph():
    ids = np.array([[0, 1, 7]], "int32")
    logits = np.zeros((1, 3, 5), "float32")
    traced = jit(token_nll)  # tf.function(jit_compile=True) / jax.jit
    got = to_numpy(traced(ids, logits))
    np.testing.assert_allclose(got[0, :2], np.log(5.0), rtol=1e-6)
    assert np.isnan(got[0, 2])


@backend_specific("torch", reason="torch.compile is PyTorch's compiler")
def test_ids_stay_in_a_torch_compile_graph():
    # Under torch.compile the ids are traced, as under XLA: the id check,
    # which would copy them to the host and split the graph (every training
    # step of a model compiled with `jit_compile=True`), is skipped, and an
    # out-of-range id gives NaN.
    import torch

    logits = torch.zeros((1, 3, 5))
    good = torch.as_tensor(np.array([[0, 1, 4]]))
    bad = torch.as_tensor(np.array([[0, 1, 7]]))
    token_nll(good, logits)  # eager first: the backend module is imported
    explanation = torch._dynamo.explain(token_nll)(good, logits)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(token_nll)
    np.testing.assert_allclose(to_numpy(compiled(good, logits)), np.log(5.0), rtol=1e-6)
    got = to_numpy(compiled(bad, logits))
    np.testing.assert_allclose(got[0, :2], np.log(5.0), rtol=1e-6)
    assert np.isnan(got[0, 2])
    with pytest.raises(ValueError, match=r"id 7 at index \(0, 2\)"):
        token_nll(bad, logits)  # eagerly, still the clear error


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="rank"):
        token_nll(np.zeros((2, 3), "int32"), np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match="rank"):
        token_nll(np.zeros((2, 3), "int32"), np.zeros((2, 1, 1, 3, 4), "float32"))
    with pytest.raises(ValueError, match="axis 0 differs"):
        token_nll(np.zeros((2, 3), "int32"), np.zeros((3, 3, 4), "float32"))
    with pytest.raises(ValueError, match="axis 2 differs"):
        token_nll(np.zeros((2, 3), "int32"), np.zeros((2, 4, 5, 4), "float32"))
    with pytest.raises(ValueError, match="at least one sample"):
        token_nll(np.zeros((2, 3), "int32"), np.zeros((2, 0, 3, 4), "float32"))


def test_samples_argument_requires_the_sample_axis():
    ids = np.zeros((2, 3), "int32")
    with pytest.raises(ValueError, match="sample axis of size 4"):
        token_nll(ids, np.zeros((2, 3, 5), "float32"), samples=4)
    with pytest.raises(ValueError, match="4 samples on axis 1"):
        token_nll(ids, np.zeros((2, 2, 3, 5), "float32"), samples=4)
    with pytest.raises(ValueError, match="Expected `samples`"):
        token_nll(ids, np.zeros((2, 3, 5), "float32"), samples=0)
    # D = 1 accepts logits without a sample axis.
    got = token_nll(ids, np.zeros((2, 3, 5), "float32"), samples=1)
    assert to_numpy(got).shape == (2, 3)
