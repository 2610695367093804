"""The backend seam is imported once: later calls, which may run inside a
function being traced, make no import (AutoGraph would try to convert
`importlib`'s `_gcd_import` and warn in every TensorFlow `generate`)."""

import importlib

import numpy as np
import pytest

from keras_mogrifier import backend
from keras_mogrifier.data import Vocabulary
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.models import LanguageModel


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
