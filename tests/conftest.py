import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

from keras_mogrifier import backend  # noqa: E402


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends with the default float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


# === Compiled, or op by op ===
#
# Most of a test's time on TensorFlow was tracing and compiling the tiny
# model's functions (`tf.function`), which it then ran a few times. Unless
# TEST_COMPILE=all, they run op by op there (`backend.run_functions_eagerly`:
# the same values, no tracing), except in tests marked
# `@pytest.mark.compiled` — those that exercise what only a compiled
# function does (tracing, XLA, what can be read inside a trace) — which run
# compiled. JAX and PyTorch run as always: PyTorch is eager, JAX has no
# faster op-by-op mode. A fixture of wider scope runs in the mode of the
# first test that sets it up.
# Also compiled: every test given `jit_compile=True` (XLA is what it tests),
# and the folders below, whose tests train for hundreds of steps — compiled
# once, those run faster than op by op (measured on TensorFlow: examples
# 148 s compiled, 469 s op by op; pipeline 155 s, 219 s).
COMPILED_FOLDERS = ("tests/examples", "tests/pipeline")


def _runs_compiled(item):
    if item.get_closest_marker("compiled") is not None:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("jit_compile") is True:
        return True
    path = item.path.relative_to(item.config.rootpath).as_posix()
    return path.startswith(tuple(folder + "/" for folder in COMPILED_FOLDERS))


def _eager_by_default():
    mode = os.environ.get("TEST_COMPILE", "marked")
    if mode not in ("marked", "all"):
        raise ValueError(f"Expected TEST_COMPILE to be 'marked' or 'all'. Received: {mode!r}")
    return mode == "marked"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before the item's fixtures are set up, so that a module's fixture
    # (a model trained once for its tests) runs in its first test's mode.
    backend.run_functions_eagerly(_eager_by_default() and not _runs_compiled(item))


# === Tests that run once per suite ===
#
# `@pytest.mark.once_per_suite` marks a test whose outcome cannot depend on
# the backend of the pytest process: it uses NumPy and Python only, or it
# starts a process per backend itself. `scripts/test.sh` names one backend
# of its run in TEST_ONCE_BACKEND; the processes of the other backends
# deselect these tests. Without TEST_ONCE_BACKEND (pytest run by hand) they
# run.


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "compiled: runs the backend's compiled functions even where the suite "
        "runs the others op by op (TEST_COMPILE, tests/conftest.py)",
    )
    config.addinivalue_line(
        "markers",
        "once_per_suite: the outcome does not depend on the process's backend; "
        "scripts/test.sh runs it on one backend only (TEST_ONCE_BACKEND)",
    )


def pytest_collection_modifyitems(config, items):
    once = os.environ.get("TEST_ONCE_BACKEND")
    if not once or once == keras.backend.backend():
        return
    kept = [item for item in items if item.get_closest_marker("once_per_suite") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
