import json
import threading

import keras
import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier import generation
from keras_mogrifier._export import register
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.data.vocabulary import Vocabulary
from keras_mogrifier.layers.cell_rnn import CellRNN
from keras_mogrifier.layers.dual_output import DualOutput
from keras_mogrifier.layers.mixture_of_softmaxes import MixtureOfSoftmaxes
from keras_mogrifier.layers.mixture_of_softmaxes import check_components
from keras_mogrifier.layers.mogrifier_lstm_cell import MogrifierLSTMCell
from keras_mogrifier.layers.rlstm_cell import RLSTMCell
from keras_mogrifier.losses.chunked_log_softmax import chunked_target_log_softmax
from keras_mogrifier.losses.iwae_dropout_loss import IWAEDropoutLoss
from keras_mogrifier.metrics._token_nll_metric import TokenNLLMetric
from keras_mogrifier.models import _input_checks
from keras_mogrifier.models import _safe_calls

CELLS = ("lstm", "mogrifier_lstm", "rlstm", "mogrifier_rlstm")
DEFAULT_CHUNK_SIZE = 1024
# What `with_options` may change: none of these changes a trained weight.
WITH_OPTIONS = (
    "input_dropout", "cell_output_dropout", "state_dropout", "output_dropout",
    "dual_dropout", "dual_embedding_dropout", "dual_hidden_dropout",
    "mixture_dropout", "samples", "softmax_chunk_size", "temperature", "stateful",
    "batch_size", "l2", "drop_state_probability", "seed", "adaptation_units",
    "adaptation_streams", "adaptation_layer", "name",
)
# The key under which a saved model records the paths and shapes of its
# weights, checked on load (a config that does not match its weights).
_MANIFEST_KEY = "weights_manifest"
# The carried state a guarded training step read, for `compute_loss` (one
# per thread: MirroredStrategy traces its replicas in threads).
_STEP_STATES = threading.local()


class RNN(CellRNN):
    """`CellRNN` as `LanguageModel` holds its recurrent layers.

    The class name is what a `.keras` file sees: Keras stores the layers of
    a list under their class names in snake case, and models saved before
    `CellRNN` existed (with `keras.layers.RNN`) hold their recurrent layers
    at `layers/rnn`, `layers/rnn_1`, …; under this name the new layers are
    stored at the same paths, so those files load, and new files keep the
    layout. Not registered: `LanguageModel` builds these from its own config.
    """


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
    the cells. With `residual=False` the layers are plainly stacked: layer l
    reads `hˡ⁻¹ ⊙ M_cellˡ⁻¹` (`cell_output_dropout` is then inter-layer
    dropout, between layers only) and the output reads the last layer's
    `hᴸ ⊙ M_out`. With `residual=False, skip_connections=True`, the skip
    connections of the Mogrifier LSTM's released code (deepmind/lamb
    `skip_multi_rnn_cell.py`): layer l reads `hˡ⁻¹ ⊙ M_cellˡ⁻¹` and the
    output reads the undropped sum `(Σ_l hˡ) ⊙ M_out`. With `dual=True` the
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
        chrono_input_bias: bool. With `chrono_t_max`, also set every input
            bias to minus its forget bias (original Chrono); `False`: forget
            biases only (see the cells). Defaults to `True`.
        unit_forget_bias: bool. Forget biases initialised to 1 (when Chrono is
            off). Defaults to `True`.
        residual: bool. Residual connections (Circling Back §3) or, with
            `False`, plain stacking (or skip connections, see
            `skip_connections`). Defaults to `True`.
        skip_connections: bool. With `residual=False`, lamb's skip
            connections: the output reads the sum of every layer's undropped
            output, each layer l > 1 the dropped-out output of the layer
            below (deepmind/lamb `skip_multi_rnn_cell.py` 89-94, `cell.py`
            94-101: its `inter_layer_dropout` is `cell_output_dropout`
            here). With 2 layers this is the released Mogrifier LSTM's
            wiring; Circling Back's residual wiring differs in that the
            cell-output masks also multiply the summed outputs. Defaults to
            `False`.
        tie_embeddings: bool. Share the input and output embeddings (word
            level). Defaults to `True`.
        input_dropout: float. Dropout of the input embeddings. Defaults to
            `0.0`.
        cell_output_dropout: float. Dropout of each layer's output, before the
            residual sum; with `residual=False`, inter-layer dropout: only of
            the input of layers l > 1, never of the last layer's output
            (which only the output dropout hits). Defaults to `0.0`.
        state_dropout: float. Variational dropout of the recurrent state, in
            the cells. Defaults to `0.0`.
        output_dropout: float. Dropout before the output layer (or of the
            Dual head's output). Defaults to `0.0`.
        dual: bool. Add the Dual head. Defaults to `False`.
        dual_units: int or None. Width of the Dual head; `None` is the
            embedding width when tied, else `units`. Defaults to `None`.
        dual_dropout: float. Dropout of the Dual head's inputs, both paths
            (unless set apart below). Defaults to `0.0`.
        dual_embedding_dropout: float or None. Dropout of the embedding path
            into the Dual head (the Dual paper's "Dual input dropout");
            `None` is `dual_dropout`. Defaults to `None`.
        dual_hidden_dropout: float or None. Dropout of the recurrent path
            into the Dual head (the Dual paper's "Rec. output dropout", after
            the last recurrent layer); `None` is `dual_dropout`. Defaults to
            `None`.
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
        vocabulary: `keras_mogrifier.data.Vocabulary`, list of tokens or
            None. The tokens of the ids (`vocabulary_size` of them), kept in
            the config (and so in a `.keras` file): `generate` and `score`
            then read and write text. Defaults to `None`.
        mixture_of_softmaxes: int. `K`: with `K ≥ 1`, a mixture of `K`
            softmaxes (`MixtureOfSoftmaxes`, lamb's log-domain mixture) on the
            vectors the output layer would read, through the same output
            layer, and the model outputs normalised log-probabilities (τ
            multiplies each component's logits; no tied-embedding
            projection: the mixture's own maps to the embedding width). `1`
            is a `tanh` projection before one softmax. `0` is the single
            softmax. See docs/mixture-of-softmaxes.md. Defaults to `0`.
        mixture_dropout: float or None. In training, dropout of the
            mixture's contexts `c_k` (Yang et al.'s `dropoutl`), drawn per
            position. `None` follows the MoS reference code (zihangdai/mos
            `main.py` lines 49 and 87-88: `dropoutl` defaults to the
            inter-layer rate `dropouth`): `cell_output_dropout`. lamb's
            released Wikitext-2 configuration uses its output dropout here
            (the `wikitext2` preset sets it). Only with
            `mixture_of_softmaxes ≥ 1`. Defaults to `None`.
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
        skip_connections=False,
        chrono_input_bias=True,
        dual_embedding_dropout=None,
        dual_hidden_dropout=None,
        vocabulary=None,
        mixture_of_softmaxes=0,
        mixture_dropout=None,
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
        for name, value in (
            ("dual_embedding_dropout", dual_embedding_dropout),
            ("dual_hidden_dropout", dual_hidden_dropout),
        ):
            rates[name] = None if value is None else v.rate(name, value)
        if residual and skip_connections:
            raise ValueError(
                "Expected `skip_connections=True` with `residual=False` (skip "
                "connections replace the residual ones, as in lamb). "
                f"Received: residual={residual}, skip_connections=True"
            )
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
        vocabulary = _as_vocabulary(vocabulary, vocabulary_size)
        mixture_of_softmaxes = check_components(mixture_of_softmaxes)
        if mixture_dropout is not None:
            mixture_dropout = v.rate("mixture_dropout", mixture_dropout)
            if mixture_dropout > 0 and not mixture_of_softmaxes:
                raise ValueError(
                    "Expected `mixture_dropout` only with a mixture of "
                    "softmaxes (`mixture_of_softmaxes` ≥ 1). Received: "
                    f"mixture_dropout={mixture_dropout}, mixture_of_softmaxes=0"
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
        self.tie_embeddings = bool(tie_embeddings)
        self.input_dropout = rates["input_dropout"]
        self.cell_output_dropout = rates["cell_output_dropout"]
        self.state_dropout = rates["state_dropout"]
        self.output_dropout = rates["output_dropout"]
        self.dual = bool(dual)
        self.dual_units = dual_units
        self.dual_dropout = rates["dual_dropout"]
        self.dual_embedding_dropout = rates["dual_embedding_dropout"]
        self.dual_hidden_dropout = rates["dual_hidden_dropout"]
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
        self.vocabulary = vocabulary
        self.mixture_of_softmaxes = mixture_of_softmaxes
        self.mixture_dropout = mixture_dropout

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
                chrono_input_bias=self.chrono_input_bias,
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
                RNN(
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
                embedding_dropout=self.dual_embedding_dropout,
                hidden_dropout=self.dual_hidden_dropout,
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
            if self.tie_embeddings and head_width != width and not mixture_of_softmaxes
            else None
        )
        # With a mixture, its projection W_p maps the head's output straight
        # to K contexts of the output layer's width (lamb: no downprojection).
        self.mixture = (
            MixtureOfSoftmaxes(
                mixture_of_softmaxes,
                width if self.tie_embeddings else head_width,
                kernel_regularizer=regularizer,
                bias_regularizer=regularizer,
                dropout=self.effective_mixture_dropout,
                seed=None if seed is None else seed + 200,
                name="mixture_of_softmaxes",
                **dense_init,
            )
            if mixture_of_softmaxes
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
        if self.mixture is not None:
            self.mixture.build((None, None, head))
            head = self.mixture.context_units
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
                # (Before the state dropout: what the variable holds.)
                self._remember_step_state(initial_state, layer, training)
                if keep is not None:
                    initial_state = [s * ops.cast(keep, s.dtype) for s in initial_state]
            h, h_last, c_last = rnn(x, initial_state=initial_state, training=training)
            new_states += [h_last, c_last]
            dropout = self.cell_output_dropout_layers[layer]
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
        if self.mixture is not None:
            return self._mixture_log_probabilities(features, training)
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

    def _mixture_log_probabilities(self, features, training):
        # log Σ_k π_k softmax(τ z_k): τ multiplies each component's logits.
        contexts, log_weights = self.mixture(features, training=training)
        if self.output_layer is not None:
            logits = self.output_layer(contexts)
        else:
            table = ops.cast(self.embedding.embeddings, contexts.dtype)
            logits = ops.matmul(contexts, ops.transpose(table))
            logits = logits + ops.cast(self.output_bias, contexts.dtype)
        logits = ops.cast(logits, "float32")
        if not training:
            logits = logits * self.temperature_variable
        return self.mixture.mix(logits, log_weights)

    def features_and_logits(self, inputs, training=False):
        """The softmax layer's input features and the logits of `inputs`.

        The features are the vectors the output layer reads (after the Dual
        head, output dropout and the tied-embedding projection; with a
        mixture of softmaxes, the mixture's input), of width
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

    def _remember_step_state(self, initial_state, layer, training):
        # For `_guard_non_finite_step` (in `fit` only).
        if not (training is True and getattr(self, "_non_finite_guard", False)):
            return
        if layer == 0:
            _STEP_STATES.values = (id(self), [])
        _STEP_STATES.values[1].extend(initial_state)

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
        self, features, targets, chunk_size=None, temperature=1.0, training=False
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
            temperature: float, or a list / tuple of them. Softmax
                temperature τ: the logits are multiplied by it. With several,
                the result has a last axis of one entry per τ (the
                features, and a mixture's contexts, computed once). Defaults
                to `1.0`.
            training: bool. With a mixture of softmaxes, drop out its
                contexts (`mixture_dropout`), with the masks an unchunked
                training call draws. Defaults to `False`.

        Returns:
            A float32 tensor, `features.shape[:-1]` (plus one axis of
            temperatures for a sequence of them): `log p(target)` of every
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
        chunk_size = chunk_size or self.softmax_chunk_size or DEFAULT_CHUNK_SIZE
        several = isinstance(temperature, (list, tuple))
        temperatures = list(temperature) if several else [temperature]
        if self.mixture is not None:
            # The contexts (and their dropout masks) once, for every τ.
            contexts, log_weights = self._mixture_of_features(features, training)
        results = []
        for tau in temperatures:
            kernel, bias = self.softmax_weights()
            if tau != 1.0:
                # logits × τ = features @ (τ·kernel) + τ·bias
                kernel = ops.cast(kernel, "float32") * tau
                bias = ops.cast(bias, "float32") * tau
            if self.mixture is None:
                results.append(
                    chunked_target_log_softmax(features, kernel, bias, targets, chunk_size)
                )
                continue
            # One chunked target log-softmax per component (never a full
            # (tokens, vocab) block), then logsumexp_k(log π_k + log p_k).
            per_component = [
                chunked_target_log_softmax(
                    contexts[..., k, :], kernel, bias, targets, chunk_size
                )
                for k in range(self.mixture_of_softmaxes)
            ]
            results.append(
                ops.logsumexp(
                    ops.stack(per_component, axis=-1)
                    + ops.cast(log_weights, "float32"),
                    axis=-1,
                )
            )
        return ops.stack(results, axis=-1) if several else results[0]

    def _mixture_of_features(self, features, training):
        if not (training and len(features.shape) == 4):
            return self.mixture(features, training=training)
        # (B, D, T, W) → the copy-major rows (D·B, T, W) that `call` feeds
        # the mixture, so that its dropout masks are the same.
        shape = ops.shape(features)
        rows = ops.reshape(
            ops.transpose(features, (1, 0, 2, 3)), (-1, shape[2], shape[3])
        )
        contexts, log_weights = self.mixture(rows, training=training)
        contexts = ops.reshape(
            contexts, (shape[1], shape[0]) + tuple(ops.shape(contexts)[1:])
        )
        log_weights = ops.reshape(
            log_weights, (shape[1], shape[0]) + tuple(ops.shape(log_weights)[1:])
        )
        return (
            ops.transpose(contexts, (1, 0, 2, 3, 4)),
            ops.transpose(log_weights, (1, 0, 2, 3)),
        )

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = self._objective(x, y, y_pred, sample_weight, training)
        if training and getattr(self, "_non_finite_guard", False):
            loss = self._guard_non_finite_step(loss)
        return loss

    def _guard_non_finite_step(self, loss):
        """A training step whose loss is not finite changes nothing (`fit`).

        Its change of the carried state is undone here, and every gradient
        is made non-finite with the loss (× exactly 1 when it is finite),
        so that the optimizer, patched for `fit`, skips the update.
        """
        finite = ops.all(ops.isfinite(loss))
        remembered = getattr(_STEP_STATES, "values", None)
        _STEP_STATES.values = None
        if remembered is not None and remembered[0] == id(self):
            for variable, before in zip(self.recurrent_state_variables, remembered[1]):
                value = ops.convert_to_tensor(variable)
                after = ops.slice(value, (0, 0), (ops.shape(before)[0], self.units))
                kept = ops.where(finite, after, before)
                variable.assign(ops.slice_update(value, (0, 0), kept))
        return loss * (1.0 + ops.stop_gradient(0.0 * loss))

    def _objective(self, x, y, y_pred, sample_weight, training):
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
        log_prob = self.target_log_probabilities(y_pred, y, training=True)
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

    # === Saving ===

    def _weights_manifest(self):
        """`[[path, shape], ...]` of every weight but the carried state."""
        states = {id(v) for v in getattr(self, "recurrent_state_variables", [])}
        return sorted(
            [_local_path(v), [int(d) for d in v.shape]]
            for v in self.weights
            if id(v) not in states
        )

    def save_own_variables(self, store):
        super().save_own_variables(store)
        # The weights this config makes, so that loading them into a model
        # of another config is refused rather than half done.
        store[_MANIFEST_KEY] = np.frombuffer(
            json.dumps(self._weights_manifest()).encode("utf-8"), dtype=np.uint8
        )

    def load_weights(self, filepath, *args, **kwargs):
        # Keras goes on loading the other layers after one fails and raises
        # at the end: the model's weights (and state) are put back then.
        saved = [ops.copy(v.value) for v in self.variables]
        try:
            return super().load_weights(filepath, *args, **kwargs)
        except BaseException:
            for variable, value in zip(self.variables, saved):
                variable.assign(value)
            raise

    def load_own_variables(self, store):
        # Runs before any sub-layer is loaded: a refusal changes nothing.
        keys = list(store.keys())
        if _MANIFEST_KEY in keys:
            saved = json.loads(
                bytes(np.asarray(store[_MANIFEST_KEY], dtype=np.uint8)).decode("utf-8")
            )
            mine = self._weights_manifest()
            if saved != mine:
                saved_shapes = {path: shape for path, shape in saved}
                my_shapes = {path: shape for path, shape in mine}
                missing = sorted(set(saved_shapes) - set(my_shapes))
                extra = sorted(set(my_shapes) - set(saved_shapes))
                reshaped = sorted(
                    f"{p} {saved_shapes[p]} → {my_shapes[p]}"
                    for p in set(saved_shapes) & set(my_shapes)
                    if saved_shapes[p] != my_shapes[p]
                )
                raise ValueError(
                    "Expected the saved weights to be those of this model's "
                    "configuration (was the config edited, or the weights "
                    "saved from another model?). Received: weights this "
                    f"config has no place for: {missing[:8]}; weights it "
                    f"needs that were not saved: {extra[:8]}; other shapes: "
                    f"{reshaped[:8]}"
                )
            store = {key: store[key] for key in keys if key != _MANIFEST_KEY}
        super().load_own_variables(store)

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

    def fit(
        self, x=None, y=None, *args, callbacks=None, stop_on_non_finite=True,
        **kwargs,
    ):
        """Trains the model: `keras.Model.fit`, with what it is given checked.

        Everything given is checked before anything changes (token ids,
        shapes, sample weights, batch sizes against the carried state, and
        `shuffle`, which a stateful model refuses); data that comes batch by
        batch is checked on the host as each batch is fetched, before its
        update. A stateful model resets its carried state at the start of
        every epoch.

        A step whose loss (or a gradient) is NaN or infinite is not applied
        and does not move the carried state; with `stop_on_non_finite=True`
        (the default) training then stops with a `NonFiniteLossError`,
        leaving the model at its last finite step, unless a
        `DivergenceRecovery` among the callbacks restarts it from a
        checkpoint. With `stop_on_non_finite=False` nothing of this is done
        (Keras's behaviour: the weights become non-finite). If `fit` fails
        before its first step has completed (an error, an interrupt), every
        weight and optimizer variable is put back as it was. See
        docs/guarantees.md.

        Args:
            x, y, *args, callbacks, **kwargs: as `keras.Model.fit`.
            stop_on_non_finite: bool. See above. Defaults to `True`.
        """
        if not isinstance(stop_on_non_finite, bool):
            raise ValueError(
                "Expected `stop_on_non_finite` to be a bool. Received: "
                f"stop_on_non_finite={stop_on_non_finite!r}"
            )
        arguments = _input_checks.bind(keras.Model.fit, x, y, *args, **kwargs)
        callbacks = list(arguments.pop("callbacks", None) or callbacks or [])
        if self.stateful and arguments.get("shuffle", False):
            raise ValueError(
                "Expected `shuffle=False` for a stateful LanguageModel: it "
                "carries the recurrent state from one batch to the next, so "
                "the windows of each stream must arrive in order (truncated "
                "backpropagation through time); shuffled, each window would "
                "start from another window's state. Use stateful=False to "
                f"train on shuffled independent sequences. Received: "
                f"shuffle={arguments['shuffle']!r}"
            )
        batch_size = arguments.get("batch_size")
        arguments["x"], check = _input_checks.prepare(
            self, arguments.get("x"), arguments.get("y"),
            arguments.get("sample_weight"), batch_size, training=True,
            targets=True, role="training data",
        )
        validation, validation_check = _input_checks.prepare_validation_data(
            self, arguments.get("validation_data"),
            arguments.get("validation_batch_size") or batch_size,
        )
        if validation is not None:
            arguments["validation_data"] = validation
        if self.stateful:
            callbacks.insert(0, _ResetStatesEachEpoch())
            # Windows must arrive in order for the state to be carried.
            arguments.setdefault("shuffle", False)
        self._build_before_fit(arguments.get("x"), batch_size)
        with _safe_calls.guarded_fit(
            self, callbacks, stop_on_non_finite, [check, validation_check]
        ) as callbacks:
            return super().fit(callbacks=callbacks, **arguments)

    def _build_before_fit(self, x, batch_size):
        """Builds the model from its first batch before `fit` calls any callback.

        Keras's TensorFlow trainer builds a model only when it traces the
        first step, after `on_train_begin`; JAX's and PyTorch's build it
        before. Built here, every callback (`DivergenceRecovery`'s first
        checkpoint, an optimizer it builds) sees all the weights on every
        backend, and `fit`'s own snapshot covers them too.
        """
        if self.built:
            return
        rows = self.batch_size
        if rows is None and self.stateful:
            rows = _input_checks.first_batch_rows(x, batch_size)
            if rows is None:
                return  # the trainer builds it from the batches it reads
        self.build((rows, None))

    def evaluate(self, x=None, y=None, *args, **kwargs):
        arguments = _input_checks.bind(keras.Model.evaluate, x, y, *args, **kwargs)
        check = None
        if not arguments.get("_use_cached_eval_dataset", False):
            # (Inside `fit`, the validation data was checked by `fit`.)
            arguments["x"], check = _input_checks.prepare(
                self, arguments.get("x"), arguments.get("y"),
                arguments.get("sample_weight"), arguments.get("batch_size"),
                training=False, targets=True, role="data",
            )
        # Evaluation starts from zero state and leaves the carried training
        # state as it found it, so evaluating mid-epoch (e.g. Two-Tailed
        # Averaging every E steps) does not disturb truncated BPTT.
        carried = list(getattr(self, "recurrent_state_variables", []))
        saved = [ops.copy(v) for v in carried]
        self.reset_states()
        try:
            with _safe_calls.guarded_call(self, [check]):
                return super().evaluate(**arguments)
        finally:
            for variable, value in zip(carried, saved):
                variable.assign(value)

    def predict(self, x, *args, **kwargs):
        arguments = _input_checks.bind(keras.Model.predict, x, *args, **kwargs)
        arguments["x"], check = _input_checks.prepare(
            self, arguments.get("x"), None, None, arguments.get("batch_size"),
            training=False, targets=False, role="data",
        )
        # The carried state moves on with the windows predicted; if `predict`
        # fails, it is put back.
        carried = list(getattr(self, "recurrent_state_variables", []))
        with _safe_calls.guarded_call(self, [check], carried):
            return super().predict(**arguments)

    def __call__(self, *args, **kwargs):
        inputs = args[0] if args else kwargs.get("inputs")
        training = kwargs.get("training", args[1] if len(args) > 1 else None)
        self._check_call_inputs(inputs, training is True)
        return super().__call__(*args, **kwargs)

    def _check_call_inputs(self, inputs, training):
        """Shapes always (statically); ids when the call is eager.

        Ids given to `fit`, `evaluate`, `predict` and the evaluation helpers
        were checked there (`_validation.ids_checked`).
        """
        if isinstance(inputs, (list, tuple)):
            inputs = self.check_token_ids(inputs, "inputs")
        shape = getattr(inputs, "shape", None)
        if shape is None:
            return
        try:
            shape = tuple(shape)
        except ValueError:  # TensorFlow: unknown rank
            return
        if len(shape) != 2:
            raise ValueError(
                "Expected token ids of shape (batch, time). "
                f"Received: inputs.shape={shape}"
            )
        rows = shape[0] if isinstance(shape[0], int) else None
        _input_checks.check_rows(self, rows, training, f"inputs.shape={shape}")
        if isinstance(inputs, keras.KerasTensor) or _validation.in_ids_checked():
            return
        if _input_checks.is_host_array(inputs) or get_backend_module().is_concrete(inputs):
            self.check_token_ids(inputs, "inputs")

    def check_token_ids(self, ids, name="ids", ndim=2):
        """Checks token ids for this model; returns them as a NumPy array.

        The one check every entry point uses: integer dtype, rank `ndim`
        and every id in `[0, vocabulary_size)`. Accepts NumPy arrays, lists
        and tensors of any backend (copied to the host).

        Args:
            ids: the token ids.
            name: str. Their name in the error message. Defaults to `"ids"`.
            ndim: int, tuple of int or None. Allowed ranks. Defaults to `2`
                (`(batch, time)`).

        Returns:
            The ids as a NumPy array.

        Raises:
            ValueError: saying what was expected and what was received.
        """
        return _validation.token_ids(name, ids, self.vocabulary_size, ndim=ndim)

    # === Generation and scoring ===

    def generate(
        self,
        prompts,
        max_length,
        sampler="greedy",
        *,
        k=None,
        p=None,
        num_beams=None,
        temperature=None,
        seed=None,
        stop_token_ids="auto",
        vocabulary=None,
        jit_compile="auto",
    ):
        """Continues prompts: one compiled step per new token.

        Strings are read and written with the model's `vocabulary` (or
        `vocabulary=`); ids give ids. The samplers are keras-hub's
        (`"greedy"`, `"top_k"` with `k`, `"top_p"` with `p`, `"random"`,
        `"beam"` with `num_beams`, each with `temperature`, or a
        `keras_mogrifier.samplers.Sampler`).
        `max_length` counts the prompt too. See
        `keras_mogrifier.generation.generate` for every argument.

        Example:

        >>> from keras_mogrifier.data import Vocabulary
        >>> vocab = Vocabulary("the cat sat <eos>".split())
        >>> model = LanguageModel(4, units=8, num_layers=1, batch_size=2,
        ...                       vocabulary=vocab)
        >>> model.build((2, None))
        >>> len(model.generate("the cat", max_length=6, stop_token_ids=None).split())
        6
        """
        return generation.generate(
            self, prompts, max_length, sampler, k=k, p=p, num_beams=num_beams,
            temperature=temperature, seed=seed, stop_token_ids=stop_token_ids,
            vocabulary=vocabulary, jit_compile=jit_compile,
        )

    def score(self, texts, *, vocabulary=None, jit_compile="auto"):
        """Log-probabilities and perplexity of each text, as `evaluate` gives.

        The first token of a text is context only. Returns a dict per text
        (`log_probability`, `num_tokens`, `perplexity`,
        `token_log_probabilities`, `tokens`); see
        `keras_mogrifier.generation.score`.
        """
        return generation.score(
            self, texts, vocabulary=vocabulary, jit_compile=jit_compile
        )

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
                "skip_connections": self.skip_connections,
                "chrono_input_bias": self.chrono_input_bias,
                "tie_embeddings": self.tie_embeddings,
                "input_dropout": self.input_dropout,
                "cell_output_dropout": self.cell_output_dropout,
                "state_dropout": self.state_dropout,
                "output_dropout": self.output_dropout,
                "dual": self.dual,
                "dual_units": self.dual_units,
                "dual_dropout": self.dual_dropout,
                "dual_embedding_dropout": self.dual_embedding_dropout,
                "dual_hidden_dropout": self.dual_hidden_dropout,
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
                "vocabulary": (
                    None if self.vocabulary is None else self.vocabulary.get_config()
                ),
                "mixture_of_softmaxes": self.mixture_of_softmaxes,
                "mixture_dropout": self.mixture_dropout,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("mixture_of_softmaxes") and "mixture_dropout" not in config:
            # Saved before the option: trained without it, and kept so.
            config["mixture_dropout"] = 0.0
        return cls(**config)

    @property
    def effective_mixture_dropout(self):
        """The dropout rate of the mixture's contexts (0 without a mixture)."""
        if not self.mixture_of_softmaxes:
            return 0.0
        if self.mixture_dropout is None:
            return self.cell_output_dropout
        return self.mixture_dropout

    def with_options(self, **overrides):
        """A new model of the same weights with some arguments changed.

        For instance `model.with_options(batch_size=1, samples=1)` for
        evaluation on one stream, or
        `model.with_options(adaptation_units=500)` for sparse dynamic
        evaluation (the adaptation matrix starts at zero). Weights are copied
        by name; the new model's recurrent state starts at zero.

        Only arguments that change no trained weight may be overridden:
        the dropout rates (the Dual head's and the mixture's included),
        `samples`, `softmax_chunk_size`, `temperature`, `stateful`,
        `batch_size`, `l2`, `drop_state_probability`, `seed`, the
        `adaptation_*` arguments and `name` (see `WITH_OPTIONS`). Others (`units`,
        `num_layers`, `vocabulary_size`, `embedding_dim`, `cell`,
        `mogrifier_rounds`, `mogrifier_rank`, `dual`, ...) would make a
        model of other weights: build a new `LanguageModel` for that.

        Raises:
            ValueError: for an argument not in `WITH_OPTIONS`.
        """
        refused = sorted(set(overrides) - set(WITH_OPTIONS))
        if refused:
            shown = ", ".join(f"{k}={overrides[k]!r}" for k in refused)
            raise ValueError(
                "Expected `with_options` to override only arguments that "
                f"keep every trained weight: {sorted(WITH_OPTIONS)}; build a "
                "new LanguageModel to change the architecture. Received: "
                f"{shown}"
            )
        config = self.get_config()
        for key in ("name", "trainable", "dtype"):
            config.pop(key, None)
        config.update(overrides)
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
                if key == "temperature" and "temperature" in overrides:
                    continue  # the new value, set by the constructor
                if tuple(source[key].shape) == tuple(variable.shape):
                    # A copy: on JAX, two variables must not share a buffer.
                    variable.assign(ops.copy(source[key]))
        return clone


def _as_vocabulary(vocabulary, vocabulary_size):
    """`vocabulary` (a Vocabulary, its config or a token list) as a Vocabulary."""
    if vocabulary is None or isinstance(vocabulary, Vocabulary):
        pass
    elif isinstance(vocabulary, dict):
        vocabulary = Vocabulary.from_config(vocabulary)
    elif isinstance(vocabulary, (list, tuple)):
        vocabulary = Vocabulary(vocabulary)
    else:
        raise ValueError(
            "Expected `vocabulary` to be a `keras_mogrifier.data.Vocabulary`, "
            f"a list of tokens or None. Received: {type(vocabulary).__name__}"
        )
    if vocabulary is not None and len(vocabulary) != vocabulary_size:
        raise ValueError(
            f"Expected a vocabulary of `vocabulary_size` = {vocabulary_size} "
            f"tokens. Received: a vocabulary of {len(vocabulary)} tokens"
        )
    return vocabulary


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
