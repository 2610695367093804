"""What every cell of the package shares: arguments, dropout, the mogrifier.

`MogrifiedCell` is the base of `MogrifierLSTMCell` and `RLSTMCell`. It owns
the arguments common to both, the variational dropout masks (through Keras's
`DropoutRNNCell` mixin, so that `keras.layers.RNN` creates one mask per
sequence outside the time loop), the `Mogrifier` sub-layer, and the optional
adaptation matrix of sparse dynamic evaluation. A subclass only creates its
step weights (`build_step`) and computes one step (`step`).
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

    def step(self, x, h_prev, c_prev, state_mask):
        """One step on mogrified `x`, `h_prev`; returns the new `(h, c)`."""
        raise NotImplementedError

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
        h_prev, c_prev = states[0], states[1]
        x = inputs
        if training and self.dropout > 0.0:
            x = x * self.get_dropout_mask(inputs)
        state_mask = None
        if training and self.recurrent_dropout > 0.0:
            state_mask = self.get_recurrent_dropout_mask(h_prev)
            h_prev = h_prev * state_mask
        if self.mogrifier is not None:
            x, h_prev = self.mogrifier([x, h_prev])
        h, c = self.step(x, h_prev, c_prev, state_mask)
        if self.adaptation_kernel is not None:
            h = self._adapt(h)
        return h, [h, c]

    def _adapt(self, h):
        size = self.adaptation_units
        head = h[:, :size]
        kernel = ops.cast(self.adaptation_kernel, h.dtype)
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
