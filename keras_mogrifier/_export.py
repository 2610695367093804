"""Registration of the package's public objects for Keras serialization."""

import keras

PACKAGE = "keras_mogrifier"


def register(cls):
    """Registers `cls` under `keras_mogrifier>ClassName`.

    With this, `keras.saving.load_model` finds the class after
    `import keras_mogrifier`, without `custom_objects`.
    """
    return keras.saving.register_keras_serializable(package=PACKAGE)(cls)
