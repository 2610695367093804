"""The backend seam is imported once: later calls, which may run inside a
function being traced, make no import (AutoGraph would try to convert
`importlib`'s `_gcd_import` and warn in every TensorFlow `generate`)."""

import importlib
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_mogrifier import backend
from keras_mogrifier.data import Vocabulary
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.models import LanguageModel
import testing


def test_get_backend_module_imports_once(monkeypatch):
    first = backend.get_backend_module()

    real_import = importlib.import_module

    def no_import(name, *args, **kwargs):
        # Only our own modules: JAX loads some of its submodules lazily
        # through `importlib.import_module` on first use.
        if name.startswith("keras_mogrifier"):
            raise AssertionError(f"imported again: {name}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_import)
    assert backend.get_backend_module() is first
    # And so does a model call traced for generation.
    vocab = Vocabulary(["<eos>", "a", "b"])
    model = LanguageModel(3, units=4, num_layers=1, batch_size=1, vocabulary=vocab)
    model.build((1, None))
    assert model.generate("a b", max_length=5, seed=0, stop_token_ids=None).startswith("a b")


def test_progress_bars_only_on_a_terminal(capsys):
    model = LanguageModel(5, units=4, num_layers=1, batch_size=1)
    model.build((1, None))
    evaluator = DynamicEvaluator(model, update_rule="sgd", learning_rate=0.0)
    evaluator.evaluate(np.arange(40) % 5)  # verbose="auto"; stdout is not a terminal here
    out = capsys.readouterr().out
    assert out == ""
    # Asked for, a bar is drawn even into a pipe.
    evaluator.evaluate(np.arange(40) % 5, verbose=1)
    assert "step" in capsys.readouterr().out


def test_what_auto_jit_compile_means_on_each_backend():
    """`jit_compile="auto"`: XLA for calls of many steps wherever XLA can run
    them (TensorFlow on CPU too: the evaluator's loops), not for
    generation's one-token calls on a CPU (XLA's fixed cost per call is
    larger than what it saves there); JAX always compiles, PyTorch never."""
    import keras

    model = LanguageModel(5, units=4, num_layers=1, batch_size=1)
    model.build((1, None))
    seam = backend.get_backend_module()
    name = keras.backend.backend()
    many = {"tensorflow": True, "jax": True, "torch": False}[name]
    one = {"tensorflow": False, "jax": True, "torch": False}[name]
    assert seam.default_jit_compile(model) is many
    assert seam.default_jit_compile(model, many_steps=False) is one
    evaluator = DynamicEvaluator(model)
    evaluator.evaluate(np.arange(8) % 5, adapt=False, verbose=0)
    assert next(iter(evaluator._steps._built))[2] is many
    model.layers[-1].supports_jit = False  # e.g. Keras's cuDNN LSTM on TensorFlow
    assert seam.default_jit_compile(model) is (name == "jax")


# The suite's own modes (tests/conftest.py): on TensorFlow, tf.functions run
# op by op unless a test runs compiled; JAX compiles quickly. Each assertion
# fails if the conftest hook that sets the mode is deleted.
_QUICK = os.environ.get("TEST_COMPILE", "marked") == "marked"


def _functions_run_eagerly():
    import tensorflow as tf

    return tf.config.functions_run_eagerly()


@testing.backend_specific("tensorflow", reason="the op-by-op mode is TensorFlow's")
def test_the_suite_runs_tensorflow_op_by_op_unless_a_test_runs_compiled():
    assert _functions_run_eagerly() == _QUICK


@testing.backend_specific(
    "tensorflow", "jax", reason="the quick modes are TensorFlow's and JAX's"
)
@pytest.mark.compiled
def test_a_test_marked_compiled_runs_compiled_and_optimised():
    import keras

    if keras.backend.backend() == "tensorflow":
        assert not _functions_run_eagerly()
    else:
        import jax

        assert not jax.config.read("jax_disable_most_optimizations")


@testing.backend_specific("tensorflow", reason="the op-by-op mode is TensorFlow's")
@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_xla_half_of_a_jit_compile_parametrisation_runs_compiled(jit_compile):
    assert _functions_run_eagerly() == (_QUICK and not jit_compile)


def test_the_switches_say_whether_the_backend_has_them():
    import keras

    name = keras.backend.backend()
    assert backend.run_functions_eagerly(_QUICK) == (name == "tensorflow")
    assert backend.optimize_compiled_code(not _QUICK) == (name == "jax")
    if name == "jax":
        import jax

        assert jax.config.read("jax_disable_most_optimizations") == _QUICK


# === The thread policy (apply_thread_policy) ===


@pytest.fixture
def restored_torch_threads():
    """PyTorch's intra-op threads as they were before the test."""
    if keras.backend.backend() != "torch":
        yield None
        return
    import torch

    before = torch.get_num_threads()
    yield torch
    torch.set_num_threads(before)


def test_the_library_runs_pytorch_on_one_thread_unless_told_otherwise(
        monkeypatch, restored_torch_threads):
    torch = restored_torch_threads
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("KERAS_MOGRIFIER_TORCH_THREADS", raising=False)
    if torch is None:  # TensorFlow and JAX: their own pools, untouched
        before = backend.thread_settings()
        assert backend.apply_thread_policy() == before
        assert before["backend"] == keras.backend.backend() and before["description"]
        if keras.backend.backend() == "jax" and hasattr(os, "sched_getaffinity"):
            # XLA's pool follows the cores, which the settings say.
            cores = len(os.sched_getaffinity(0))
            assert before["usable_cores"] == cores
            assert f"{cores} usable core" in before["description"]
        return
    torch.set_num_threads(2)
    assert backend.apply_thread_policy()["intra_op_threads"] == 1
    assert torch.get_num_threads() == 1
    # The user's settings win: PyTorch's own default, a number, OMP_NUM_THREADS.
    torch.set_num_threads(2)
    monkeypatch.setenv("KERAS_MOGRIFIER_TORCH_THREADS", "torch")
    backend.apply_thread_policy()
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("KERAS_MOGRIFIER_TORCH_THREADS", " 3 ")
    settings = backend.apply_thread_policy()
    assert torch.get_num_threads() == 3 and "3 intra-op" in settings["description"]
    torch.set_num_threads(2)
    monkeypatch.setenv("KERAS_MOGRIFIER_TORCH_THREADS", "auto")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    backend.apply_thread_policy()
    assert torch.get_num_threads() == 2


def test_a_bad_thread_setting_is_a_clear_error_that_changes_nothing(
        monkeypatch, restored_torch_threads):
    torch = restored_torch_threads
    if torch is None:
        pytest.skip("the variable is PyTorch's")
    for value in ["0", "-1", "two", "1.5", ""]:
        torch.set_num_threads(2)
        monkeypatch.setenv("KERAS_MOGRIFIER_TORCH_THREADS", value)
        with pytest.raises(ValueError, match="'auto', 'torch' or a positive integer.*Received"):
            backend.apply_thread_policy()
        assert torch.get_num_threads() == 2


def test_importing_the_package_applies_the_policy():
    # A fresh process, as a user's program starts: PyTorch's default is
    # the number of cores; the package leaves one thread (or, on the other
    # backends, their own defaults).
    code = ("import keras_mogrifier, keras; from keras_mogrifier import backend; "
            "print(backend.thread_settings()['description'])")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "KERAS_MOGRIFIER_TORCH_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    if keras.backend.backend() == "torch":
        assert done.stdout.strip().startswith("1 intra-op thread(s)")
    else:
        assert done.stdout.strip()


def test_host_padding_keeps_one_capacity_and_cuts_what_it_padded():
    from keras_mogrifier.backend._shared import HostPadding

    padding = HostPadding()
    ids = np.arange(12, dtype="int32").reshape(6, 2)
    length, (padded,) = padding.pad([ids])
    assert length == 6 and padded.shape == (8, 2) and padding.capacity == 8
    np.testing.assert_array_equal(padded[:6], ids)
    np.testing.assert_array_equal(padded[6:], 0)
    # A shorter call keeps the capacity (one program); a longer one grows it.
    length, (padded,) = padding.pad([ids[:3]])
    assert length == 3 and padded.shape == (8, 2)
    outputs = {"a": np.ones((8, 4)), "b": [np.zeros((8,))]}
    cut = padding.cut(outputs, 3)
    assert cut["a"].shape == (3, 4) and cut["b"][0].shape == (3,)
    length, (padded,) = padding.pad([np.zeros((9, 2), "int32")])
    assert length == 9 and padded.shape == (16, 2) and padding.capacity == 16
    assert padding.cut(outputs, 16) is outputs


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
def test_tied_logits_are_features_times_the_table_transposed(rows):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(1, rows, 8)).astype("float32")
    table = rng.normal(size=(30, 8)).astype("float32")
    logits = keras.ops.convert_to_numpy(backend.tied_logits(features, table))
    assert logits.shape == (1, rows, 30)
    np.testing.assert_allclose(logits, features @ table.T, rtol=1e-5, atol=1e-5)
    if keras.backend.backend() == "torch":  # the order taken under a gradient
        import torch

        weights = torch.nn.Parameter(torch.from_numpy(table))
        with torch.enable_grad():
            logits = backend.tied_logits(torch.from_numpy(features), weights)
        np.testing.assert_allclose(
            logits.detach().numpy(), features @ table.T, rtol=1e-5, atol=1e-5)


def test_pytorch_adds_a_tied_tables_two_gradients_in_place():
    """The output product's gradient of a tied table is a tensor of its own
    (not a transposed view), so autograd adds the lookup's into it rather
    than writing a third table-sized tensor (docs/results/evaluation-speed.md)."""
    if keras.backend.backend() != "torch":
        pytest.skip("PyTorch's autograd")
    import torch
    from torch.profiler import profile

    table = torch.nn.Parameter(torch.randn(50, 8))
    ids = torch.tensor([[3, 7, 7, 1, 49]])

    def gradient():
        features = torch.tanh(torch.nn.functional.embedding(ids, table))
        logits = backend.tied_logits(features, table)
        return torch.autograd.grad(torch.logsumexp(logits, -1).sum(), [table])[0]

    with profile(record_shapes=True) as run:
        got = gradient()
    sums = [(e.key, e.input_shapes) for e in run.key_averages(group_by_input_shape=True)
            if e.key in ("aten::add", "aten::add_") and e.input_shapes[:2] == [[50, 8], [50, 8]]]
    assert sums == [("aten::add_", [[50, 8], [50, 8], []])]
    with torch.no_grad():
        reference = table.detach().clone().requires_grad_(True)
    features = torch.tanh(reference[ids])
    expected = torch.autograd.grad(
        torch.logsumexp(features @ reference.t(), -1).sum(), [reference])[0]
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("bias, temperature", [(True, 0.7), (False, 0.7), (True, None)])
def test_output_logits_add_the_bias_then_scale_by_the_temperature(bias, temperature):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 30)).astype("float32")
    b = rng.normal(size=(30,)).astype("float32") if bias else None
    expected = (logits + (b if bias else 0.0)) * (1.0 if temperature is None else np.float32(temperature))
    t = None if temperature is None else keras.Variable(temperature, trainable=False)
    got = backend.output_logits(keras.ops.convert_to_tensor(logits.copy()), b, t)
    # Bit for bit: the same two operations in the same order as NumPy's.
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), expected)


def test_output_logits_in_place_only_while_no_gradient_is_taken():
    """PyTorch writes a scored window's bias and temperature into the logits
    (no fresh logits-sized tensors); under a gradient it leaves them."""
    if keras.backend.backend() != "torch":
        pytest.skip("PyTorch's eager in-place form")
    import torch

    logits = torch.randn(4, 30)
    bias, temperature = torch.randn(30), torch.tensor(0.5)
    expected = (logits + bias) * temperature
    with torch.no_grad():
        scored = logits.clone()
        got = backend.output_logits(scored, bias, temperature)
    assert got.data_ptr() == scored.data_ptr()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    weights = torch.nn.Parameter(logits.clone())
    with torch.enable_grad():
        trained = weights * 1.0
        got = backend.output_logits(trained, bias, temperature)
        assert got.data_ptr() != trained.data_ptr()
        (gradient,) = torch.autograd.grad(got.sum(), [weights])
    torch.testing.assert_close(gradient, torch.full_like(logits, 0.5))


def test_only_pytorch_runs_new_shapes_without_compiling():
    assert backend.compiles_per_shape() is (keras.backend.backend() != "torch")


def test_crossentropy_over_the_logits_is_the_same_and_only_when_given_up():
    """`overwrite_logits=True`: PyTorch writes the log-softmax over logits the
    caller gave up (scoring), with the same losses bit for bit; without it,
    or under a gradient, the logits are left as they were."""
    rng = np.random.default_rng(2)
    logits = (3.0 * rng.normal(size=(2, 4, 50))).astype("float32")
    ids = rng.integers(0, 50, (2, 4)).astype("int32")
    expected = keras.ops.convert_to_numpy(backend.sparse_crossentropy(ids, logits))
    shifted = logits - logits.max(-1, keepdims=True)
    reference = -np.take_along_axis(
        shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)), ids[..., None], -1)[..., 0]
    np.testing.assert_allclose(expected, reference, rtol=1e-5, atol=1e-5)
    given = keras.ops.convert_to_tensor(logits.copy())
    got = backend.sparse_crossentropy(ids, given, overwrite_logits=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), expected)
    if keras.backend.backend() != "torch":
        return
    import torch

    kept = torch.from_numpy(logits.copy())
    with torch.no_grad():
        backend.sparse_crossentropy(ids, kept)
        assert torch.equal(kept, torch.from_numpy(logits))  # not given up: kept
        backend.sparse_crossentropy(ids, kept, overwrite_logits=True)
    np.testing.assert_allclose(  # given up: it holds the log-softmax now
        kept.numpy(), shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)),
        rtol=1e-5, atol=1e-5)
    trained = torch.from_numpy(logits.copy()).requires_grad_(True)
    with torch.enable_grad():
        backend.sparse_crossentropy(ids, trained, overwrite_logits=True)
    assert torch.equal(trained.detach(), torch.from_numpy(logits))


def test_scoring_overwrites_only_the_packages_own_models_logits():
    """A model whose call returns a weight it keeps (here the weight itself)
    is scored without that weight being written over."""
    from keras_mogrifier.evaluation import _adaptation_step

    class Unigram(keras.Model):
        def __init__(self):
            super().__init__()
            self.vocabulary_size = 7
            self.table = self.add_weight(shape=(1, 1, 7), initializer="random_normal")

        def call(self, ids, training=False):
            return self.table  # batch 1, time 1: the weight itself

    model = Unigram()
    model(np.zeros((1, 1), "int32"))
    before = keras.ops.convert_to_numpy(model.table).copy()
    forward = _adaptation_step.CompiledSteps().get(model, "forward", [], False, None)
    ids = np.array([[3]], "int32")
    losses = keras.ops.convert_to_numpy(
        forward(keras.ops.convert_to_tensor(ids), keras.ops.convert_to_tensor(ids)))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.table), before)
    shifted = before[0, 0] - before[0, 0].max()
    np.testing.assert_allclose(
        losses[0, 0], np.log(np.exp(shifted).sum()) - shifted[3], rtol=1e-5)
    assert _adaptation_step._returns_fresh_logits(
        LanguageModel(11, units=4, num_layers=1, batch_size=1))
