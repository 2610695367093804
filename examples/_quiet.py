"""Imported first by the examples: a quiet start on a CPU-only machine.

TensorFlow's C++ runtime writes a few lines to stderr while it loads (oneDNN
notes, "could not find cuda drivers", absl's start-up warning) before any of
its log settings apply; they alarm more than they inform on a CPU-only
machine. This module sets `TF_CPP_MIN_LOG_LEVEL=3` for what comes later and
imports TensorFlow once with stderr silenced — with the JAX and PyTorch
backends too, where `keras.utils.set_random_seed` imports TensorFlow (to
seed it) when it is installed, as it always is with this package.
An import that fails is not hidden: `import keras` then raises it again.
"""

import importlib
import importlib.util
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _import_with_stderr_silenced(name):
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (e.g. a notebook)
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), fd)
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # reported by `import keras` below, with stderr back
    finally:
        os.dup2(saved, fd)
        os.close(saved)


if os.environ["KERAS_BACKEND"] == "tensorflow" or importlib.util.find_spec("tensorflow"):
    _import_with_stderr_silenced("tensorflow")
