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
