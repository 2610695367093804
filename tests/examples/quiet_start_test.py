"""The examples start quietly: no TensorFlow load-time lines on a CPU machine."""

import os
import subprocess
import sys

import keras

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def test_examples_start_and_seed_without_tensorflow_noise():
    # `keras.utils.set_random_seed` imports TensorFlow on every backend (to
    # seed it); unsilenced, that import writes absl's start-up warning and
    # "Could not find cuda drivers" to stderr on a CPU-only machine.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import _quiet\n"
        "import keras\n"
        "keras.utils.set_random_seed(0)\n"
        "print(keras.backend.backend())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["KERAS_BACKEND"] = keras.backend.backend()
    done = subprocess.run(
        [sys.executable, "-c", code, os.path.abspath(EXAMPLES)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == keras.backend.backend()
    assert done.stderr == ""
