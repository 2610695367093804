from keras_mogrifier.layers.cell_rnn import CellRNN
from keras_mogrifier.layers.dual_output import DualOutput
from keras_mogrifier.layers.mogrifier import Mogrifier
from keras_mogrifier.layers.mogrifier import MogrifierFactorInitializer
from keras_mogrifier.layers.mogrifier_lstm import MogrifierLSTM
from keras_mogrifier.layers.mogrifier_lstm_cell import MogrifierLSTMCell
from keras_mogrifier.layers.rlstm import RLSTM
from keras_mogrifier.layers.rlstm_cell import RLSTMCell
