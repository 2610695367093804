import numpy as np
import pytest
import keras

from keras_mogrifier.losses.chunked_log_softmax import chunked_target_log_softmax

from testing import BACKEND
from testing import backend_specific
from testing import jit
from testing import to_numpy
from testing import value_and_grad_fn

V, W = 13, 5


def _problem(shape=(2, 3, 7), seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=shape + (W,)).astype("float32")
    kernel = (scale * rng.normal(size=(W, V))).astype("float32")
    bias = rng.normal(size=(V,)).astype("float32")
    ids = rng.integers(0, V, size=shape).astype("int32")
    return h, kernel, bias, ids


def _numpy_log_prob(h, kernel, bias, ids):
    logits = h.astype("float64") @ kernel.astype("float64") + bias
    top = logits.max(-1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return np.take_along_axis(log_softmax, ids[..., None], -1)[..., 0], logits


def _numpy_gradients(h, kernel, bias, ids, upstream):
    # d/dlogits of Σ g·log p = g (onehot − softmax).
    _, logits = _numpy_log_prob(h, kernel, bias, ids)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    d_logits = upstream[..., None] * (np.eye(V)[ids] - p)
    flat_h, flat_d = h.reshape(-1, W).astype("float64"), d_logits.reshape(-1, V)
    return d_logits @ kernel.T, flat_h.T @ flat_d, flat_d.sum(0)


@pytest.mark.parametrize("chunk", [1, 4, 7, 42, 1000])
def test_matches_numpy_for_any_chunk_size(chunk):
    h, kernel, bias, ids = _problem()  # 42 tokens
    expected, _ = _numpy_log_prob(h, kernel, bias, ids)
    actual = chunked_target_log_softmax(h, kernel, bias, ids, chunk)
    assert tuple(actual.shape) == ids.shape
    np.testing.assert_allclose(to_numpy(actual), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "mode",
    [
        "eager",
        pytest.param(
            "graph",
            marks=backend_specific(
                "tensorflow", reason="a tf.function graph without XLA"
            ),
        ),
        "jit",  # XLA on TensorFlow and JAX (eager on PyTorch: `testing.jit`)
    ],
)
def test_gradients_match_numpy(mode):
    h, kernel, bias, ids = _problem(seed=1)
    upstream = np.random.default_rng(2).normal(size=ids.shape).astype("float32")

    def loss(h, kernel, bias):
        log_prob = chunked_target_log_softmax(h, kernel, bias, ids, 4)
        return keras.ops.sum(keras.ops.multiply(log_prob, upstream)), log_prob

    step = value_and_grad_fn(loss, has_aux=True)
    if mode == "jit":
        step = jit(step)
    elif mode == "graph":
        import tensorflow as tf

        step = tf.function(step)
    (_, log_prob), grads = step(h, kernel, bias)
    np.testing.assert_allclose(to_numpy(log_prob), _numpy_log_prob(h, kernel, bias, ids)[0], atol=1e-5)
    assert len(grads) == 3
    for actual, expected in zip(grads, _numpy_gradients(h, kernel, bias, ids, upstream)):
        np.testing.assert_allclose(to_numpy(actual), expected, rtol=1e-4, atol=1e-5)


def test_extreme_logits_are_finite_and_exact():
    h, kernel, bias, ids = _problem(scale=2e3)  # logits of order ±1e4
    expected, logits = _numpy_log_prob(h, kernel, bias, ids)
    assert np.abs(logits).max() > 1e4
    actual = to_numpy(chunked_target_log_softmax(h, kernel, bias, ids, 5))
    assert np.all(np.isfinite(actual))
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-2)


def test_out_of_vocabulary_ids_give_nan_and_others_are_unaffected():
    h, kernel, bias, ids = _problem()
    bad = ids.copy()
    bad[0, 0, 0], bad[1, 2, 6] = V, -1
    actual = to_numpy(chunked_target_log_softmax(h, kernel, bias, bad, 4))
    assert np.isnan(actual[0, 0, 0]) and np.isnan(actual[1, 2, 6])
    assert np.isnan(actual).sum() == 2
    expected, _ = _numpy_log_prob(h, kernel, bias, ids)
    ok = ~np.isnan(actual)
    np.testing.assert_allclose(actual[ok], expected[ok], atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_features_give_float32_log_probabilities(dtype):
    h, kernel, bias, ids = _problem()
    actual = chunked_target_log_softmax(keras.ops.cast(h, dtype), kernel, bias, ids, 8)
    assert keras.backend.standardize_dtype(actual.dtype) == "float32"
    expected, _ = _numpy_log_prob(h, kernel, bias, ids)
    np.testing.assert_allclose(to_numpy(actual), expected, atol=0.1)


def _tensorflow_shapes(step, args):
    """Shapes of every tensor of the traced graph, its loop bodies included."""
    import tensorflow as tf

    graph = tf.function(step).get_concrete_function(*args).graph
    # The loop bodies are functions of the graph's library.
    graphs = [graph] + [f.graph for f in graph._functions.values() if hasattr(f, "graph")]
    return [
        tuple(out.shape)
        for g in graphs
        for op in g.get_operations()
        for out in op.outputs
        if out.shape.rank is not None and out.shape.is_fully_defined()
    ]


def _jax_shapes(step, args):
    """Shapes of every value of the jaxpr, its loop bodies included."""
    import jax
    import jax.extend

    shapes = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            shapes.extend(tuple(v.aval.shape) for v in eqn.outvars)
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else [param]:
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(step)(*args).jaxpr)
    return shapes


def _torch_shapes(step, args):
    """Shapes of the outputs of every operator run, the backward pass included."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    shapes.append(tuple(t.shape))
            return out

    with Record():
        step(*args)
    return shapes


def test_no_tensor_larger_than_a_chunk_of_logits_is_formed():
    """The forward and backward passes never hold all N·V logits.

    TensorFlow and JAX: every tensor of the traced graph (jaxpr); PyTorch,
    which runs eagerly: the output of every operator that runs.
    """
    h, kernel, bias, ids = _problem(shape=(6, 50))  # 300 tokens
    chunk = 32
    step = value_and_grad_fn(
        lambda h, kernel, bias: keras.ops.sum(
            chunked_target_log_softmax(h, kernel, bias, ids, chunk)
        )
    )
    inspect = {
        "tensorflow": _tensorflow_shapes,
        "jax": _jax_shapes,
        "torch": _torch_shapes,
    }[BACKEND]
    shapes = [s for s in inspect(step, (h, kernel, bias)) if s and s[-1] == V]
    # 300 tokens run as 10 equal chunks of 30 (at most 32): one chunk of
    # logits exists, inside a loop body, and nothing larger.
    assert (30, V) in shapes
    assert max(np.prod(s) for s in shapes) == 30 * V


def test_bad_arguments():
    h, kernel, bias, ids = _problem()
    for chunk in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match="Expected `chunk_size`"):
            chunked_target_log_softmax(h, kernel, bias, ids, chunk)
    with pytest.raises(ValueError, match=r"Expected `kernel` of shape \(width, vocab\)"):
        chunked_target_log_softmax(h, kernel[None], bias, ids, 4)
    with pytest.raises(ValueError, match=r"Expected `targets` of shape"):
        chunked_target_log_softmax(h, kernel, bias, ids[:, :2], 4)
