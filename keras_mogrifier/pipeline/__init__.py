"""End-to-end language modelling: presets, training and evaluation."""

from keras_mogrifier.pipeline.language_modeling import build_language_model
from keras_mogrifier.pipeline.language_modeling import build_optimizer
from keras_mogrifier.pipeline.language_modeling import compile_language_model
from keras_mogrifier.pipeline.language_modeling import dynamic_evaluation
from keras_mogrifier.pipeline.language_modeling import evaluate_language_model
from keras_mogrifier.pipeline.language_modeling import load_checkpoint
from keras_mogrifier.pipeline.language_modeling import run_experiment
from keras_mogrifier.pipeline.language_modeling import write_results
from keras_mogrifier.pipeline.presets import PRESETS
from keras_mogrifier.pipeline.presets import get_preset
