"""keras_mogrifier: strong recurrent language models for Keras 3.

KerasTuner searches live in `keras_mogrifier.tuning` (needs the `tuning`
extra), imported on demand so that the core does not need keras-tuner.
The command line is `keras_mogrifier.cli` (`keras-mogrifier train ...`,
`python -m keras_mogrifier train ...`).
"""

# First, before keras: the command line starts without TensorFlow's start-up
# lines (keras_mogrifier/_quiet.py; nothing changes for a program that
# imports the package).
from keras_mogrifier import _quiet  # noqa: F401
from keras_mogrifier._version import __version__
from keras_mogrifier import data
from keras_mogrifier import generation
from keras_mogrifier import pipeline
from keras_mogrifier import samplers
from keras_mogrifier.callbacks import DivergenceRecovery
from keras_mogrifier.callbacks import TwoTailedAveraging
from keras_mogrifier.evaluation import DivergenceError
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.evaluation import evaluate_stream
from keras_mogrifier.evaluation import mc_dropout_evaluate
from keras_mogrifier.evaluation import NeuralCache
from keras_mogrifier.evaluation import search_dynamic_evaluation
from keras_mogrifier.evaluation import search_mc_dropout_temperature
from keras_mogrifier.evaluation.temperature import search_temperature
from keras_mogrifier.initializers import ChronoInitializer
from keras_mogrifier.layers import CellRNN
from keras_mogrifier.layers import DualOutput
from keras_mogrifier.layers import LanguageModelHead
from keras_mogrifier.layers import MixtureOfSoftmaxes
from keras_mogrifier.layers import Mogrifier
from keras_mogrifier.layers import MogrifierLSTM
from keras_mogrifier.layers import MogrifierLSTMCell
from keras_mogrifier.layers import RLSTM
from keras_mogrifier.layers import RLSTMCell
from keras_mogrifier.losses import IWAEDropoutLoss
from keras_mogrifier.metrics import BitsPerCharacter
from keras_mogrifier.metrics import Perplexity
from keras_mogrifier.models import LanguageModel
from keras_mogrifier.models import NonFiniteLossError
from keras_mogrifier.models import RecurrentBackbone
from keras_mogrifier.optimizers import RectifiedAdam
from keras_mogrifier.optimizers import TwoTailedAveragingOptimizer

from keras_mogrifier import backend as _backend  # noqa: E402

# PyTorch: one intra-op thread unless told otherwise (see
# `keras_mogrifier.backend.apply_thread_policy`, docs/scaling.md).
_backend.apply_thread_policy()
