import keras
import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register
from keras_mogrifier.layers.cell_rnn import CellRNN
from keras_mogrifier.layers.dual_output import DualOutput
from keras_mogrifier.layers.mogrifier_lstm_cell import MogrifierLSTMCell
from keras_mogrifier.layers.rlstm_cell import RLSTMCell
from keras_mogrifier.losses.chunked_log_softmax import chunked_target_log_softmax
from keras_mogrifier.losses.iwae_dropout_loss import IWAEDropoutLoss
from keras_mogrifier.metrics._token_nll_metric import TokenNLLMetric

CELLS = ("lstm", "mogrifier_lstm", "rlstm", "mogrifier_rlstm")
DEFAULT_CHUNK_SIZE = 1024


@register
class LanguageModel(keras.Model):
    """A recurrent language model: the architectures of the three papers.

    Maps token ids `(batch, time)` to next-token logits
    `(batch, time, vocabulary_size)`:

    ```
    x̂⁰ = E_in[w] ⊙ M_in                             # input (embedding) dropout
    layer 1 reads x̂⁰; layer l > 1 reads Σ_{i<l} x̂ⁱ   # residual (or x̂ˡ⁻¹)
    x̂ˡ = hˡ ⊙ M_cellˡ                               # cell-output dropout
    logits = (Σ_l x̂ˡ ⊙ M_out) @ E_outᵀ + b_out       # tied: E_out = E_in
    ```

    The masks `M_in`, `M_cell`, `M_out` are drawn anew at every time step;
    the state mask (`state_dropout`) is variational, one per sequence, inside
    the cells. With `residual=False` the layers are plainly stacked (layer l
    reads x̂ˡ⁻¹, the output reads the last layer). With `dual=True` the
    output goes through a `DualOutput` that also sees the current input
    embedding. When the summed width `units` differs from the embedding width
    and embeddings are tied, a linear projection maps it to the embedding
    width.

    Truncated back-propagation through time: with `stateful=True` (the
    default) the recurrent state is kept in the model's
    `recurrent_state_variables` and carried from one call to the next; `fit`
    resets it at the start of every epoch; `evaluate` starts from zero state
    and puts the carried state back when it ends. The
    state variables have room for `batch_size * samples` rows; a call with a
    smaller batch uses and updates the leading rows, so the same model
    evaluates with a batch of 1.

    With `samples = D > 1`, in training every sequence is repeated D times in
    the batch (each copy with its own dropout masks and its own carried state)
    and the logits come out as `(batch, D, time, vocabulary_size)`, the input
    of `IWAEDropoutLoss`. At evaluation (dropout off) the copies would be
    identical, so one is computed: logits are `(batch, time, vocab)`.

    Chunked softmax: the logits of a multi-sample batch, B·D·T·V floats, are
    the largest tensor of a word-level training step. With
    `softmax_chunk_size=C`, `fit` never materialises them: in training,
    `call` returns the softmax layer's *input features* instead, shaped like
    the logits but with the features width as last axis, and `compute_loss`
    computes the log-probability of each target `C` tokens at a time (the
    backward pass recomputes each chunk; see `chunked_target_log_softmax`
    and `target_log_probabilities`). The loss compiled must be an
    `IWAEDropoutLoss`; its value and gradients are those of the unchunked
    model. Training metrics must be `Perplexity` or `BitsPerCharacter`
    (they only need the target's probability). Evaluation and `predict`
    return logits as usual (one sample, D times smaller).

    At evaluation the logits are multiplied by the softmax temperature
    (`temperature`, a non-trainable variable; see `search_temperature`).

    Args:
        vocabulary_size: int. Number of token ids.
        units: int. Width of every recurrent layer. Defaults to `650`.
        num_layers: int. Number of recurrent layers. Defaults to `2`.
        embedding_dim: int or None. Embedding width; `None` means `units`.
            Defaults to `None`.
        cell: str. One of `"lstm"`, `"mogrifier_lstm"`, `"rlstm"`,
            `"mogrifier_rlstm"`. Defaults to `"mogrifier_lstm"`.
        mogrifier_rounds: int. Rounds of the mogrifier cells (ignored for
            `"lstm"` and `"rlstm"`). Defaults to `5`.
        mogrifier_rank: int or None. Rank of the mogrifier's matrices; `None`
            for full rank. Defaults to `None`.
        capped_input_gate: bool. `min(i, 1 − f)` in the LSTM cells (the RLSTM
            is always capped). Defaults to `True`.
        chrono_t_max: float or None. Chrono initialisation of the forget
            biases. Defaults to `None`.
        unit_forget_bias: bool. Forget biases initialised to 1 (when Chrono is
            off). Defaults to `True`.
        residual: bool. Residual connections (Circling Back §3) or plain
            stacking. Defaults to `True`.
        tie_embeddings: bool. Share the input and output embeddings (word
            level). Defaults to `True`.
        input_dropout: float. Dropout of the input embeddings. Defaults to
            `0.0`.
        cell_output_dropout: float. Dropout of each layer's output, before the
            residual sum (inter-layer dropout when stacked plainly). Defaults
            to `0.0`.
        state_dropout: float. Variational dropout of the recurrent state, in
            the cells. Defaults to `0.0`.
        output_dropout: float. Dropout before the output layer (or of the
            Dual head's output). Defaults to `0.0`.
        dual: bool. Add the Dual head. Defaults to `False`.
        dual_units: int or None. Width of the Dual head; `None` is the
            embedding width when tied, else `units`. Defaults to `None`.
        dual_dropout: float. Dropout of the Dual head's inputs. Defaults to
            `0.0`.
        samples: int. Dropout samples D per sequence in training. Defaults to
            `1`.
        softmax_chunk_size: int or None. In training, compute the loss from
            the softmax features this many tokens at a time instead of
            returning logits (see above). `None` returns logits. Defaults to
            `None`.
        temperature: float. Softmax temperature τ (logits × τ at
            evaluation). Defaults to `1.0`.
        stateful: bool. Carry the recurrent state across calls. Defaults to
            `True`.
        batch_size: int or None. Number of streams the state has room for
            (per sample); `None` takes the batch size of the first call.
            Defaults to `None`.
        l2: float. L2 coefficient `c` of the penalty `c · Σ v²` over every
            trainable variable, biases included (as in the authors' code),
            added to the per-token mean loss. lamb's `l2_penalty` is
            `l2_penalty / (2T)` here (`keras_mogrifier.pipeline.units`).
            Defaults to `0.0`.
        drop_state_probability: float. In training, the carried state of each
            stream (and dropout sample) is zeroed with this probability at
            each call, every layer's `h` and `c` together, as lamb does
            (`drop_state_probability`, 0.01 in its released configurations);
            evaluation is untouched. Defaults to `0.0`.
        initializer: initializer or None. If set, used for every weight
            matrix, the embeddings and the biases of the gates, the Dual head
            and the softmax (e.g. `RandomUniform(-0.1, 0.1)`: Zaremba et al.
            draw every parameter, biases included, from it); the mogrifier's
            round biases stay at zero (its identity at initialisation) and
            `unit_forget_bias` / `chrono_t_max` still set the forget bias.
            `None` keeps each layer's default. Defaults to `None`.
        adaptation_units: int or None. For sparse dynamic evaluation: an
            adaptation matrix on this many units of the layer
            `adaptation_layer` (see `MogrifierLSTMCell`). Defaults to `None`.
        adaptation_streams: int or None. One adaptation matrix per stream.
            Defaults to `None`.
        adaptation_layer: int. Index of the layer with the adaptation matrix.
            Defaults to `-1` (the last).
        seed: int or None. Seed of the dropout masks. Defaults to `None`.
        **kwargs: base model keyword arguments, such as `name`.

    Example:

    >>> import numpy as np
    >>> model = LanguageModel(vocabulary_size=50, units=16, num_layers=2,
    ...                       cell="mogrifier_rlstm", mogrifier_rank=4)
    >>> tuple(model(np.zeros((3, 7), "int32")).shape)
    (3, 7, 50)

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2211.01848), Circling Back to
          Recurrent Models of Language, §3.
        - [Melis et al., 2020](https://arxiv.org/abs/1909.01792), Mogrifier
          LSTM.
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
        tie_embeddings=True,
        input_dropout=0.0,
        cell_output_dropout=0.0,
        state_dropout=0.0,
        output_dropout=0.0,
        dual=False,
        dual_units=None,
        dual_dropout=0.0,
        samples=1,
        softmax_chunk_size=None,
        temperature=1.0,
        stateful=True,
        batch_size=None,
        l2=0.0,
        drop_state_probability=0.0,
        initializer=None,
        adaptation_units=None,
        adaptation_streams=None,
        adaptation_layer=-1,
        seed=None,
        **kwargs,
    ):
        v = _validation
        vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
        units = v.positive_int("units", units)
        num_layers = v.positive_int("num_layers", num_layers)
        embedding_dim = v.optional_positive_int("embedding_dim", embedding_dim)
        cell = v.one_of("cell", cell, CELLS)
        mogrifier_rounds = v.non_negative_int("mogrifier_rounds", mogrifier_rounds)
        rates = {
            name: v.rate(name, value)
            for name, value in (
                ("input_dropout", input_dropout),
                ("cell_output_dropout", cell_output_dropout),
                ("state_dropout", state_dropout),
                ("output_dropout", output_dropout),
                ("dual_dropout", dual_dropout),
            )
        }
        dual_units = v.optional_positive_int("dual_units", dual_units)
        samples = v.positive_int("samples", samples)
        softmax_chunk_size = v.optional_positive_int(
            "softmax_chunk_size", softmax_chunk_size
        )
        temperature = v.positive_float("temperature", temperature)
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
        self.tie_embeddings = bool(tie_embeddings)
        self.input_dropout = rates["input_dropout"]
        self.cell_output_dropout = rates["cell_output_dropout"]
        self.state_dropout = rates["state_dropout"]
        self.output_dropout = rates["output_dropout"]
        self.dual = bool(dual)
        self.dual_units = dual_units
        self.dual_dropout = rates["dual_dropout"]
        self.samples = samples
        self.softmax_chunk_size = softmax_chunk_size
        self.temperature = temperature
        self.stateful = bool(stateful)
        self.batch_size = batch_size
        self.l2 = l2
        self.drop_state_probability = drop_state_probability
        self.initializer = (
            None if initializer is None else keras.initializers.get(initializer)
        )
        self.adaptation_units = adaptation_units
        self.adaptation_streams = adaptation_streams
        self.adaptation_layer = adaptation_layer
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

        width = embedding_dim or units
        regularizer = keras.regularizers.L2(l2) if l2 > 0 else None
        weight_init = {} if self.initializer is None else {
            "kernel_initializer": self.initializer,
            "recurrent_initializer": self.initializer,
            "bias_initializer": self.initializer,
        }

        self.embedding = keras.layers.Embedding(
            vocabulary_size,
            width,
            embeddings_initializer=self.initializer or "uniform",
            embeddings_regularizer=regularizer,
            name="embedding",
        )
        self.input_dropout_layer = keras.layers.Dropout(
            self.input_dropout, seed=seed, name="input_dropout"
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
                unit_forget_bias=unit_forget_bias,
                recurrent_dropout=self.state_dropout,
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
                CellRNN(
                    cell_class(units, **cell_kwargs),
                    return_sequences=True,
                    return_state=True,
                    name=f"recurrent_{layer}",
                )
            )
            self.cell_output_dropout_layers.append(
                keras.layers.Dropout(
                    self.cell_output_dropout,
                    seed=None if seed is None else seed + 100 + layer,
                    name=f"cell_output_dropout_{layer}",
                )
            )
        dense_init = {} if self.initializer is None else {
            "kernel_initializer": self.initializer,
            "bias_initializer": self.initializer,
        }
        if self.dual:
            self.dual_layer = DualOutput(
                dual_units or (width if self.tie_embeddings else units),
                dropout=self.dual_dropout,
                output_dropout=self.output_dropout,
                kernel_regularizer=regularizer,
                bias_regularizer=regularizer,
                seed=seed,
                name="dual_output",
                **dense_init,
            )
            head_width = self.dual_layer.units
        else:
            self.dual_layer = None
            head_width = units
        self.output_dropout_layer = keras.layers.Dropout(
            self.output_dropout, seed=seed, name="output_dropout"
        )
        self.projection = (
            keras.layers.Dense(
                width,
                use_bias=False,
                kernel_regularizer=regularizer,
                name="projection",
                **dense_init,
            )
            if self.tie_embeddings and head_width != width
            else None
        )
        self.output_layer = (
            None
            if self.tie_embeddings
            else keras.layers.Dense(
                vocabulary_size,
                kernel_regularizer=regularizer,
                bias_regularizer=regularizer,
                name="output",
                **dense_init,
            )
        )

    # === Build ===

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        if len(input_shape) != 2:
            raise ValueError(
                "Expected token ids of shape (batch, time). "
                f"Received: input_shape={input_shape}"
            )
        width = self.embedding.output_dim
        self.embedding.build(input_shape)
        size = width
        for rnn in self.recurrent_layers:
            rnn.build((None, None, size))
            size = self.units
        head = self.units
        if self.dual_layer is not None:
            self.dual_layer.build([(None, None, width), (None, None, self.units)])
            head = self.dual_layer.units
        if self.projection is not None:
            self.projection.build((None, None, head))
            head = width
        if self.softmax_chunk_size is not None and head == self.vocabulary_size:
            raise ValueError(
                "Expected the softmax input width to differ from "
                "`vocabulary_size` with `softmax_chunk_size` set (features "
                "and logits must be told apart); at this vocabulary size the "
                "logits are small: use softmax_chunk_size=None. Received: "
                f"width {head}, vocabulary_size={self.vocabulary_size}"
            )
        self.softmax_width = head
        if self.output_layer is not None:
            self.output_layer.build((None, None, head))
            self.output_bias = None
        else:
            self.output_bias = self.add_weight(
                shape=(self.vocabulary_size,),
                initializer=self.initializer or "zeros",
                regularizer=keras.regularizers.L2(self.l2) if self.l2 > 0 else None,
                name="output_bias",
            )
        self.temperature_variable = self.add_weight(
            shape=(),
            initializer=keras.initializers.Constant(self.temperature),
            trainable=False,
            name="temperature",
        )
        self.recurrent_state_variables = []
        if self.stateful:
            batch = self.batch_size or input_shape[0]
            if batch is None:
                raise ValueError(
                    "A stateful LanguageModel needs a known batch size: pass "
                    "`batch_size=` or build it on inputs with a static batch "
                    f"dimension. Received: input_shape={input_shape}"
                )
            self.state_capacity = batch * self.samples
            for layer in range(self.num_layers):
                for name in ("h", "c"):
                    self.recurrent_state_variables.append(
                        self.add_weight(
                            shape=(self.state_capacity, self.units),
                            initializer="zeros",
                            trainable=False,
                            name=f"state_{layer}_{name}",
                        )
                    )

    # === Forward pass ===

    def call(self, inputs, training=False, return_features=False):
        ids = ops.cast(inputs, "int32")
        multi_sample = bool(training) and self.samples > 1
        if multi_sample:
            batch = ops.shape(ids)[0]
            ids = ops.tile(ids, (self.samples, 1))
        embedded = self.embedding(ids)
        x = self.input_dropout_layer(embedded, training=training)
        rows = ops.shape(ids)[0]
        new_states = []
        outputs = []
        keep = None
        if self.stateful and bool(training) and self.drop_state_probability > 0:
            # One draw per stream (row), for every layer's h and c alike.
            keep = ops.cast(
                keras.random.uniform((rows, 1), seed=self.seed_generator)
                >= self.drop_state_probability,
                self.compute_dtype,
            )
        for layer, rnn in enumerate(self.recurrent_layers):
            initial_state = None
            if self.stateful:
                initial_state = [
                    self._read_state(v, rows)
                    for v in self.recurrent_state_variables[2 * layer : 2 * layer + 2]
                ]
                if keep is not None:
                    initial_state = [s * ops.cast(keep, s.dtype) for s in initial_state]
            h, h_last, c_last = rnn(x, initial_state=initial_state, training=training)
            new_states += [h_last, c_last]
            h = self.cell_output_dropout_layers[layer](h, training=training)
            outputs.append(h)
            x = _sum(outputs) if self.residual else h
        if self.stateful:
            for variable, state in zip(self.recurrent_state_variables, new_states):
                self._write_state(variable, state)
        if self.dual_layer is not None:
            x = self.dual_layer([embedded, x], training=training)
        else:
            x = self.output_dropout_layer(x, training=training)
        if self.projection is not None:
            x = self.projection(x)
        if bool(training) and self.softmax_chunk_size is not None:
            # The softmax runs chunk by chunk in `compute_loss`.
            return self._sample_axis(x, batch) if multi_sample else x
        logits = self._logits(x, training)
        if multi_sample:
            x = self._sample_axis(x, batch)
            logits = self._sample_axis(logits, batch)
        if return_features:
            return x, logits
        return logits

    def _logits(self, features, training):
        if self.output_layer is not None:
            logits = self.output_layer(features)
        else:
            table = ops.cast(self.embedding.embeddings, features.dtype)
            logits = ops.matmul(features, ops.transpose(table))
            logits = logits + ops.cast(self.output_bias, features.dtype)
        logits = ops.cast(logits, "float32")
        if not training:
            logits = logits * self.temperature_variable
        return logits

    def features_and_logits(self, inputs, training=False):
        """The softmax layer's input features and the logits of `inputs`.

        The features are the vectors the output layer reads (after the Dual
        head, output dropout and the tied-embedding projection), of width
        `softmax_width`; the logits are what `model(inputs)` returns
        (temperature applied at inference). The carried state advances as in
        an ordinary call. Used by `NeuralCache`, whose keys are these
        vectors.

        Returns:
            A tuple `(features, logits)`: `(batch, time, softmax_width)` and
            `(batch, time, vocabulary_size)` (with a sample axis after the
            batch axis when training with D > 1 samples).
        """
        return self(inputs, training=training, return_features=True)

    def _read_state(self, variable, rows):
        # The carried state enters the graph as a copy of the variable's
        # current value: the variable is written again at the end of the call
        # (in place on PyTorch, which must not touch a tensor that autograd
        # saved), and JAX traces values, never the variable itself.
        value = ops.convert_to_tensor(variable)
        return ops.copy(ops.slice(value, (0, 0), (rows, self.units)))

    def _write_state(self, variable, state):
        # Truncated BPTT: the carried state is a constant for the next window.
        state = ops.stop_gradient(ops.cast(state, variable.dtype))
        value = ops.convert_to_tensor(variable)
        variable.assign(ops.slice_update(value, (0, 0), state))

    def _sample_axis(self, x, batch):
        # Rows are copy-major (the ids were tiled): (D·B, ...) -> (B, D, ...).
        x = ops.reshape(x, (self.samples, batch) + tuple(ops.shape(x)[1:]))
        return ops.transpose(x, (1, 0, 2, 3))

    # === Chunked softmax ===

    def softmax_weights(self):
        """The softmax layer's `(kernel, bias)`: kernel `(width, vocab)`.

        With tied embeddings the kernel is the transposed embedding table.
        """
        if self.output_layer is not None:
            bias = self.output_layer.bias
            if bias is None:
                bias = ops.zeros((self.vocabulary_size,))
            return self.output_layer.kernel, bias
        return ops.transpose(self.embedding.embeddings), self.output_bias

    def target_log_probabilities(
        self, features, targets, chunk_size=None, temperature=1.0
    ):
        """Log-probability of every target, from the softmax features.

        `features` are what `model(x, training=True)` returns with
        `softmax_chunk_size` set: `(batch, samples, time, width)` (or
        `(batch, time, width)` for one sample). The logits
        `features @ kernel + bias` are computed `chunk_size` tokens at a time
        and never stored, in the forward or the backward pass (see
        `chunked_target_log_softmax`).

        Args:
            features: float tensor. The softmax layer's input.
            targets: int tensor `(batch, time)`. The target ids.
            chunk_size: int or None. Tokens per chunk; `None` is the model's
                `softmax_chunk_size` (or 1024 when that is unset).
            temperature: float. Softmax temperature τ: the logits are
                multiplied by it. Defaults to `1.0`.

        Returns:
            A float32 tensor, `features.shape[:-1]`: `log p(target)` of every
            token of every sample.
        """
        features = ops.convert_to_tensor(features)
        targets = ops.cast(targets, "int32")
        if len(features.shape) == len(targets.shape) + 2:
            targets = ops.broadcast_to(
                ops.expand_dims(targets, 1), ops.shape(features)[:-1]
            )
        elif len(features.shape) != len(targets.shape) + 1:
            raise ValueError(
                "Expected features of shape `(batch, [samples,] time, "
                "width)` for targets of shape `(batch, time)`. Received: "
                f"features.shape={tuple(features.shape)}, "
                f"targets.shape={tuple(targets.shape)}"
            )
        kernel, bias = self.softmax_weights()
        if temperature != 1.0:
            # logits × τ = features @ (τ·kernel) + τ·bias
            kernel = ops.cast(kernel, "float32") * temperature
            bias = ops.cast(bias, "float32") * temperature
        chunk_size = chunk_size or self.softmax_chunk_size or DEFAULT_CHUNK_SIZE
        return chunked_target_log_softmax(features, kernel, bias, targets, chunk_size)

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = self.loss
        if (
            isinstance(loss, IWAEDropoutLoss)
            and loss.samples not in (None, 1)
            and y_pred is not None
            and len(y_pred.shape) == 3
        ):
            # Evaluation (and Keras's symbolic build) computes one sample:
            # with dropout off the D copies would be identical, and the
            # loss of one sample is the ordinary cross-entropy.
            one_sample = IWAEDropoutLoss(
                name=loss.name, reduction=loss.reduction, dtype=loss.dtype
            )
            return self._add_regularization(one_sample(y, y_pred, sample_weight=sample_weight))
        if not (training and self.softmax_chunk_size is not None):
            return super().compute_loss(
                x, y, y_pred, sample_weight, training=training
            )
        if not isinstance(loss, IWAEDropoutLoss):
            raise ValueError(
                "Expected `compile(loss=IWAEDropoutLoss())` for a "
                "LanguageModel with `softmax_chunk_size` set (the chunked "
                "softmax computes that objective). Received: "
                f"loss={loss!r}"
            )
        if loss.samples is not None and loss.samples != self.samples:
            raise ValueError(
                f"Expected `y_pred` to have {loss.samples} samples on axis 1 "
                f"(IWAEDropoutLoss(samples={loss.samples})). Received: a "
                f"model with samples={self.samples}"
            )
        self._check_features(y_pred)
        log_prob = self.target_log_probabilities(y_pred, y)
        # The metrics need the same log-probabilities, which exist only here:
        # they are updated now (`compute_metrics` then only reports). On JAX
        # this is also the only place whose metric updates the trainer keeps
        # from inside the differentiated step.
        self._update_chunked_metrics(y, log_prob, sample_weight)
        objective = _LogMeanExpLoss(
            name=loss.name, reduction=loss.reduction, dtype=loss.dtype
        )
        if sample_weight is not None:
            # As IWAEDropoutLoss: per-sequence weights count once per token.
            ids = ops.convert_to_tensor(y)
            sample_weight = ops.convert_to_tensor(sample_weight, loss.dtype)
            while len(sample_weight.shape) < len(ids.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            sample_weight = ops.broadcast_to(sample_weight, ops.shape(ids))
        return self._add_regularization(
            objective(y, log_prob, sample_weight=sample_weight)
        )

    def _add_regularization(self, total):
        # What `Model.compute_loss` adds to the compiled loss: the layers'
        # losses (the L2 penalties).
        for extra in self.losses:
            total = total + ops.sum(ops.cast(extra, total.dtype))
        return total

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if self._is_chunked_features(y_pred):
            # Updated by `compute_loss`, which had the target probabilities.
            return self.get_metrics_result()
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def _is_chunked_features(self, y_pred):
        # Evaluation and `predict` return logits (vocabulary width), a chunked
        # training step the softmax features (a different width, see build).
        return (
            self.softmax_chunk_size is not None
            and self.built
            and y_pred.shape[-1] == self.softmax_width
        )

    def _update_chunked_metrics(self, y, log_prob, sample_weight):
        compiled = getattr(self, "_compile_metrics", None)
        if compiled is None:
            return
        # Two logits, "the target" and "anything else", carry the target's
        # probability exactly: log_softmax([lp, log(1 − e^lp)])[0] = lp.
        log_prob = ops.stop_gradient(log_prob)
        two_way = ops.stack([log_prob, _log1mexp(log_prob)], axis=-1)
        targets = ops.zeros_like(y)
        if not compiled.built:
            compiled.build(targets, two_way)
        for metric in compiled.metrics:
            if not isinstance(metric, TokenNLLMetric):
                raise ValueError(
                    "Expected training metrics of the target's probability "
                    "(`Perplexity`, `BitsPerCharacter`) with "
                    "`softmax_chunk_size` set: the logits are never formed. "
                    f"Received: metric {metric.name!r} "
                    f"({type(metric).__name__})"
                )
        compiled.update_state(targets, two_way, sample_weight)

    def _check_features(self, y_pred):
        if y_pred.shape[-1] != self.softmax_width:
            raise ValueError(
                "Expected the softmax features of a chunked training step, "
                f"last axis {self.softmax_width}, as `y_pred`. Received: "
                f"y_pred.shape={tuple(y_pred.shape)}"
            )

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, weighted_metrics=None, **kwargs):
        # A model loaded from `.keras` compiles from its serialized config.
        if isinstance(loss, dict):
            loss = keras.losses.deserialize(loss)
        if (
            isinstance(loss, IWAEDropoutLoss)
            and loss.samples is not None
            and loss.samples != self.samples
        ):
            raise ValueError(
                f"Expected `y_pred` to have {loss.samples} samples on axis 1 "
                f"(IWAEDropoutLoss(samples={loss.samples})), but the model "
                f"trains {self.samples} dropout sample(s) per sequence: use "
                f"IWAEDropoutLoss() or IWAEDropoutLoss(samples={self.samples}). "
                f"Received: a model with samples={self.samples}"
            )
        if self.softmax_chunk_size is not None:
            self._check_chunked_compile(loss, metrics, weighted_metrics)
        super().compile(
            optimizer=optimizer, loss=loss, metrics=metrics,
            weighted_metrics=weighted_metrics, **kwargs,
        )

    def compile_from_config(self, config):
        # As Keras's (which skips a subclass that overrides `compile`): the
        # checks above then run on a model loaded from `.keras` too.
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if getattr(self, "optimizer", None) is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    def _check_chunked_compile(self, loss, metrics, weighted_metrics):
        """What a chunked training step can compute, checked before any step.

        Its logits are never formed: the loss must be `IWAEDropoutLoss`,
        which the chunks compute, and the metrics must need only the
        target's probability.
        """
        if loss is not None and not isinstance(loss, IWAEDropoutLoss):
            raise ValueError(
                "Expected `compile(loss=IWAEDropoutLoss())` for a "
                "LanguageModel with `softmax_chunk_size` set (the chunked "
                f"softmax computes that objective). Received: loss={loss!r}"
            )
        for group in (metrics, weighted_metrics):
            for metric in keras.tree.flatten(group or []):
                if isinstance(metric, dict):
                    metric = keras.metrics.deserialize(metric)
                if not isinstance(metric, TokenNLLMetric):
                    raise ValueError(
                        "Expected training metrics of the target's "
                        "probability (`Perplexity()`, `BitsPerCharacter()` "
                        "objects) with `softmax_chunk_size` set: the logits "
                        f"are never formed. Received: metric {metric!r}"
                    )

    # === Recurrent state ===

    def reset_states(self):
        """Zeroes the carried recurrent state (every row)."""
        for variable in getattr(self, "recurrent_state_variables", []):
            variable.assign(ops.zeros(variable.shape, variable.dtype))

    def set_temperature(self, temperature):
        """Sets the softmax temperature τ used at evaluation."""
        temperature = _validation.positive_float("temperature", temperature)
        self.temperature = temperature
        if self.built:
            self.temperature_variable.assign(temperature)

    # === Training and evaluation entry points ===

    def fit(self, x=None, y=None, *args, callbacks=None, **kwargs):
        self._check_ids(x, "x")
        self._check_ids(y, "y")
        callbacks = list(callbacks or [])
        if self.stateful:
            callbacks.insert(0, _ResetStatesEachEpoch())
            # Windows must arrive in order for the state to be carried.
            kwargs.setdefault("shuffle", False)
        return super().fit(x, y, *args, callbacks=callbacks, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        self._check_ids(x, "x")
        self._check_ids(y, "y")
        # Evaluation starts from zero state and leaves the carried training
        # state as it found it, so evaluating mid-epoch (e.g. Two-Tailed
        # Averaging every E steps) does not disturb truncated BPTT.
        carried = list(getattr(self, "recurrent_state_variables", []))
        saved = [ops.copy(v) for v in carried]
        self.reset_states()
        try:
            return super().evaluate(x, y, *args, **kwargs)
        finally:
            for variable, value in zip(carried, saved):
                variable.assign(value)

    def predict(self, x, *args, **kwargs):
        self._check_ids(x, "x")
        return super().predict(x, *args, **kwargs)

    def _check_ids(self, data, name):
        if data is None or not isinstance(data, np.ndarray):
            return
        _validation.token_ids(name, data, self.vocabulary_size)

    # === Config ===

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "units": self.units,
                "num_layers": self.num_layers,
                "embedding_dim": self.embedding_dim,
                "cell": self.cell,
                "mogrifier_rounds": self.mogrifier_rounds,
                "mogrifier_rank": self.mogrifier_rank,
                "capped_input_gate": self.capped_input_gate,
                "chrono_t_max": self.chrono_t_max,
                "unit_forget_bias": self.unit_forget_bias,
                "residual": self.residual,
                "tie_embeddings": self.tie_embeddings,
                "input_dropout": self.input_dropout,
                "cell_output_dropout": self.cell_output_dropout,
                "state_dropout": self.state_dropout,
                "output_dropout": self.output_dropout,
                "dual": self.dual,
                "dual_units": self.dual_units,
                "dual_dropout": self.dual_dropout,
                "samples": self.samples,
                "softmax_chunk_size": self.softmax_chunk_size,
                "temperature": self.temperature,
                "stateful": self.stateful,
                "batch_size": self.batch_size,
                "l2": self.l2,
                "drop_state_probability": self.drop_state_probability,
                "initializer": (
                    None
                    if self.initializer is None
                    else keras.initializers.serialize(self.initializer)
                ),
                "adaptation_units": self.adaptation_units,
                "adaptation_streams": self.adaptation_streams,
                "adaptation_layer": self.adaptation_layer,
                "seed": self.seed,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def with_options(self, **overrides):
        """A new model of the same weights with some arguments changed.

        For instance `model.with_options(batch_size=1, samples=1)` for
        evaluation on one stream, or
        `model.with_options(adaptation_units=500)` for sparse dynamic
        evaluation (the adaptation matrix starts at zero). Weights are copied
        by name; the new model's recurrent state starts at zero.
        """
        config = self.get_config()
        config.update(overrides)
        for key in ("name", "trainable", "dtype"):
            config.pop(key, None)
        clone = self.__class__.from_config(config)
        batch = clone.batch_size
        if batch is None and clone.stateful:
            capacity = getattr(self, "state_capacity", None)
            batch = capacity // self.samples if capacity else 1
        clone.build((batch, None))
        if self.built:
            source = {_local_path(v): v for v in self.weights}
            for variable in clone.weights:
                key = _local_path(variable)
                if key.startswith("state_") or key not in source:
                    continue
                if tuple(source[key].shape) == tuple(variable.shape):
                    # A copy: on JAX, two variables must not share a buffer.
                    variable.assign(ops.copy(source[key]))
        return clone


def _local_path(variable):
    # Drop the model's own name, keep the path inside it.
    return variable.path.split("/", 1)[-1]


def _sum(tensors):
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total


def _log1mexp(x):
    """log(1 − eˣ) for x ≤ 0, accurate at both ends."""
    x = ops.minimum(x, 0.0)
    near_zero = ops.greater(x, -0.6931472)
    safe_near = ops.where(near_zero, x, -1.0)
    safe_far = ops.where(near_zero, -1.0, x)
    return ops.where(
        near_zero,
        ops.log(-ops.expm1(safe_near)),
        ops.log1p(-ops.exp(safe_far)),
    )


class _LogMeanExpLoss(keras.losses.Loss):
    """IWAEDropoutLoss from target log-probabilities instead of logits.

    `y_pred` is `log p_d(w_t)`, `(batch, samples, time)` or `(batch, time)`;
    the loss of a token is `−(logsumexp_d y_pred − ln D)`.
    """

    def call(self, y_true, y_pred):
        if len(y_pred.shape) == len(y_true.shape) + 1:
            samples = ops.cast(ops.shape(y_pred)[1], y_pred.dtype)
            y_pred = ops.logsumexp(y_pred, axis=1) - ops.log(samples)
        return ops.negative(y_pred)


class _ResetStatesEachEpoch(keras.callbacks.Callback):
    """Zeroes a stateful model's recurrent state at each epoch's start."""

    def on_epoch_begin(self, epoch, logs=None):
        self.model.reset_states()
