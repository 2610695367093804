import keras
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register
from keras_mogrifier.layers.cell_rnn import CellRNN
from keras_mogrifier.layers.mogrifier_lstm_cell import MogrifierLSTMCell
from keras_mogrifier.layers.rlstm_cell import RLSTMCell

CELLS = ("lstm", "mogrifier_lstm", "rlstm", "mogrifier_rlstm")


class RNN(CellRNN):
    """`CellRNN` as the backbone holds its recurrent layers.

    The class name is what a `.keras` file sees: Keras stores the layers of
    a list under their class names in snake case, and models saved before
    `CellRNN` existed (with `keras.layers.RNN`) hold their recurrent layers
    at `layers/rnn`, `layers/rnn_1`, …; under this name the new layers are
    stored at the same paths, so those files load, and new files keep the
    layout. Not registered: the backbone builds these from its own config.
    """


@register
class RecurrentBackbone(keras.layers.Layer):
    """Token ids to features: embedding, recurrent stack and carried state.

    ```
    x̂⁰ = E[w] ⊙ M_in                                # input (embedding) dropout
    layer 1 reads x̂⁰; layer l > 1 reads Σ_{i<l} x̂ⁱ   # residual (or x̂ˡ⁻¹)
    x̂ˡ = hˡ ⊙ M_cellˡ                               # cell-output dropout
    features = Σ_l x̂ˡ                               # (units wide)
    ```

    With `residual=False` the layers are plainly stacked (layer l reads
    `hˡ⁻¹ ⊙ M_cellˡ⁻¹`, the features are `hᴸ`); with `skip_connections=True`
    as well, lamb's skip connections (the features are the undropped sum
    `Σ_l hˡ`). See `LanguageModel` for every argument: the backbone takes
    those of the embedding, the cells, the wiring, their dropouts and the
    carried state.

    With `stateful=True` the state of every layer is kept in
    `recurrent_state_variables` (`h` and `c` of each layer, `state_rows`
    rows) and carried from one call to the next (truncated
    backpropagation through time); a call with fewer rows uses and updates
    the leading rows. `reset_states` zeroes it.

    Args:
        vocabulary_size: int. Number of token ids.
        units: int. Width of every recurrent layer (and of the features).
        num_layers: int. Number of recurrent layers. Defaults to `2`.
        embedding_dim: int or None. Embedding width; `None` is `units`.
        cell: str. One of `"lstm"`, `"mogrifier_lstm"`, `"rlstm"`,
            `"mogrifier_rlstm"`. Defaults to `"mogrifier_lstm"`.
        mogrifier_rounds, mogrifier_rank, capped_input_gate, chrono_t_max,
        chrono_input_bias, unit_forget_bias: the cells' (see
            `MogrifierLSTMCell`).
        residual, skip_connections: the wiring (above).
        input_dropout, cell_output_dropout, state_dropout: float rates.
        stateful: bool. Carry the state across calls. Defaults to `True`.
        batch_size: int or None. Rows of carried state; `None` takes the
            batch size it is built with.
        drop_state_probability: float. In training, each row's carried
            state is zeroed with this probability at each call.
        l2: float. L2 coefficient of every weight it owns.
        initializer: initializer or None. For every weight matrix, the
            embeddings and the gate biases.
        adaptation_units, adaptation_streams, adaptation_layer: the sparse
            dynamic evaluation's adaptation matrix (see `MogrifierLSTMCell`).
        seed: int or None. Seed of the dropout masks.
        **kwargs: base layer keyword arguments, such as `name`.

    Call arguments:
        inputs: int tensor `(batch, time)` of token ids.
        training: bool. Dropout on.
        return_embedded: bool. Also return the input embeddings (before
            dropout), what the Dual head reads. Defaults to `False`.

    Example:

    >>> import numpy as np
    >>> backbone = RecurrentBackbone(50, units=16, num_layers=2, batch_size=3)
    >>> tuple(backbone(np.zeros((3, 7), "int32")).shape)
    (3, 7, 16)

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2211.01848), Circling Back to
          Recurrent Models of Language, §3.
    """

    def __init__(
        self,
        vocabulary_size,
        units=650,
        num_layers=2,
        embedding_dim=None,
        cell="mogrifier_lstm",
        mogrifier_rounds=5,
        mogrifier_rank=None,
        capped_input_gate=True,
        chrono_t_max=None,
        unit_forget_bias=True,
        residual=True,
        input_dropout=0.0,
        cell_output_dropout=0.0,
        state_dropout=0.0,
        stateful=True,
        batch_size=None,
        drop_state_probability=0.0,
        l2=0.0,
        initializer=None,
        adaptation_units=None,
        adaptation_streams=None,
        adaptation_layer=-1,
        seed=None,
        skip_connections=False,
        chrono_input_bias=True,
        **kwargs,
    ):
        v = _validation
        vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
        units = v.positive_int("units", units)
        num_layers = v.positive_int("num_layers", num_layers)
        embedding_dim = v.optional_positive_int("embedding_dim", embedding_dim)
        cell = v.one_of("cell", cell, CELLS)
        mogrifier_rounds = v.non_negative_int("mogrifier_rounds", mogrifier_rounds)
        input_dropout = v.rate("input_dropout", input_dropout)
        cell_output_dropout = v.rate("cell_output_dropout", cell_output_dropout)
        state_dropout = v.rate("state_dropout", state_dropout)
        if residual and skip_connections:
            raise ValueError(
                "Expected `skip_connections=True` with `residual=False` (skip "
                "connections replace the residual ones, as in lamb). "
                f"Received: residual={residual}, skip_connections=True"
            )
        batch_size = v.optional_positive_int("batch_size", batch_size)
        l2 = v.non_negative_float("l2", l2)
        drop_state_probability = v.rate("drop_state_probability", drop_state_probability)
        if not -num_layers <= adaptation_layer < num_layers:
            raise ValueError(
                f"Expected `adaptation_layer` to index one of the {num_layers} "
                f"layers. Received: adaptation_layer={adaptation_layer}"
            )
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.units = units
        self.num_layers = num_layers
        self.embedding_dim = embedding_dim
        self.cell = cell
        self.mogrifier_rounds = mogrifier_rounds
        self.mogrifier_rank = mogrifier_rank
        self.capped_input_gate = bool(capped_input_gate)
        self.chrono_t_max = chrono_t_max
        self.unit_forget_bias = bool(unit_forget_bias)
        self.residual = bool(residual)
        self.skip_connections = bool(skip_connections)
        self.chrono_input_bias = bool(chrono_input_bias)
        self.input_dropout = input_dropout
        self.cell_output_dropout = cell_output_dropout
        self.state_dropout = state_dropout
        self.stateful = bool(stateful)
        self.batch_size = batch_size
        self.drop_state_probability = drop_state_probability
        self.l2 = l2
        self.initializer = (
            None if initializer is None else keras.initializers.get(initializer)
        )
        self.adaptation_units = adaptation_units
        self.adaptation_streams = adaptation_streams
        self.adaptation_layer = adaptation_layer
        self.seed = seed

        # === Layers === (in this order: seeds are drawn in creation order)
        self.seed_generator = keras.random.SeedGenerator(seed)
        regularizer = keras.regularizers.L2(l2) if l2 > 0 else None
        weight_init = {} if self.initializer is None else {
            "kernel_initializer": self.initializer,
            "recurrent_initializer": self.initializer,
            "bias_initializer": self.initializer,
        }
        self.embedding = keras.layers.Embedding(
            vocabulary_size,
            embedding_dim or units,
            embeddings_initializer=self.initializer or "uniform",
            embeddings_regularizer=regularizer,
            name="embedding",
        )
        self.input_dropout_layer = keras.layers.Dropout(
            input_dropout, seed=seed, name="input_dropout"
        )
        cell_class = RLSTMCell if "rlstm" in cell else MogrifierLSTMCell
        rounds = mogrifier_rounds if cell.startswith("mogrifier") else 0
        adapted = adaptation_layer % num_layers
        self.recurrent_layers = []
        self.cell_output_dropout_layers = []
        for layer in range(num_layers):
            cell_kwargs = dict(
                mogrifier_rounds=rounds,
                mogrifier_rank=mogrifier_rank if rounds else None,
                chrono_t_max=chrono_t_max,
                chrono_input_bias=self.chrono_input_bias,
                unit_forget_bias=unit_forget_bias,
                recurrent_dropout=state_dropout,
                kernel_regularizer=regularizer,
                recurrent_regularizer=regularizer,
                bias_regularizer=regularizer,
                mogrifier_initializer=self.initializer,
                seed=None if seed is None else seed + 1 + layer,
                name=f"cell_{layer}",
                **weight_init,
            )
            if cell_class is MogrifierLSTMCell:
                cell_kwargs["capped_input_gate"] = self.capped_input_gate
            if adaptation_units is not None and layer == adapted:
                cell_kwargs["adaptation_units"] = adaptation_units
                cell_kwargs["adaptation_streams"] = adaptation_streams
            # keras.layers.RNN with the input projection hoisted out of the
            # time loop (same weights, same numbers).
            self.recurrent_layers.append(
                RNN(
                    cell_class(units, **cell_kwargs),
                    return_sequences=True,
                    return_state=True,
                    name=f"recurrent_{layer}",
                )
            )
            self.cell_output_dropout_layers.append(
                keras.layers.Dropout(
                    cell_output_dropout,
                    seed=None if seed is None else seed + 100 + layer,
                    name=f"cell_output_dropout_{layer}",
                )
            )

    # === Build ===

    def build(self, input_shape):
        self._build_layers(input_shape)
        self._build_state()

    def _build_layers(self, input_shape, state_rows=None):
        # Builds in the caller's name scope: a `LanguageModel` builds its
        # backbone from its own `build`, so the weights keep the paths that
        # files saved before this class existed record. `state_rows`: rows
        # of carried state (a multi-sample model needs batch × samples).
        input_shape = tuple(input_shape)
        if len(input_shape) != 2:
            raise ValueError(
                "Expected token ids of shape (batch, time). "
                f"Received: input_shape={input_shape}"
            )
        self.embedding.build(input_shape)
        size = self.embedding.output_dim
        for rnn in self.recurrent_layers:
            rnn.build((None, None, size))
            size = self.units
        self._state_rows = state_rows or self.batch_size or input_shape[0]
        self.built = True

    def _build_state(self):
        """Creates the carried state (after the layers: the variables of a
        `LanguageModel` come in this order)."""
        states = []
        if self.stateful:
            rows = self._state_rows
            if rows is None:
                raise ValueError(
                    "A stateful LanguageModel needs a known batch size: pass "
                    "`batch_size=` or build it on inputs with a static batch "
                    "dimension. Received: input_shape=(None, ...)"
                )
            self.state_capacity = rows
            for layer in range(self.num_layers):
                for name in ("h", "c"):
                    states.append(
                        keras.Variable(
                            initializer=keras.initializers.Zeros(),
                            shape=(rows, self.units),
                            dtype=self.variable_dtype,
                            trainable=False,
                            name=f"state_{layer}_{name}",
                        )
                    )
        self.recurrent_state_variables = states
        return states

    # === Forward pass ===

    def call(self, inputs, training=False, return_embedded=False, state_observer=None):
        ids = ops.cast(inputs, "int32")
        rows = ops.shape(ids)[0]
        states = None
        if self.stateful:
            states = [self.read_state(v, rows) for v in self.recurrent_state_variables]
        x, embedded, new_states = self._run(
            ids, states, training, state_observer, drop_states=self.stateful
        )
        if self.stateful:
            for variable, state in zip(self.recurrent_state_variables, new_states):
                self.write_state(variable, state)
        return (x, embedded) if return_embedded else x

    def call_with_state(self, inputs, states=None, training=False):
        """A call from a given state, which it returns instead of carrying.

        Touches no variable (a pure function of the ids, the state and the
        weights): what a sampler's cache needs.

        Args:
            inputs: int tensor `(batch, time)` of token ids.
            states: list of `2 · num_layers` tensors `(batch, units)`, `h`
                and `c` of each layer (see `zero_state`), or None for zeros.
            training: bool. Dropout on.

        Returns:
            `(features, embedded, new_states)`.
        """
        ids = ops.cast(inputs, "int32")
        if states is None:
            states = self.zero_state(ops.shape(ids)[0])
        if len(states) != 2 * self.num_layers:
            raise ValueError(
                f"Expected {2 * self.num_layers} state tensors (`h` and `c` of "
                f"each of the {self.num_layers} layers). Received: "
                f"{len(states)} tensors"
            )
        return self._run(
            ids, list(states), training, None, drop_states=False,
            lean=self._lean(training),
        )

    def _lean(self, training):
        """Whether a call from a given state may skip Keras's `Layer.__call__`.

        At inference in full precision the sublayers' `__call__` adds
        nothing to their `call` (no dropout, no autocast, every layer built)
        but its own cost, paid per sublayer per call: on PyTorch, whose
        layers run eagerly, that was about a quarter of a generated token's
        time (`benchmarks/generation_paths.py`). The recurrent layers go
        further, straight to their time loop (`inner_loop`): what
        `keras.layers.RNN.call` adds around it is, at inference from a given
        state, casts to the dtype the tensors have and the preparation of
        the cells' dropout masks — drawn from the cell's seed generator at
        every call and never used at inference. Where any of the backbone's
        layers has a mixed-precision policy, the autocast of `__call__`
        matters, and the full path runs.
        """
        if training is not False or not self.built:
            return False
        if not hasattr(self, "_full_precision"):
            self._full_precision = all(
                layer.dtype_policy.compute_dtype == layer.dtype_policy.variable_dtype
                for layer in self._flatten_layers(include_self=True, recursive=True)
            )
        return self._full_precision

    def zero_state(self, rows):
        """The state before any token: `2 · num_layers` zeros `(rows, units)`."""
        return [
            ops.zeros((rows, self.units), self.compute_dtype)
            for _ in range(2 * self.num_layers)
        ]

    def _run(self, ids, states, training, state_observer, drop_states, lean=False):
        # `lean` (see `_lean`): each sublayer's `call` directly, the dropout
        # layers (identities at inference) skipped.
        if lean:
            embedded = self.embedding.call(ids)
            x = embedded
        else:
            embedded = self.embedding(ids)
            x = self.input_dropout_layer(embedded, training=training)
        rows = ops.shape(ids)[0]
        new_states = []
        outputs = []
        keep = None
        if drop_states and bool(training) and self.drop_state_probability > 0:
            # One draw per stream (row), for every layer's h and c alike.
            keep = ops.cast(
                keras.random.uniform((rows, 1), seed=self.seed_generator)
                >= self.drop_state_probability,
                self.compute_dtype,
            )
        for layer, rnn in enumerate(self.recurrent_layers):
            initial_state = None
            if states is not None:
                initial_state = states[2 * layer : 2 * layer + 2]
                if state_observer is not None:
                    # (Before the state dropout: what the variable holds.)
                    state_observer(initial_state, layer, training)
                if keep is not None:
                    initial_state = [s * ops.cast(keep, s.dtype) for s in initial_state]
            if lean:
                # The recurrent layer's time loop itself (see `_lean`).
                state = [ops.convert_to_tensor(s, rnn.cell.compute_dtype) for s in initial_state]
                _, h, (h_last, c_last) = rnn.inner_loop(x, state, None, training=False)
            else:
                h, h_last, c_last = rnn(x, initial_state=initial_state, training=training)
            new_states += [h_last, c_last]
            dropout = _identity if lean else self.cell_output_dropout_layers[layer]
            if self.residual:
                # Circling Back §3: x̂ˡ = hˡ ⊙ M_cellˡ, layer l reads Σ_{i<l} x̂ⁱ.
                h = dropout(h, training=training)
                outputs.append(h)
                x = _sum(outputs)
            else:
                # Plain or skip: inter-layer dropout, between layers only.
                outputs.append(h)
                if layer < self.num_layers - 1:
                    x = dropout(h, training=training)
        if not self.residual:
            # The output reads the undropped sum (skip) or the last layer.
            x = _sum(outputs) if self.skip_connections else outputs[-1]
        return x, embedded, new_states

    # === Carried state ===

    def read_state(self, variable, rows):
        """The first `rows` rows of a state variable, as a tensor."""
        # A copy of the variable's current value: the variable is written
        # again at the end of the call (in place on PyTorch, which must not
        # touch a tensor that autograd saved), and JAX traces values, never
        # the variable itself.
        value = ops.convert_to_tensor(variable)
        return ops.copy(ops.slice(value, (0, 0), (rows, self.units)))

    def write_state(self, variable, state):
        """Writes `state` into the leading rows of a state variable."""
        # Truncated BPTT: the carried state is a constant for the next window.
        state = ops.stop_gradient(ops.cast(state, variable.dtype))
        if tuple(state.shape) == tuple(variable.shape):
            # Every row (a known shape): no slice to update.
            variable.assign(state)
            return
        value = ops.convert_to_tensor(variable)
        variable.assign(ops.slice_update(value, (0, 0), state))

    def reset_states(self):
        """Zeroes the carried recurrent state (every row)."""
        for variable in getattr(self, "recurrent_state_variables", []):
            variable.assign(ops.zeros(variable.shape, variable.dtype))

    # === Config ===

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in BACKBONE_ARGUMENTS})
        config["initializer"] = (
            None
            if self.initializer is None
            else keras.initializers.serialize(self.initializer)
        )
        return config


# The constructor arguments (a `LanguageModel` passes its own on).
BACKBONE_ARGUMENTS = (
    "vocabulary_size", "units", "num_layers", "embedding_dim", "cell",
    "mogrifier_rounds", "mogrifier_rank", "capped_input_gate", "chrono_t_max",
    "unit_forget_bias", "residual", "input_dropout", "cell_output_dropout",
    "state_dropout", "stateful", "batch_size", "drop_state_probability", "l2",
    "initializer", "adaptation_units", "adaptation_streams",
    "adaptation_layer", "seed", "skip_connections", "chrono_input_bias",
)


def _sum(tensors):
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total


def _identity(x, training=False):
    """A dropout layer at inference, without its call (see `_lean`)."""
    del training
    return x
