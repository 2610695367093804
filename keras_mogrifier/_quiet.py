"""A quiet start for the command line: no TensorFlow start-up lines.

TensorFlow's C++ runtime writes a few lines to stderr while it loads (oneDNN
notes, "could not find cuda drivers", absl's start-up warning) before any of
its log settings apply; they alarm more than they inform on a CPU-only
machine. `quiet_start` sets `TF_CPP_MIN_LOG_LEVEL=3` for what comes later and
imports TensorFlow once with stderr silenced — with the JAX and PyTorch
backends too, where `keras.utils.set_random_seed` imports TensorFlow (to
seed it) when it is installed, as it always is with this package. An import
that fails is not hidden: `import keras` then raises it again.

`python -m keras_mogrifier` imports this package, and so keras and
TensorFlow, before it runs `__main__`; the `keras-mogrifier` script imports
it before `keras_mogrifier.cli`. So the package's `__init__` imports this
module first, and on import it starts quietly when the process is the
command line; a program that imports the package is left as it is. This
module imports nothing of keras. (The examples, run from a checkout, do the
same with `examples/_quiet.py`.)
"""

import importlib
import importlib.util
import os
import sys

COMMAND = "keras-mogrifier"


def is_command_line():
    """Whether this process is `python -m keras_mogrifier` or `keras-mogrifier`."""
    program = sys.argv[0] if sys.argv else ""
    if os.path.basename(program) == COMMAND:
        return True
    # While `python -m NAME` imports NAME's package, sys.argv[0] is "-m"; the
    # interpreter's own arguments say which NAME.
    if program != "-m":
        return False
    original = getattr(sys, "orig_argv", [])
    modules = {"keras_mogrifier", "keras_mogrifier.__main__"}
    return any(a == "-m" and b in modules for a, b in zip(original, original[1:]))


def quiet_start():
    # The backend is left to keras (KERAS_BACKEND, or ~/.keras/keras.json).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if importlib.util.find_spec("tensorflow"):
        _import_with_stderr_silenced("tensorflow")


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
                pass  # reported by `import keras` later, with stderr back
    finally:
        os.dup2(saved, fd)
        os.close(saved)


if is_command_line():
    quiet_start()
