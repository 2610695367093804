"""Evaluation of language models: dynamic evaluation and its tuning."""

from keras_mogrifier.evaluation.dynamic_evaluator import DynamicEvaluator
from keras_mogrifier.evaluation.dynamic_evaluation_search import search_dynamic_evaluation
