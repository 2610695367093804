from keras import ops

from keras_mogrifier._export import register
from keras_mogrifier.layers.mogrified_cell import MogrifiedCell


@register
class MogrifierLSTMCell(MogrifiedCell):
    """Cell class of the Mogrifier LSTM: an LSTM step on mogrified inputs.

    First `x` and `h_prev` gate each other for `mogrifier_rounds` rounds (see
    `Mogrifier`), then an LSTM step, in Keras's gate order (i, f, j, o):

    ```
    z = x @ kernel + h_prev @ recurrent_kernel + bias
    i, f, j, o = σ(z_i), σ(z_f), tanh(z_j), σ(z_o)
    c = f ⊙ c_prev + i' ⊙ j,  i' = min(i, 1 − f) if capped_input_gate else i
    h = o ⊙ tanh(c)
    ```

    `kernel` (m × 4n), `recurrent_kernel` (n × 4n) and `bias` (4n) have the
    layout of `keras.layers.LSTMCell`, so LSTM weights load straight into it;
    with `mogrifier_rounds=0, capped_input_gate=False` it computes exactly
    what `keras.layers.LSTMCell` computes. The state is `[h, c]`.

    Dropout is variational: one input mask and one state mask per sequence
    (drawn by `keras.layers.RNN` before the time loop), applied to `x` and
    `h_prev` before mogrification.

    Args:
        units: int. Dimensionality of the state `n`.
        mogrifier_rounds: int. Number of mogrifier rounds `r`; 0 is a plain
            LSTM. Defaults to `5`.
        mogrifier_rank: int or None. Rank of the mogrifier's matrices; `None`
            for full rank. Defaults to `None`.
        mogrifier_use_bias: bool. A zero-initialised bias per mogrifier round
            (as in the authors' code). Defaults to `True`.
        mogrifier_initializer: initializer of the mogrifier's matrices; `None`
            is the authors' scheme (`MogrifierFactorInitializer`). Defaults to
            `None`.
        capped_input_gate: bool. Use `min(i, 1 − f)` as the input gate (on in
            all the authors' configurations). Defaults to `True`.
        use_bias: bool. Whether the gates have a bias. Defaults to `True`.
        kernel_initializer: initializer of `kernel`. Defaults to
            `"glorot_uniform"`.
        recurrent_initializer: initializer of `recurrent_kernel`. Defaults to
            `"orthogonal"`.
        bias_initializer: initializer of `bias`. Defaults to `"zeros"`.
        unit_forget_bias: bool. Initialise the forget bias to 1 (ignored when
            `chrono_t_max` is set). Defaults to `True`.
        chrono_t_max: float or None. If set, Chrono initialisation: the forget
            bias from `ChronoInitializer(chrono_t_max)`, and (with
            `chrono_input_bias`) the input bias its negative. Defaults to
            `None`.
        chrono_input_bias: bool. With `chrono_t_max`, also set the input
            bias to `−b_f`, as original Chrono does (Tallec & Ollivier 2018); `False` initialises only the forget bias, the reading of
            Circling Back §3 ("Forget gates are initialized with Chrono
            init"), leaving the input bias to `bias_initializer`. Defaults to
            `True`, the same for every cell.
        kernel_regularizer: regularizer of `kernel` and of the mogrifier's
            matrices. Defaults to `None`.
        recurrent_regularizer: regularizer of `recurrent_kernel`. Defaults to
            `None`.
        bias_regularizer: regularizer of `bias` and of the mogrifier's
            biases. Defaults to `None`.
        kernel_constraint: constraint of `kernel` and of the mogrifier's
            matrices. Defaults to `None`.
        recurrent_constraint: constraint of `recurrent_kernel`. Defaults to
            `None`.
        bias_constraint: constraint of `bias`. Defaults to `None`.
        dropout: float in [0, 1). Variational dropout rate of the input.
            Defaults to `0.0`.
        recurrent_dropout: float in [0, 1). Variational dropout rate of the
            state `h_prev`. Defaults to `0.0`.
        adaptation_units: int or None. For sparse dynamic evaluation: adds a
            non-trainable, zero-initialised matrix `adaptation_kernel`
            (H × H) and computes `h' = h + h[:, :H] @ M` on the first H
            units, fed to the output and the recurrence. Inert (and absent)
            when `None`. Defaults to `None`.
        adaptation_streams: int or None. With `adaptation_units`, one matrix
            per stream: `adaptation_kernel` is (S × H × H) and the batch must
            be S. Defaults to `None`.
        seed: int or None. Seed of the dropout masks. Defaults to `None`.
        **kwargs: base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: a tensor of shape `(batch, m)`.
        states: a list `[h, c]` of tensors of shape `(batch, units)`.
        training: bool. Whether dropout is applied.

    Example:

    >>> import numpy as np, keras
    >>> cell = MogrifierLSTMCell(16, mogrifier_rounds=5, mogrifier_rank=4)
    >>> rnn = keras.layers.RNN(cell, return_sequences=True)
    >>> tuple(rnn(np.zeros((2, 7, 8))).shape)
    (2, 7, 16)

    Reference:
        - [Melis et al., 2020](https://arxiv.org/abs/1909.01792), Mogrifier
          LSTM, ICLR 2020.
    """

    def __init__(
        self, units, mogrifier_rounds=5, capped_input_gate=True, **kwargs
    ):
        super().__init__(units, mogrifier_rounds=mogrifier_rounds, **kwargs)
        self.capped_input_gate = bool(capped_input_gate)

    def build_step(self, input_dim):
        n = self.units
        self.kernel = self.add_weight(
            shape=(input_dim, 4 * n),
            name="kernel",
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        self.recurrent_kernel = self.add_weight(
            shape=(n, 4 * n),
            name="recurrent_kernel",
            initializer=self.recurrent_initializer,
            regularizer=self.recurrent_regularizer,
            constraint=self.recurrent_constraint,
        )
        self.bias = (
            self.add_weight(
                shape=(4 * n,),
                name="bias",
                initializer=self.gate_bias_initializer(("i", "f", "j", "o")),
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )
            if self.use_bias
            else None
        )

    def gate_weights(self, dtype):
        return {
            "kernel": ops.cast(self.kernel, dtype),
            "recurrent_kernel": ops.cast(self.recurrent_kernel, dtype),
            "bias": None if self.bias is None else ops.cast(self.bias, dtype),
        }

    def project_input(self, weights, x):
        z_x = ops.matmul(x, weights["kernel"])
        if weights["bias"] is not None:
            z_x = ops.add(z_x, weights["bias"])
        return z_x

    def step(self, weights, z_x, h_prev, c_prev, state_mask):
        z = ops.add(z_x, ops.matmul(h_prev, weights["recurrent_kernel"]))
        z_i, z_f, z_j, z_o = ops.split(z, 4, axis=-1)
        f = ops.sigmoid(z_f)
        if self.capped_input_gate:
            # min(σ(z_i), 1 − σ(z_f)) = σ(min(z_i, −z_f)), since σ increases
            # and 1 − σ(z) = σ(−z): no subtraction from a constant, whose
            # gradient TensorFlow would also compute.
            i = ops.sigmoid(ops.minimum(z_i, ops.negative(z_f)))
        else:
            i = ops.sigmoid(z_i)
        c = f * c_prev + i * ops.tanh(z_j)
        h = ops.sigmoid(z_o) * ops.tanh(c)
        return h, c

    def get_config(self):
        config = super().get_config()
        config["capped_input_gate"] = self.capped_input_gate
        return config
