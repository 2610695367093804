"""What every cell of the package shares: arguments, dropout, the mogrifier.

`MogrifiedCell` is the base of `MogrifierLSTMCell` and `RLSTMCell`. It owns
the arguments common to both, the variational dropout masks (through Keras's
`DropoutRNNCell` mixin, so that `keras.layers.RNN` creates one mask per
sequence outside the time loop), the `Mogrifier` sub-layer, and the optional
adaptation matrix of sparse dynamic evaluation. A subclass creates its step
weights (`build_step`), reads them (`gate_weights`), projects the input
(`project_input`) and computes one step from the projected input (`step`).

One time step, in one place (`recurrent_step`), whichever loop runs it:

```
x = inputs ⊙ M_in                    # per-sequence input mask (training)
h_prev = h_prev ⊙ M_state            # per-sequence state mask (training)
x, h_prev = mogrify(x, h_prev)       # rounds > 0 only
z_x = project_input(x)               # x @ W + b: no dependence on the state
h, c = step(z_x, h_prev, c_prev)     # the recurrent products and the gates
```

`keras.layers.RNN(cell)` calls `call`, which reads the weights and runs all
of it at every step. `CellRNN` (the full-sequence layers and the language
model) reads the weights once per sequence, and when the input is not
mogrified computes `project_input` for every time step at once, before the
time loop: the loop then runs only `recurrent_step(..., projected=True)`.
"""

import keras
from keras import constraints
from keras import initializers
from keras import ops
from keras import regularizers

# Private in Keras 3 (not exported): `keras.layers.RNN` creates and resets
# per-sequence masks only for cells that inherit this exact class. The Keras
# range is pinned in pyproject.toml and the import is tested.
from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell

from keras_mogrifier import _validation
from keras_mogrifier.initializers.chrono_initializer import ChronoInitializer
from keras_mogrifier.layers.mogrifier import Mogrifier


class MogrifiedCell(keras.layers.Layer, DropoutRNNCell):
    """Base class of the package's recurrent cells; not used directly."""

    def __init__(
        self,
        units,
        mogrifier_rounds=0,
        mogrifier_rank=None,
        mogrifier_use_bias=True,
        mogrifier_initializer=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        unit_forget_bias=True,
        chrono_t_max=None,
        chrono_input_bias=True,
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        dropout=0.0,
        recurrent_dropout=0.0,
        adaptation_units=None,
        adaptation_streams=None,
        seed=None,
        **kwargs,
    ):
        # Validate everything before any state is created.
        units = _validation.positive_int("units", units)
        mogrifier_rounds = _validation.non_negative_int(
            "mogrifier_rounds", mogrifier_rounds
        )
        mogrifier_rank = _validation.optional_positive_int(
            "mogrifier_rank", mogrifier_rank
        )
        if mogrifier_rank is not None and mogrifier_rank > units:
            raise ValueError(
                "Expected `mogrifier_rank` to be at most `units` "
                f"({units}), the largest rank of the mogrifier's matrices. "
                f"Received: mogrifier_rank={mogrifier_rank}"
            )
        dropout = _validation.rate("dropout", dropout)
        recurrent_dropout = _validation.rate(
            "recurrent_dropout", recurrent_dropout
        )
        if chrono_t_max is not None:
            ChronoInitializer(chrono_t_max)  # validates t_max
            chrono_t_max = float(chrono_t_max)
        adaptation_units = _validation.optional_positive_int(
            "adaptation_units", adaptation_units
        )
        if adaptation_units is not None and adaptation_units > units:
            raise ValueError(
                "Expected `adaptation_units` to be at most `units` "
                f"({units}). Received: adaptation_units={adaptation_units}"
            )
        adaptation_streams = _validation.optional_positive_int(
            "adaptation_streams", adaptation_streams
        )
        if adaptation_streams is not None and adaptation_units is None:
            raise ValueError(
                "Expected `adaptation_units` to be set when "
                "`adaptation_streams` is. Received: adaptation_units=None, "
                f"adaptation_streams={adaptation_streams}"
            )
        super().__init__(**kwargs)

        self.units = units
        self.mogrifier_rounds = mogrifier_rounds
        self.mogrifier_rank = mogrifier_rank
        self.mogrifier_use_bias = bool(mogrifier_use_bias)
        self.mogrifier_initializer = (
            None
            if mogrifier_initializer is None
            else initializers.get(mogrifier_initializer)
        )
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.recurrent_initializer = initializers.get(recurrent_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.unit_forget_bias = bool(unit_forget_bias)
        self.chrono_t_max = chrono_t_max
        self.chrono_input_bias = bool(chrono_input_bias)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = regularizers.get(recurrent_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.recurrent_constraint = constraints.get(recurrent_constraint)
        self.bias_constraint = constraints.get(bias_constraint)
        self.dropout = dropout
        self.recurrent_dropout = recurrent_dropout
        self.adaptation_units = adaptation_units
        self.adaptation_streams = adaptation_streams
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed=seed)

        self.state_size = [self.units, self.units]
        self.output_size = self.units

        self.mogrifier = (
            Mogrifier(
                mogrifier_rounds,
                rank=mogrifier_rank,
                use_bias=mogrifier_use_bias,
                kernel_initializer=self.mogrifier_initializer,
                kernel_regularizer=self.kernel_regularizer,
                bias_regularizer=self.bias_regularizer,
                kernel_constraint=self.kernel_constraint,
                dtype=self.dtype_policy,
                name="mogrifier",
            )
            if mogrifier_rounds > 0
            else None
        )

    # --- what subclasses provide -------------------------------------------

    def build_step(self, input_dim):
        """Creates the step's weights for inputs of size `input_dim`."""
        raise NotImplementedError

    def gate_weights(self, dtype):
        """The step's weights as tensors of `dtype`, in a dict."""
        raise NotImplementedError

    def prepare_sequence_weights(self, weights):
        """The step's weights as read once per sequence (`CellRNN`).

        A subclass may precompute here what would otherwise be computed at
        every step; `project_input` and `step` must accept both forms.
        Defaults to the weights as they are.
        """
        return weights

    def project_input(self, weights, x):
        """`x @ W + b`: the part of the step that does not read the state.

        `x` is `(..., m)`; the result is what `step` takes as `z_x`.
        """
        raise NotImplementedError

    def step(self, weights, z_x, h_prev, c_prev, state_mask):
        """One step from the projected input; returns the new `(h, c)`."""
        raise NotImplementedError

    # --- one time step -------------------------------------------------------

    def step_weights(self, per_sequence=False):
        """Every weight the time step reads, as tensors of the compute dtype.

        `keras.layers.RNN` reads them at every step (through `call`);
        `CellRNN` reads them once per sequence and passes them in, with
        `per_sequence=True`: what can be prepared once per sequence then
        is. The mogrifier's doublings are folded into the matrices that read
        their outputs (`Mogrifier.fold_doubling`: the same numbers, one
        operation less per round and step), `kernel` and `recurrent_kernel`
        included — the only weights that read the mogrified `x` and
        `h_prev` — and the subclass's `prepare_sequence_weights` runs.
        """
        dtype = self.compute_dtype
        weights = self.gate_weights(dtype)
        weights["mogrifier"] = None
        weights["mogrifier_doubled"] = True
        if self.mogrifier is not None:
            weights["mogrifier"] = self.mogrifier.round_weights(dtype)
        if per_sequence:
            weights = self.prepare_sequence_weights(fold_mogrifier_doubling(weights))
        weights["adaptation"] = (
            None
            if self.adaptation_kernel is None
            else ops.cast(self.adaptation_kernel, dtype)
        )
        return weights

    @property
    def hoists_input_projection(self):
        """Whether `project_input` can run before the time loop.

        True when the input is not mogrified: its projection then does not
        depend on the state.
        """
        return self.mogrifier is None

    def input_mask(self, inputs, training):
        """The per-sequence input dropout mask (`None` if none applies).

        Drawn by `keras.layers.RNN` before the time loop from the first time
        step (`inputs` is one step, `(batch, m)`).
        """
        if training and self.dropout > 0.0:
            return self.get_dropout_mask(inputs)
        return None

    def recurrent_step(self, weights, x, states, training, projected=False):
        """One time step on the (dropped-out) input `x`.

        With `projected=True`, `x` is already `project_input(weights, x)`
        (only for cells whose input is not mogrified).
        """
        h_prev, c_prev = states[0], states[1]
        state_mask = None
        if training and self.recurrent_dropout > 0.0:
            state_mask = self.get_recurrent_dropout_mask(h_prev)
            h_prev = h_prev * state_mask
        if not projected:
            if weights["mogrifier"] is not None:
                x, h_prev = Mogrifier.mogrify(
                    weights["mogrifier"], x, h_prev, weights["mogrifier_doubled"]
                )
            x = self.project_input(weights, x)
        h, c = self.step(weights, x, h_prev, c_prev, state_mask)
        if weights["adaptation"] is not None:
            h = self._adapt(weights["adaptation"], h)
        return h, [h, c]

    # --- shared machinery ----------------------------------------------------

    def build(self, input_shape):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError(
                "Expected the last dimension of the cell's input to be known. "
                f"Received: input_shape={input_shape}"
            )
        if self.mogrifier is not None:
            if self.mogrifier_rank is not None and self.mogrifier_rank > min(
                input_dim, self.units
            ):
                raise ValueError(
                    "Expected `mogrifier_rank` to be at most min(input size, "
                    f"units) = min({input_dim}, {self.units}). "
                    f"Received: mogrifier_rank={self.mogrifier_rank}"
                )
            self.mogrifier.build([(None, input_dim), (None, self.units)])
        self.build_step(input_dim)
        if self.adaptation_units is not None:
            shape = (self.adaptation_units, self.adaptation_units)
            if self.adaptation_streams is not None:
                shape = (self.adaptation_streams,) + shape
            self.adaptation_kernel = self.add_weight(
                shape=shape,
                name="adaptation_kernel",
                initializer="zeros",
                trainable=False,
            )
        else:
            self.adaptation_kernel = None

    def gate_bias_initializer(self, gates, input_gate="i"):
        """An initializer for a bias made of `gates` blocks of `units`.

        Block `gates.index("f")` is the forget bias: Chrono when
        `chrono_t_max` is set, else ones when `unit_forget_bias`, else
        `bias_initializer`. With Chrono and `chrono_input_bias`, block
        `input_gate` is set to minus the forget bias, as in the original
        method (Tallec & Ollivier, 2018: `b_i = −b_f`).
        """
        units = self.units
        forget = gates.index("f")
        if self.chrono_t_max is None and not self.unit_forget_bias:
            return self.bias_initializer
        chrono = (
            None
            if self.chrono_t_max is None
            else ChronoInitializer(self.chrono_t_max, seed=self.seed)
        )

        def initializer(shape, dtype=None):
            blocks = [
                self.bias_initializer((units,), dtype=dtype) for _ in gates
            ]
            if chrono is None:
                blocks[forget] = ops.ones((units,), dtype=dtype)
            else:
                blocks[forget] = chrono((units,), dtype=dtype)
                if self.chrono_input_bias:
                    blocks[gates.index(input_gate)] = -blocks[forget]
            return ops.concatenate(blocks)

        return initializer

    def call(self, inputs, states, training=False):
        mask = self.input_mask(inputs, training)
        x = inputs if mask is None else inputs * mask
        return self.recurrent_step(self.step_weights(), x, states, training)

    def _adapt(self, kernel, h):
        size = self.adaptation_units
        head = h[:, :size]
        if self.adaptation_streams is None:
            delta = ops.matmul(head, kernel)
        else:
            delta = ops.einsum("bh,bhk->bk", head, kernel)
        if size == self.units:
            return h + delta
        return ops.concatenate([head + delta, h[:, size:]], axis=-1)

    def get_initial_state(self, batch_size=None):
        return [
            ops.zeros((batch_size, d), dtype=self.compute_dtype)
            for d in self.state_size
        ]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "mogrifier_rounds": self.mogrifier_rounds,
                "mogrifier_rank": self.mogrifier_rank,
                "mogrifier_use_bias": self.mogrifier_use_bias,
                "mogrifier_initializer": (
                    None
                    if self.mogrifier_initializer is None
                    else initializers.serialize(self.mogrifier_initializer)
                ),
                "use_bias": self.use_bias,
                "kernel_initializer": initializers.serialize(
                    self.kernel_initializer
                ),
                "recurrent_initializer": initializers.serialize(
                    self.recurrent_initializer
                ),
                "bias_initializer": initializers.serialize(
                    self.bias_initializer
                ),
                "unit_forget_bias": self.unit_forget_bias,
                "chrono_t_max": self.chrono_t_max,
                "chrono_input_bias": self.chrono_input_bias,
                "kernel_regularizer": regularizers.serialize(
                    self.kernel_regularizer
                ),
                "recurrent_regularizer": regularizers.serialize(
                    self.recurrent_regularizer
                ),
                "bias_regularizer": regularizers.serialize(
                    self.bias_regularizer
                ),
                "kernel_constraint": constraints.serialize(
                    self.kernel_constraint
                ),
                "recurrent_constraint": constraints.serialize(
                    self.recurrent_constraint
                ),
                "bias_constraint": constraints.serialize(self.bias_constraint),
                "dropout": self.dropout,
                "recurrent_dropout": self.recurrent_dropout,
                "adaptation_units": self.adaptation_units,
                "adaptation_streams": self.adaptation_streams,
                "seed": self.seed,
            }
        )
        return config


def fold_mogrifier_doubling(weights):
    """`weights` from `step_weights` with the mogrifier's doublings folded.

    `Mogrifier.fold_doubling`: each round's factor 2 moves into the
    matrices that read the round's output, `kernel` and `recurrent_kernel`
    included (the only weights that read the mogrified `x` and `h_prev`).
    Scaling by a power of two is exact, so a step computes the same numbers
    with one addition less per round. A new dict; `weights` without
    mogrifier rounds, or already folded, come back as they are.
    """
    if weights["mogrifier"] is None or not weights["mogrifier_doubled"]:
        return weights
    rounds, x_scale, h_scale = Mogrifier.fold_doubling(weights["mogrifier"])
    return dict(
        weights,
        mogrifier=rounds,
        mogrifier_doubled=False,
        kernel=weights["kernel"] * x_scale,
        recurrent_kernel=weights["recurrent_kernel"] * h_scale,
    )
