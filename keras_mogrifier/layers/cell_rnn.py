"""`keras.layers.RNN` for the package's cells, with the time loop kept lean."""

import keras
from keras import ops

from keras_mogrifier import backend
from keras_mogrifier._export import register
from keras_mogrifier.layers.mogrified_cell import MogrifiedCell


@register
class CellRNN(keras.layers.RNN):
    """`keras.layers.RNN` that runs the package's cells with less per step.

    Computes what `keras.layers.RNN(cell)` computes, with the same weights,
    arguments and dropout masks, but does outside the time loop whatever
    does not depend on the recurrent state:

    - the cell's weights are read (and cast, under mixed precision) once per
      sequence, not at every step, and prepared there
      (`MogrifiedCell.step_weights(per_sequence=True)`): the mogrifier's
      doublings folded into the matrices that read their outputs, the
      mogrified RLSTM's input kernel padded to the width of its recurrent
      products;
    - when the input is not mogrified (`mogrifier_rounds=0`: the LSTM and
      the RLSTM), the input projection `(x ⊙ M_in) @ W + b` is computed for
      all time steps at once, as one large matrix product before the loop
      (the input dropout mask `M_in` is drawn once per sequence, so it is
      applied first); the loop then only computes the recurrent products
      and the gates.

    The step inside the loop is the cell's own `recurrent_step`, the one
    `keras.layers.RNN(cell)` runs through `cell.call`: the gate arithmetic
    exists once. Masking, `go_backwards`, `stateful`, `unroll`,
    `return_state` and mixed precision behave as in `keras.layers.RNN`
    (Keras's own time loop runs the steps). A cell that is not one of the
    package's runs exactly as in `keras.layers.RNN`.

    `MogrifierLSTM`, `RLSTM` and `LanguageModel` use it; it takes the
    arguments of `keras.layers.RNN`.

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier import RLSTMCell
    >>> layer = CellRNN(RLSTMCell(16), return_sequences=True)
    >>> tuple(layer(np.zeros((2, 7, 8))).shape)
    (2, 7, 16)
    """

    def inner_loop(self, sequences, initial_state, mask, training=False):
        cell = self.cell
        if not isinstance(cell, MogrifiedCell):
            return super().inner_loop(
                sequences, initial_state, mask, training=training
            )
        if keras.tree.is_nested(mask):
            mask = mask[0]
        weights = cell.step_weights(per_sequence=_prepares_per_sequence(sequences.shape[1]))
        # Time-major from here on: the loop reads one time step at a time,
        # and transposing x is cheaper than transposing its projection.
        x = ops.swapaxes(sequences, 0, 1)
        input_mask = cell.input_mask(sequences[:, 0, :], training)
        if input_mask is not None:
            x = x * input_mask  # (time, batch, m) ⊙ (batch, m)
        hoisted = cell.hoists_input_projection
        if hoisted:
            shape = ops.shape(x)
            z_x = cell.project_input(weights, ops.reshape(x, (-1, shape[-1])))
            x = ops.reshape(z_x, (shape[0], shape[1], z_x.shape[-1]))
        # Where the time length is not static (a TensorFlow trace whose
        # shapes were relaxed), the loop gets batch-major inputs: Keras's
        # TensorFlow loop reads a missing `input_length` from
        # `inputs.shape[1]`, which in the time-major layout is the batch
        # size — it would stop after that many steps.
        time_steps = sequences.shape[1]
        time_major = time_steps is not None
        if not time_major:
            x = ops.swapaxes(x, 0, 1)
        elif mask is not None:
            mask = ops.swapaxes(mask, 0, 1)
        if self.stateful:
            # The state variables are assigned after the loop: the loop must
            # not hold them (PyTorch would see an in-place write into a
            # tensor that autograd saved).
            initial_state = [ops.copy(s) for s in initial_state]

        # The backend's own step where it has one (PyTorch: the same
        # arithmetic without Keras's per-operation overhead), else the cell's.
        step = backend.recurrent_step(cell, weights, training, hoisted)
        if step is None:

            def step(x_t, states):
                return cell.recurrent_step(
                    weights, x_t, states, training, projected=hoisted
                )

        last_output, outputs, states = backend.rnn(
            step,
            x,
            initial_state,
            go_backwards=self.go_backwards,
            mask=mask,
            unroll=self.unroll,
            input_length=time_steps,
            time_major=time_major,
            zero_output_for_mask=self.zero_output_for_mask,
            return_all_outputs=self.return_sequences,
        )
        if time_major:
            outputs = ops.swapaxes(outputs, 0, 1)
        return last_output, outputs, states


def _prepares_per_sequence(time_steps):
    """Whether the weights are prepared once per sequence (see `CellRNN`).

    Not for a sequence of one step (a generated token, one call per token):
    there the preparation costs more than the step it would save (on
    PyTorch, eager, it doubled a Mogrifier RLSTM's time per token), and the
    cell's per-step weights, those of `cell.call`, give the same numbers.
    """
    return time_steps != 1
