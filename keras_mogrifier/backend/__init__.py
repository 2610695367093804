"""The one seam between the library and a particular Keras backend.

Layers, losses and optimizers use only `keras.ops`; the only code that needs
a per-backend path is the one that takes gradients outside `fit` (dynamic
evaluation). It lives in one module per backend, chosen here from
`keras.backend.backend()`; importing this package does not import any
backend library.
"""

import importlib

import keras

_IMPLEMENTED = ("tensorflow",)


def get_backend_module():
    """Returns the module with the compiled steps for the active backend.

    Raises:
        NotImplementedError: if the active Keras backend has no implementation
            yet (only TensorFlow has one).
    """
    name = keras.backend.backend()
    if name not in _IMPLEMENTED:
        raise NotImplementedError(
            "Dynamic evaluation needs gradients outside `fit`, which "
            f"keras_mogrifier implements for the {list(_IMPLEMENTED)} "
            f"backend(s) only. The active Keras backend is {name!r}; set "
            "KERAS_BACKEND=tensorflow before importing keras."
        )
    return importlib.import_module(f"keras_mogrifier.backend.{name}")
