"""Base of the full-sequence layers: a `CellRNN` around one cell.

`CellRNN` is `keras.layers.RNN` with the input projection hoisted out of the
time loop (when the input is not mogrified) and the weights read once per
sequence. Like `keras.layers.LSTM` wraps `LSTMCell`, `MogrifierLSTM` and `RLSTM` take
the cell's arguments and the RNN's arguments side by side and serialise them
flat, so `get_config` reads like the cell's, and `Bidirectional` (which
rebuilds the backward layer from the config) works.
"""

import inspect

import keras

from keras_mogrifier.layers.cell_rnn import CellRNN

_RNN_ARGS = (
    "return_sequences",
    "return_state",
    "go_backwards",
    "stateful",
    "unroll",
    "zero_output_for_mask",
)
# Base-layer arguments that belong to the RNN layer and are also given to the
# cell so that it follows the layer's dtype policy and trainability.
_SHARED_ARGS = ("dtype", "trainable")


class MogrifiedRNN(CellRNN):
    """Base class of `MogrifierLSTM` and `RLSTM`; not used directly."""

    cell_class = None  # set by subclasses

    def __init__(self, units, **kwargs):
        cell_params = inspect.signature(self.cell_class.__init__).parameters
        base_params = inspect.signature(
            self.cell_class.__mro__[1].__init__
        ).parameters
        cell_names = (set(cell_params) | set(base_params)) - {
            "self",
            "kwargs",
            "units",
        }
        cell_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in cell_names}
        for name in _SHARED_ARGS:
            if name in kwargs:
                cell_kwargs[name] = kwargs[name]
        cell = self.cell_class(units, name=self.cell_name, **cell_kwargs)
        super().__init__(cell, **kwargs)
        self.input_spec = keras.InputSpec(ndim=3)

    @property
    def units(self):
        return self.cell.units

    def get_config(self):
        config = super().get_config()
        del config["cell"]
        cell_config = self.cell.get_config()
        for name in ("name", "trainable", "dtype"):
            cell_config.pop(name, None)
        config.update(cell_config)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


