import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends with the default float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


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
