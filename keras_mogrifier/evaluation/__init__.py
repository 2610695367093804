"""Evaluation of language models: dynamic evaluation and its tuning, the neural
cache, MC dropout."""

from keras_mogrifier.evaluation.divergence_error import DivergenceError
from keras_mogrifier.evaluation.dynamic_evaluator import DynamicEvaluator
from keras_mogrifier.evaluation.dynamic_evaluation_search import search_dynamic_evaluation
from keras_mogrifier.evaluation.mc_dropout import mc_dropout_evaluate
from keras_mogrifier.evaluation.mc_dropout import search_mc_dropout_temperature
from keras_mogrifier.evaluation.neural_cache import NeuralCache
from keras_mogrifier.evaluation.temperature import evaluate_stream
