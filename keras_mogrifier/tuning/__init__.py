"""Hyperparameter search with KerasTuner: the papers' search spaces.

Needs `keras-tuner` (`pip install keras-tuner`).
"""

try:
    import keras_tuner  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "keras_mogrifier.tuning needs KerasTuner: pip install keras-tuner"
    ) from error

from keras_mogrifier.tuning.dynamic_evaluation_tuner import DYNAMIC_EVALUATION_OBJECTIVE
from keras_mogrifier.tuning.dynamic_evaluation_tuner import DynamicEvaluationTuner
from keras_mogrifier.tuning.language_model_hyper_model import LANGUAGE_MODEL_OBJECTIVE
from keras_mogrifier.tuning.language_model_hyper_model import LanguageModelHyperModel
from keras_mogrifier.tuning.search_space import DYNAMIC_EVALUATION_SEARCH_SPACE
from keras_mogrifier.tuning.search_space import DYNAMIC_EVALUATION_SEARCH_SPACES
from keras_mogrifier.tuning.search_space import LANGUAGE_MODEL_SEARCH_SPACE
from keras_mogrifier.tuning.search_space import MAX_LEARNING_RATE_OVER_EPSILON
from keras_mogrifier.tuning.search_space import search_space_table
from keras_mogrifier.tuning.search_failed_error import SearchFailedError
from keras_mogrifier.tuning.searches import run_dynamic_evaluation_search
from keras_mogrifier.tuning.searches import run_language_model_search
from keras_mogrifier.tuning.tuners import best_configuration
from keras_mogrifier.tuning.tuners import build_tuner
from keras_mogrifier.tuning.tuners import search_summary
from keras_mogrifier.tuning.tuners import trial_rows
from keras_mogrifier.tuning.tuners import trials_table

__all__ = [
    "DYNAMIC_EVALUATION_OBJECTIVE",
    "DYNAMIC_EVALUATION_SEARCH_SPACE",
    "DYNAMIC_EVALUATION_SEARCH_SPACES",
    "DynamicEvaluationTuner",
    "LANGUAGE_MODEL_OBJECTIVE",
    "LANGUAGE_MODEL_SEARCH_SPACE",
    "LanguageModelHyperModel",
    "MAX_LEARNING_RATE_OVER_EPSILON",
    "SearchFailedError",
    "best_configuration",
    "build_tuner",
    "run_dynamic_evaluation_search",
    "run_language_model_search",
    "search_space_table",
    "search_summary",
    "trial_rows",
    "trials_table",
]
