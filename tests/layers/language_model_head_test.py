import keras
import numpy as np
import pytest

from keras_mogrifier.layers import LanguageModelHead

from testing import assert_config_round_trip
from testing import to_numpy
from testing import value_and_gradients

V, N, E = 11, 6, 4


def _features(seed=0, shape=(2, 5, N)):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_own_softmax_is_a_dense_layer_times_the_temperature():
    head = LanguageModelHead(V, N, tie_embeddings=False, temperature=0.5)
    x = _features()
    logits = to_numpy(head(x))
    kernel, bias = to_numpy(head.output_layer.kernel), to_numpy(head.output_layer.bias)
    np.testing.assert_allclose(logits, 0.5 * (x @ kernel + bias), rtol=1e-5, atol=1e-5)
    # In training the temperature is off.
    np.testing.assert_allclose(
        to_numpy(head(x, training=True)), x @ kernel + bias, rtol=1e-5, atol=1e-5
    )


def test_tied_head_reads_the_table_of_the_embedding_it_is_given():
    embedding = keras.layers.Embedding(V, E)
    embedding.build((None, None))
    head = LanguageModelHead(V, N, embedding_dim=E, embedding=embedding)
    x = _features()
    logits = to_numpy(head(x))
    table = to_numpy(embedding.embeddings)
    projection = to_numpy(head.projection.kernel)  # N ≠ E: down-projected
    expected = (x @ projection) @ table.T + to_numpy(head.output_bias)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    embedding.embeddings.assign(np.zeros((V, E)))
    np.testing.assert_allclose(to_numpy(head(x)), np.broadcast_to(to_numpy(head.output_bias), logits.shape), atol=1e-6)


def test_a_tied_tables_gradient_adds_its_lookup_and_its_logits():
    """The table's gradient through the lookup and the tied logits at once,
    against NumPy: one row per looked-up id plus `dᵀ x` from the logits."""
    embedding = keras.layers.Embedding(V, E)
    embedding.build((None, None))
    head = LanguageModelHead(V, E, embedding=embedding)
    head.build((None, None, E))
    ids = np.array([[1, 3, 3, 7]])
    rng = np.random.default_rng(2)
    weights = rng.normal(size=(1, 4, V)).astype("float32")

    def objective():
        logits = head(embedding(ids))
        return keras.ops.sum(keras.ops.multiply(logits, weights))

    value, (grad,) = value_and_gradients(objective, [embedding.embeddings])
    table, bias = to_numpy(embedding.embeddings), to_numpy(head.output_bias)
    x = table[ids[0]]
    np.testing.assert_allclose(value, np.sum((x @ table.T + bias) * weights[0]), rtol=1e-5)
    expected = weights[0].T @ x  # the logits' part, (V, E)
    np.add.at(expected, ids[0], weights[0] @ table)  # each lookup's row
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-5)


def test_a_tied_head_without_its_embedding_is_refused_when_built():
    head = LanguageModelHead(V, N)
    with pytest.raises(ValueError, match="Expected a tied head to be given the `embedding`"):
        head(_features())


def test_dual_head_reads_the_embeddings_and_needs_them():
    embedding = keras.layers.Embedding(V, N)
    embedding.build((None, None))
    head = LanguageModelHead(V, N, embedding=embedding, dual=True)
    x, e = _features(0), _features(1)
    logits = to_numpy(head(x, embedded=e))
    d = head.dual_layer
    hidden = np.maximum(
        e @ to_numpy(d.embedding_kernel) + x @ to_numpy(d.state_kernel) + to_numpy(d.bias), 0
    )
    expected = hidden @ to_numpy(embedding.embeddings).T + to_numpy(head.output_bias)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Expected the input embeddings"):
        head(x)


@pytest.mark.parametrize("components", [0, 2])
def test_chunked_target_log_probabilities_are_those_of_the_logits(components):
    head = LanguageModelHead(V, N, tie_embeddings=False, mixture_of_softmaxes=components)
    x = _features()
    targets = np.random.default_rng(3).integers(0, V, size=(2, 5)).astype("int32")
    logits = to_numpy(head(x))
    log_probs = logits if components else _log_softmax(logits)
    expected = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    actual = to_numpy(head.target_log_probabilities(x, targets, chunk_size=3))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_config_round_trip_and_argument_checks():
    head = LanguageModelHead(V, N, embedding_dim=E, dual=True, dual_dropout=0.1, mixture_of_softmaxes=2, l2=1e-4, seed=3)
    revived = assert_config_round_trip(head)
    assert revived.embedding is None and revived.mixture_of_softmaxes == 2
    with pytest.raises(ValueError, match="Expected `units` to be a positive integer"):
        LanguageModelHead(V, 0)
    with pytest.raises(ValueError, match="Expected `embedding` to be a `keras.layers.Embedding`"):
        LanguageModelHead(V, N, embedding="table")
