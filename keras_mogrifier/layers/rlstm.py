from keras_mogrifier._export import register
from keras_mogrifier.layers.mogrified_rnn import MogrifiedRNN
from keras_mogrifier.layers.rlstm_cell import RLSTMCell


@register
class RLSTM(MogrifiedRNN):
    """Rewired LSTM layer: `keras.layers.RNN(RLSTMCell(...))`.

    Takes every argument of `RLSTMCell` and of `keras.layers.RNN`
    (`return_sequences`, `return_state`, `go_backwards`, `stateful`,
    `unroll`, `zero_output_for_mask`), as `keras.layers.LSTM` does. Masking,
    stateful use and `keras.layers.Bidirectional` work as for
    `keras.layers.LSTM`. The cell is at `layer.cell`.

    Args:
        units: int. Dimensionality of the state.
        **kwargs: arguments of `RLSTMCell` (`mogrifier_rounds=0`,
            `mogrifier_rank`, `dropout`, `recurrent_dropout`, initializers,
            ...) and of `keras.layers.RNN`.

    Call arguments:
        sequences: a tensor of shape `(batch, time, features)`.
        initial_state: optional list `[h, c]`.
        mask: optional boolean tensor of shape `(batch, time)`.
        training: bool. Whether dropout is applied.

    Example:

    >>> import numpy as np
    >>> layer = RLSTM(16, return_sequences=True)
    >>> tuple(layer(np.zeros((2, 7, 8))).shape)
    (2, 7, 16)

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2211.01848), Circling Back to
          Recurrent Models of Language, §2.
    """

    cell_class = RLSTMCell
    cell_name = "rlstm_cell"
