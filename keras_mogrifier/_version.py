"""The package's version, in one place.

pyproject.toml reads it for the wheel's metadata (`[tool.setuptools.dynamic]`)
and `keras_mogrifier.__version__` re-exports it. Nothing to import here: the
build reads this file without importing keras.
"""

__version__ = "0.1.0"
