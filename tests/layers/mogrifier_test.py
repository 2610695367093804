import numpy as np
import pytest
import keras

import keras_mogrifier as km
from keras_mogrifier.layers import MogrifierFactorInitializer

import reference
import testing
from testing import to_numpy

M, N, B = 6, 10, 4


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(B, M)).astype("float32"),
        rng.normal(size=(B, N)).astype("float32"),
    )


def _randomize(layer, seed=1, scale=0.5):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(scale=scale, size=w.shape) for w in layer.get_weights()]
    layer.set_weights(weights)
    return weights


def _reference_rounds(weights, rounds, rank, use_bias):
    """Groups the flat weight list by round: (matrices, bias)."""
    per_round = (1 if rank is None else 2) + (1 if use_bias else 0)
    grouped = []
    for r in range(rounds):
        chunk = weights[r * per_round : (r + 1) * per_round]
        if use_bias:
            grouped.append((chunk[:-1], chunk[-1]))
        else:
            grouped.append((chunk, None))
    return grouped


@pytest.mark.parametrize("rounds", [1, 2, 5, 6])
@pytest.mark.parametrize("rank", [None, 3])
@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_numpy_reference(rounds, rank, use_bias):
    x, h = _inputs()
    layer = km.Mogrifier(rounds, rank=rank, use_bias=use_bias)
    layer([x, h])
    weights = _randomize(layer)
    x_out, h_out = (to_numpy(t) for t in layer([x, h]))
    x_ref, h_ref = reference.mogrify(
        x, h, _reference_rounds(weights, rounds, rank, use_bias)
    )
    np.testing.assert_allclose(x_out, x_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_out, h_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [None, 2])
def test_weights_created_round_by_round_in_order(rank):
    layer = km.Mogrifier(3, rank=rank)
    layer.build([(None, M), (None, N)])
    names = [w.path.split("/")[-1] for w in layer.weights]
    shapes = [tuple(w.shape) for w in layer.weights]
    if rank is None:
        assert names == [
            "round_1_kernel", "round_1_bias",
            "round_2_kernel", "round_2_bias",
            "round_3_kernel", "round_3_bias",
        ]
        assert shapes == [(N, M), (M,), (M, N), (N,), (N, M), (M,)]
    else:
        assert names == [
            "round_1_kernel_a", "round_1_kernel_b", "round_1_bias",
            "round_2_kernel_a", "round_2_kernel_b", "round_2_bias",
            "round_3_kernel_a", "round_3_kernel_b", "round_3_bias",
        ]
        assert shapes == [
            (N, 2), (2, M), (M,),
            (M, 2), (2, N), (N,),
            (N, 2), (2, M), (M,),
        ]
    # Every round has its own variables: nothing shared.
    assert len({id(w) for w in layer.weights}) == len(layer.weights)


def test_zero_weights_are_identity():
    x, h = _inputs()
    layer = km.Mogrifier(5, rank=3)
    layer([x, h])
    layer.set_weights([np.zeros(w.shape) for w in layer.get_weights()])
    x_out, h_out = (to_numpy(t) for t in layer([x, h]))
    np.testing.assert_array_equal(x_out, x)
    np.testing.assert_array_equal(h_out, h)


def test_x_is_gated_first_by_h():
    x, h = _inputs()
    layer = km.Mogrifier(1)
    layer([x, h])
    (q, b) = _randomize(layer)
    x_out, h_out = (to_numpy(t) for t in layer([x, h]))
    np.testing.assert_array_equal(h_out, h)
    np.testing.assert_allclose(
        x_out, 2 * reference.sigmoid(h @ q + b) * x, rtol=1e-5, atol=1e-6
    )


def test_each_round_uses_the_latest_other_vector():
    # Round 2 must gate h by the x produced in round 1 (the zigzag).
    x, h = _inputs()
    layer = km.Mogrifier(2)
    layer([x, h])
    q, b1, r, b2 = _randomize(layer)
    h_out = to_numpy(layer([x, h])[1])
    x1 = 2 * reference.sigmoid(h @ q + b1) * x
    np.testing.assert_allclose(
        h_out, 2 * reference.sigmoid(x1 @ r + b2) * h, rtol=1e-5, atol=1e-6
    )


def test_default_initializer_gives_product_variance_one_over_fan_in():
    fan_in, rank = 400, 20
    init = MogrifierFactorInitializer(fan_in, rank, seed=3)
    a = keras.ops.convert_to_numpy(init((fan_in, rank)))
    b = keras.ops.convert_to_numpy(init((rank, 300)))
    # A truncated normal at 2 stddevs keeps ~0.774 of the variance per factor.
    expected = (1.0 / fan_in) * 0.774**2
    assert np.var(a @ b) == pytest.approx(expected, rel=0.15)
    full = MogrifierFactorInitializer(fan_in, seed=3)
    q = keras.ops.convert_to_numpy(full((fan_in, 300)))
    assert np.var(q) == pytest.approx(0.774 / fan_in, rel=0.1)


def test_config_round_trip_and_saving(tmp_path):
    layer = km.Mogrifier(4, rank=2, use_bias=False, kernel_initializer="zeros")
    revived = testing.assert_config_round_trip(layer)
    assert revived.rounds == 4 and revived.rank == 2 and not revived.use_bias
    xi, hi = keras.Input((M,)), keras.Input((N,))
    model = keras.Model([xi, hi], km.Mogrifier(3, rank=2)([xi, hi]))
    x, h = _inputs()
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    for a, b in zip(model([x, h]), loaded([x, h])):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy):
    x, h = _inputs()
    layer = km.Mogrifier(3, rank=2, dtype=policy)
    x_out, h_out = layer([x, h])
    assert keras.backend.standardize_dtype(x_out.dtype) == policy.split("_")[1]
    assert layer.weights[0].dtype == "float32"
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(h_out)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rounds": 0}, "rounds"),
        ({"rounds": -1}, "rounds"),
        ({"rounds": 2.5}, "rounds"),
        ({"rounds": 2, "rank": 0}, "rank"),
        ({"rounds": 2, "rank": -3}, "rank"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=f"Expected `{match}`.*Received: {match}="):
        km.Mogrifier(**kwargs)


def test_rank_larger_than_matrix():
    x, h = _inputs()
    with pytest.raises(ValueError, match=r"rank.*min\(6, 10\) = 6.*Received: rank=7"):
        km.Mogrifier(2, rank=7)([x, h])


def test_bad_inputs():
    x, h = _inputs()
    with pytest.raises(ValueError, match="list of two tensors"):
        km.Mogrifier(2)(x)
    with pytest.raises(ValueError, match="rank-2"):
        km.Mogrifier(2)([x[None], h])
    with pytest.raises(ValueError, match="same batch size"):
        km.Mogrifier(2)([x[:2], h])
    layer = km.Mogrifier(2)
    layer([x, h])
    with pytest.raises(ValueError, match=r"expected shape=\(None, 6\), found shape=\(4, 3\)"):
        layer([x[:, :3], h])


@pytest.mark.parametrize("rounds, rank", [(1, None), (4, None), (5, 3)])
def test_folded_doubling_gives_the_same_numbers(rounds, rank):
    """`fold_doubling`: the doublings moved into the matrices, exactly.

    The outputs of `mogrify(folded, ..., doubled=False)` times the returned
    powers of two are bitwise those of `mogrify` (scaling by 2 is exact),
    and the NumPy reference agrees; leaving the doublings out without the
    folded matrices does not.
    """
    layer = km.Mogrifier(rounds, rank=rank)
    x, h = _inputs()
    layer([x, h])
    _randomize(layer)
    weights = layer.round_weights()
    x, h = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(h)
    x_ref, h_ref = km.Mogrifier.mogrify(weights, x, h)
    folded, x_scale, h_scale = km.Mogrifier.fold_doubling(weights)
    assert (x_scale, h_scale) == (2.0 ** ((rounds + 1) // 2), 2.0 ** (rounds // 2))
    x_out, h_out = km.Mogrifier.mogrify(folded, x, h, doubled=False)
    np.testing.assert_array_equal(to_numpy(x_out) * x_scale, to_numpy(x_ref))
    np.testing.assert_array_equal(to_numpy(h_out) * h_scale, to_numpy(h_ref))
    x_np, h_np = reference.mogrify(
        to_numpy(x), to_numpy(h), _reference_rounds(layer.get_weights(), rounds, rank, True)
    )
    np.testing.assert_allclose(to_numpy(x_out) * x_scale, x_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(h_out) * h_scale, h_np, rtol=1e-5, atol=1e-5)
    if rounds > 1:
        x_unfolded, _ = km.Mogrifier.mogrify(weights, x, h, doubled=False)
        assert not np.allclose(to_numpy(x_unfolded) * x_scale, to_numpy(x_ref))
