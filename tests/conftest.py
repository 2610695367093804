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
# Most of a test's time was compiling the tiny model's functions, which it
# then ran a few times. Unless TEST_COMPILE=all (what users run: everything
# compiled and optimised), the suite saves that time on the two backends
# that compile:
# - TensorFlow runs its `tf.function`s op by op (`backend.run_functions_eagerly`:
#   the same values, no tracing), except in the tests that run compiled
#   (`_runs_compiled`): those marked `@pytest.mark.compiled` — they exercise
#   what only a compiled function does (tracing, XLA, what can be read inside
#   a trace), or they train or score for so many steps that compiling once
#   is faster —, every test given `jit_compile=True`, and the folders below.
# - JAX compiles without most of XLA's optimisation passes
#   (`backend.optimize_compiled_code(False)`): the same computation, compiled
#   faster; JAX has no faster op-by-op mode. The tests that run compiled
#   (below) get XLA's optimisations, as users do: one of them checks that
#   a text scores bitwise the same in groups of different sizes, which
#   holds with them and not without (a last-bit difference).
# PyTorch runs eagerly anyway. A fixture of wider scope runs in the mode of
# the first test that sets it up. Measured: docs/testing.md.
# The folders' tests train for hundreds of steps: compiled once, they run
# faster than op by op (TensorFlow: examples 148 s compiled, 469 s op by op;
# pipeline 155 s, 219 s).
COMPILED_FOLDERS = ("tests/examples", "tests/pipeline")


def _runs_compiled(item):
    if item.get_closest_marker("compiled") is not None:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("jit_compile") is True:
        return True
    path = item.path.relative_to(item.config.rootpath).as_posix()
    return path.startswith(tuple(folder + "/" for folder in COMPILED_FOLDERS))


def _quick_by_default():
    mode = os.environ.get("TEST_COMPILE", "marked")
    if mode not in ("marked", "all"):
        raise ValueError(f"Expected TEST_COMPILE to be 'marked' or 'all'. Received: {mode!r}")
    return mode == "marked"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before the item's fixtures are set up, so that a module's fixture
    # (a model trained once for its tests) runs in its first test's mode.
    quick = _quick_by_default() and not _runs_compiled(item)
    backend.run_functions_eagerly(quick)
    backend.optimize_compiled_code(not quick)


# === Tests that run once per suite ===
#
# `@pytest.mark.once_per_suite` marks a test whose outcome cannot depend on
# the backend of the pytest process: it uses NumPy and Python only, or it
# starts a process per backend itself. `scripts/test.sh` names one backend
# of its run in TEST_ONCE_BACKEND; the processes of the other backends
# deselect these tests. Without TEST_ONCE_BACKEND (pytest run by hand) they
# run.


def pytest_configure(config):
    backend.optimize_compiled_code(not _quick_by_default())
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
