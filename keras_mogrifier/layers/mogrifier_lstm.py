from keras_mogrifier._export import register
from keras_mogrifier.layers.mogrified_rnn import MogrifiedRNN
from keras_mogrifier.layers.mogrifier_lstm_cell import MogrifierLSTMCell


@register
class MogrifierLSTM(MogrifiedRNN):
    """Mogrifier LSTM layer: `keras.layers.RNN(MogrifierLSTMCell(...))`.

    Takes every argument of `MogrifierLSTMCell` and of `keras.layers.RNN`
    (`return_sequences`, `return_state`, `go_backwards`, `stateful`,
    `unroll`, `zero_output_for_mask`), as `keras.layers.LSTM` does. Masking,
    stateful use and `keras.layers.Bidirectional` work as for
    `keras.layers.LSTM`. The cell is at `layer.cell`.

    Args:
        units: int. Dimensionality of the state.
        **kwargs: arguments of `MogrifierLSTMCell` (`mogrifier_rounds=5`,
            `mogrifier_rank`, `capped_input_gate`, `dropout`,
            `recurrent_dropout`, initializers, ...) and of
            `keras.layers.RNN`.

    Call arguments:
        sequences: a tensor of shape `(batch, time, features)`.
        initial_state: optional list `[h, c]`.
        mask: optional boolean tensor of shape `(batch, time)`.
        training: bool. Whether dropout is applied.

    Example:

    >>> import numpy as np
    >>> layer = MogrifierLSTM(16, mogrifier_rounds=5, mogrifier_rank=4,
    ...                       return_sequences=True)
    >>> tuple(layer(np.zeros((2, 7, 8))).shape)
    (2, 7, 16)

    Reference:
        - [Melis et al., 2020](https://arxiv.org/abs/1909.01792), Mogrifier
          LSTM, ICLR 2020.
    """

    cell_class = MogrifierLSTMCell
    cell_name = "mogrifier_lstm_cell"
