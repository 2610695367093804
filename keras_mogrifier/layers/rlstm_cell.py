from keras import ops

from keras_mogrifier._export import register
from keras_mogrifier.layers.mogrified_cell import MogrifiedCell


@register
class RLSTMCell(MogrifiedCell):
    """Cell class of the Rewired LSTM (RLSTM), optionally mogrified.

    On `(x, h_prev) = mogrify(x, h_prev)` (identity when
    `mogrifier_rounds=0`):

    ```
    i = σ(x @ W_i + h_prev @ U_i + b_i)
    j = tanh(x @ W_j + h_prev @ U_j + b_j)
    f = σ((i ⊙ j) @ V_f + h_prev @ U_f + b_f)
    c = f ⊙ c_prev + min(i, 1 − f) ⊙ j
    o = σ((c ⊙ M_state) @ V_o + b_o)
    h = o ⊙ tanh(c)
    ```

    There are no x→f, x→o or h→o weights: the forget gate sees the candidate
    update `i ⊙ j`, and the output gate sees only the new cell `c`. The input
    gate is always capped, so `|c| ≤ 1` at every step whatever the weights.

    Weights: `kernel` (m × 2n: i, j), `recurrent_kernel` (n × 3n: i, j, f),
    `forget_kernel` (n × n: from `i ⊙ j` to f), `output_kernel` (n × n: from
    `c` to o) and `bias` (4n: i, j, f, o). The state is `[h, c]`.

    Dropout is variational: one input mask and one state mask per sequence,
    applied to `x` and `h_prev` before mogrification; the same state mask
    multiplies `c` where `o` is computed.

    Args:
        units: int. Dimensionality of the state `n`.
        mogrifier_rounds: int. Number of mogrifier rounds; 0 (the default) is
            the plain RLSTM, > 0 the Mogrifier RLSTM. Defaults to `0`.
        mogrifier_rank: int or None. Rank of the mogrifier's matrices; `None`
            for full rank. Defaults to `None`.
        mogrifier_use_bias: bool. A bias per mogrifier round. Defaults to
            `True`.
        mogrifier_initializer: initializer of the mogrifier's matrices; `None`
            is the authors' scheme. Defaults to `None`.
        use_bias: bool. Whether the gates have a bias. Defaults to `True`.
        kernel_initializer: initializer of `kernel` and `forget_kernel`.
            Defaults to `"glorot_uniform"`.
        recurrent_initializer: initializer of `recurrent_kernel` and
            `output_kernel`. Defaults to `"orthogonal"`.
        bias_initializer: initializer of `bias`. Defaults to `"zeros"`.
        unit_forget_bias: bool. Initialise the forget bias to 1 (ignored when
            `chrono_t_max` is set). Defaults to `True`.
        chrono_t_max: float or None. If set, Chrono initialisation: the forget
            bias from `ChronoInitializer(chrono_t_max)`, and (with
            `chrono_input_bias`) the input bias its negative. Defaults to
            `None`.
        chrono_input_bias: bool. With `chrono_t_max`, also set the input
            bias `b_i` to `−b_f`, as original Chrono does (Tallec & Ollivier
            2018) and as `MogrifierLSTMCell` does; `False` initialises
            only the forget bias, the reading of Circling Back §3 ("Forget
            gates are initialized with Chrono init"), which does not say
            more. In the RLSTM `i` also feeds the forget gate through
            `i ⊙ j`. Defaults to `True`, the same for every cell.
        kernel_regularizer: regularizer of `kernel`, `forget_kernel` and the
            mogrifier's matrices. Defaults to `None`.
        recurrent_regularizer: regularizer of `recurrent_kernel` and
            `output_kernel`. Defaults to `None`.
        bias_regularizer: regularizer of `bias` and of the mogrifier's
            biases. Defaults to `None`.
        kernel_constraint: constraint of `kernel`, `forget_kernel` and the
            mogrifier's matrices. Defaults to `None`.
        recurrent_constraint: constraint of `recurrent_kernel` and
            `output_kernel`. Defaults to `None`.
        bias_constraint: constraint of `bias`. Defaults to `None`.
        dropout: float in [0, 1). Variational dropout rate of the input.
            Defaults to `0.0`.
        recurrent_dropout: float in [0, 1). Variational dropout rate of the
            state (`h_prev`, and `c` inside the output gate). Defaults to
            `0.0`.
        adaptation_units: int or None. Sparse dynamic evaluation matrix, as in
            `MogrifierLSTMCell`. Defaults to `None`.
        adaptation_streams: int or None. One adaptation matrix per stream.
            Defaults to `None`.
        seed: int or None. Seed of the dropout masks. Defaults to `None`.
        **kwargs: base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: a tensor of shape `(batch, m)`.
        states: a list `[h, c]` of tensors of shape `(batch, units)`.
        training: bool. Whether dropout is applied.

    Example:

    >>> import numpy as np, keras
    >>> cell = RLSTMCell(16, mogrifier_rounds=5, mogrifier_rank=4)
    >>> rnn = keras.layers.RNN(cell, return_sequences=True)
    >>> tuple(rnn(np.zeros((2, 7, 8))).shape)
    (2, 7, 16)

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2211.01848), Circling Back to
          Recurrent Models of Language, §2.
    """

    def __init__(self, units, mogrifier_rounds=0, **kwargs):
        super().__init__(units, mogrifier_rounds=mogrifier_rounds, **kwargs)

    def build_step(self, input_dim):
        n = self.units
        self.kernel = self.add_weight(
            shape=(input_dim, 2 * n),
            name="kernel",
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        self.recurrent_kernel = self.add_weight(
            shape=(n, 3 * n),
            name="recurrent_kernel",
            initializer=self.recurrent_initializer,
            regularizer=self.recurrent_regularizer,
            constraint=self.recurrent_constraint,
        )
        self.forget_kernel = self.add_weight(
            shape=(n, n),
            name="forget_kernel",
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        self.output_kernel = self.add_weight(
            shape=(n, n),
            name="output_kernel",
            initializer=self.recurrent_initializer,
            regularizer=self.recurrent_regularizer,
            constraint=self.recurrent_constraint,
        )
        self.bias = (
            self.add_weight(
                shape=(4 * n,),
                name="bias",
                initializer=self.gate_bias_initializer(("i", "j", "f", "o")),
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )
            if self.use_bias
            else None
        )

    def gate_weights(self, dtype):
        weights = {
            name: ops.cast(getattr(self, name), dtype)
            for name in (
                "kernel", "recurrent_kernel", "forget_kernel", "output_kernel"
            )
        }
        if self.bias is None:
            weights["input_bias"] = weights["output_bias"] = None
        else:
            # (i, j, f) go with the projected input, o with the output gate.
            # Sliced: `ops.split` at a list of indices reads them back from
            # the device on PyTorch (a host sync every call, a graph break
            # under `torch.compile`).
            bias = ops.cast(self.bias, dtype)
            weights["input_bias"] = bias[: 3 * self.units]
            weights["output_bias"] = bias[3 * self.units:]
        return weights

    def prepare_sequence_weights(self, weights):
        if self.mogrifier is not None:
            # The input is projected at every step: the kernel is padded
            # once per sequence instead of the projection at every step.
            weights["kernel"] = _pad_columns(weights["kernel"], self.units)
        return weights

    def project_input(self, weights, x):
        # [x @ W_i + b_i, x @ W_j + b_j, b_f]: as wide as `h_prev @ U`, so the
        # step adds the two in one operation and splits once; the forget bias
        # rides along (x has no weights to f). Hoisted out of the time loop
        # (no mogrifier), the projection of all steps is padded at once.
        z_x = ops.matmul(x, weights["kernel"])
        if z_x.shape[-1] == 2 * self.units:
            z_x = _pad_columns(z_x, self.units)
        if weights["input_bias"] is not None:
            z_x = ops.add(z_x, weights["input_bias"])
        return z_x

    def step(self, weights, z_x, h_prev, c_prev, state_mask):
        z = ops.add(z_x, ops.matmul(h_prev, weights["recurrent_kernel"]))
        z_i, z_j, z_f = ops.split(z, 3, axis=-1)
        i = ops.sigmoid(z_i)
        j = ops.tanh(z_j)
        f = ops.sigmoid(ops.add(z_f, ops.matmul(i * j, weights["forget_kernel"])))
        c = f * c_prev + ops.minimum(i, 1.0 - f) * j
        c_seen = c if state_mask is None else c * state_mask
        z_o = ops.matmul(c_seen, weights["output_kernel"])
        if weights["output_bias"] is not None:
            z_o = ops.add(z_o, weights["output_bias"])
        h = ops.sigmoid(z_o) * ops.tanh(c)
        return h, c


def _pad_columns(x, width):
    """`x` with `width` zero columns appended on its last axis.

    What `ops.pad` computes; `ops.pad` builds a Keras `Operation` object at
    every call, which on PyTorch (eager) cost more than the padding itself.
    `width` must not exceed `x`'s last dimension (here `2 · units ≥ units`).
    """
    return ops.concatenate([x, ops.zeros_like(x[..., :width])], axis=-1)
