"""keras_mogrifier: strong recurrent language models for Keras 3."""

from keras_mogrifier.initializers import ChronoInitializer
from keras_mogrifier.layers import DualOutput
from keras_mogrifier.layers import Mogrifier
from keras_mogrifier.layers import MogrifierLSTM
from keras_mogrifier.layers import MogrifierLSTMCell
from keras_mogrifier.layers import RLSTM
from keras_mogrifier.layers import RLSTMCell

__version__ = "0.1.0"
