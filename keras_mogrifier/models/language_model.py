import inspect

import keras
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier import generation
from keras_mogrifier import samplers
from keras_mogrifier._export import register
from keras_mogrifier.layers.language_model_head import DEFAULT_CHUNK_SIZE
from keras_mogrifier.layers.language_model_head import LanguageModelHead
from keras_mogrifier.layers.mixture_of_softmaxes import check_components
from keras_mogrifier.models import _composition
from keras_mogrifier.models import _input_checks
from keras_mogrifier.models._config import WITH_OPTIONS  # noqa: F401
from keras_mogrifier.models._config import ConfigMixin
from keras_mogrifier.models._config import as_vocabulary
from keras_mogrifier.models._entry_points import EntryPointsMixin
from keras_mogrifier.models._objective import ObjectiveMixin
from keras_mogrifier.models._saving import SavingMixin
from keras_mogrifier.models.recurrent_backbone import BACKBONE_ARGUMENTS
from keras_mogrifier.models.recurrent_backbone import CELLS  # noqa: F401
from keras_mogrifier.models.recurrent_backbone import RNN  # noqa: F401
from keras_mogrifier.models.recurrent_backbone import RecurrentBackbone


@register
class LanguageModel(
    ObjectiveMixin, EntryPointsMixin, SavingMixin, ConfigMixin, keras.Model
):
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
        backbone: `RecurrentBackbone` or None. With `head`, the model is
            made of these parts (see docs/architecture.md): the
            architecture arguments above must then be left at their
            defaults; `samples`, `softmax_chunk_size` and `vocabulary` are
            the task's. `None`: the flat arguments build both parts.
            Defaults to `None`.
        head: `LanguageModelHead` or None. Its `units` must be the
            backbone's, its `embedding_dim` the backbone's embedding width;
            a tied head reads the backbone's embedding. Defaults to `None`.
        **kwargs: base model keyword arguments, such as `name`.

    The model is a task on two parts, as keras-hub's causal LMs are: a
    `RecurrentBackbone` (`model.backbone`: the embedding, the recurrent
    stack, its dropouts and the carried state) and a `LanguageModelHead`
    (`model.head`: the Dual head, output dropout, projection, mixture,
    softmax and temperature). The model adds the D samples, the objective,
    the checks of every entry point, `generate`, `score` and
    `call_with_cache`.

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
        vocabulary_size=None,
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
        backbone=None,
        head=None,
        **kwargs,
    ):
        arguments = dict(locals())
        samples = _validation.positive_int("samples", samples)
        softmax_chunk_size = _validation.optional_positive_int(
            "softmax_chunk_size", softmax_chunk_size
        )
        composed = backbone is not None or head is not None
        if composed:
            defaults = {
                name: parameter.default
                for name, parameter in inspect.signature(LanguageModel.__init__).parameters.items()
            }
            _composition.check_parts(backbone, head, arguments, defaults)
            vocabulary_size = backbone.vocabulary_size
        else:
            vocabulary_size = _validation.positive_int("vocabulary_size", vocabulary_size)
            mixture_of_softmaxes = check_components(mixture_of_softmaxes)
            if mixture_dropout is not None:
                mixture_dropout = _validation.rate("mixture_dropout", mixture_dropout)
                if mixture_dropout > 0 and not mixture_of_softmaxes:
                    raise ValueError(
                        "Expected `mixture_dropout` only with a mixture of "
                        "softmaxes (`mixture_of_softmaxes` ≥ 1). Received: "
                        f"mixture_dropout={mixture_dropout}, mixture_of_softmaxes=0"
                    )
        vocabulary = as_vocabulary(vocabulary, vocabulary_size)
        super().__init__(**kwargs)
        self.samples = samples
        self.softmax_chunk_size = softmax_chunk_size
        self.vocabulary = vocabulary
        self._composed = composed
        if not composed:
            # The parts, in the order the layers (and their seeds) always
            # were created in; one initializer object for both, as before.
            if initializer is not None:
                initializer = keras.initializers.get(initializer)
                arguments["initializer"] = initializer
            backbone = RecurrentBackbone(
                **{name: arguments[name] for name in BACKBONE_ARGUMENTS},
                name="recurrent_backbone",
            )
            self.mixture_dropout = mixture_dropout
            rate = (
                0.0 if not mixture_of_softmaxes
                else backbone.cell_output_dropout if mixture_dropout is None
                else mixture_dropout
            )
            head = LanguageModelHead(
                vocabulary_size,
                backbone.units,
                embedding_dim=embedding_dim,
                embedding=backbone.embedding if tie_embeddings else None,
                tie_embeddings=tie_embeddings,
                output_dropout=output_dropout,
                dual=dual,
                dual_units=dual_units,
                dual_dropout=dual_dropout,
                dual_embedding_dropout=dual_embedding_dropout,
                dual_hidden_dropout=dual_hidden_dropout,
                mixture_of_softmaxes=mixture_of_softmaxes,
                mixture_dropout=rate,
                temperature=temperature,
                l2=l2,
                initializer=initializer,
                seed=seed,
                name="language_model_head",
            )
        else:
            self.mixture_dropout = head.mixture_dropout
        # Kept apart from Keras's tracking (and saving): the model tracks
        # the parts' layers under the names files have always stored them.
        self._parts = _composition.Parts(backbone, head)
        for name in BACKBONE_ARGUMENTS:
            setattr(self, name, getattr(backbone, name))
        for name in _composition.HEAD_ATTRIBUTES:
            setattr(self, name, getattr(head, name))
        self.seed_generator = backbone.seed_generator
        self.embedding = backbone.embedding
        self.input_dropout_layer = backbone.input_dropout_layer
        self.recurrent_layers = []
        self.cell_output_dropout_layers = []
        for rnn, dropout in zip(
            backbone.recurrent_layers, backbone.cell_output_dropout_layers
        ):
            # Tracked in this order, as they always were (`model.layers`).
            self.recurrent_layers.append(rnn)
            self.cell_output_dropout_layers.append(dropout)
        self.dual_layer = head.dual_layer
        self.output_dropout_layer = head.output_dropout_layer
        self.projection = head.projection
        self.mixture = head.mixture
        self.output_layer = head.output_layer

    @property
    def backbone(self):
        """The `RecurrentBackbone`: token ids to features, carried state."""
        return self._parts.backbone

    @property
    def head(self):
        """The `LanguageModelHead`: features to logits."""
        return self._parts.head

    def __dir__(self):
        # Keras saves what `dir` lists: the parts' layers are saved under the
        # model's own attributes (the layout of every saved file), not again
        # under `backbone` / `head`.
        return [name for name in super().__dir__() if name not in ("backbone", "head")]

    # === Build ===

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        if len(input_shape) != 2:
            raise ValueError(
                "Expected token ids of shape (batch, time). "
                f"Received: input_shape={input_shape}"
            )
        backbone, head = self.backbone, self.head
        batch = self.batch_size or input_shape[0]
        if self.stateful and batch is None:
            raise ValueError(
                "A stateful LanguageModel needs a known batch size: pass "
                "`batch_size=` or build it on inputs with a static batch "
                f"dimension. Received: input_shape={input_shape}"
            )
        # Built here, in this model's name scope: the weights keep the paths
        # (and the order) of files saved before the parts existed.
        if not backbone.built:
            backbone._build_layers(
                input_shape, None if batch is None else batch * self.samples
            )
        if not head.built:
            head._build_layers((None, None, self.units))
        if self.softmax_chunk_size is not None and head.softmax_width == self.vocabulary_size:
            raise ValueError(
                "Expected the softmax input width to differ from "
                "`vocabulary_size` with `softmax_chunk_size` set (features "
                "and logits must be told apart); at this vocabulary size the "
                "logits are small: use softmax_chunk_size=None. Received: "
                f"width {head.softmax_width}, vocabulary_size={self.vocabulary_size}"
            )
        self.softmax_width = head.softmax_width
        self.output_bias = head.output_bias
        self.temperature_variable = head.temperature_variable
        states = getattr(backbone, "recurrent_state_variables", None)
        if states is None:
            states = backbone._build_state()
        self.recurrent_state_variables = list(states)
        if self.stateful:
            self.state_capacity = backbone.state_capacity

    # === Forward pass ===

    def call(self, inputs, training=False, return_features=False):
        ids = ops.cast(inputs, "int32")
        multi_sample = bool(training) and self.samples > 1
        if multi_sample:
            batch = ops.shape(ids)[0]
            ids = ops.tile(ids, (self.samples, 1))
        x, embedded = self.backbone.call(
            ids, training=training, return_embedded=True,
            state_observer=self._remember_step_state,
        )
        x = self.head.softmax_features(x, embedded, training=training)
        if bool(training) and self.softmax_chunk_size is not None:
            # The softmax runs chunk by chunk in `compute_loss`.
            return self._sample_axis(x, batch) if multi_sample else x
        logits = self.head.logits(x, training)
        if multi_sample:
            x = self._sample_axis(x, batch)
            logits = self._sample_axis(logits, batch)
        if return_features:
            return x, logits
        return logits

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

    def _sample_axis(self, x, batch):
        # Rows are copy-major (the ids were tiled): (D·B, ...) -> (B, D, ...).
        x = ops.reshape(x, (self.samples, batch) + tuple(ops.shape(x)[1:]))
        return ops.transpose(x, (1, 0, 2, 3))

    def call_with_cache(self, token_ids, cache=None, cache_update_index=None):
        """One step of generation from a given recurrent state (the cache).

        keras-hub's causal LMs keep their attention keys and values in a
        `cache`; a recurrent model's cache is its state: `h` and `c` of
        every layer, `2 · num_layers` tensors `(batch, units)`. Seed it with
        one call over the prompt (`cache=None` starts from zeros), then
        feed one token at a time. Nothing is carried: the model's
        `recurrent_state_variables` are neither read nor written, and the
        call runs at inference (no dropout, temperature applied).

        Args:
            token_ids: int tensor `(batch, time)`.
            cache: list of `2 · num_layers` tensors, or None for zeros.
            cache_update_index: ignored (a recurrent state already sums up
                every position before); accepted for keras-hub's signature.

        Returns:
            `(logits, features, cache)`: logits `(batch, time,
            vocabulary_size)`, the softmax features `(batch, time,
            softmax_width)` (keras-hub's "hidden states") and the state after
            the last token.

        Raises:
            ValueError: before anything runs, for ids that are not an integer
                `(batch, time)` array, ids outside `[0, vocabulary_size)`,
                and a cache that is not a list of `2 · num_layers` floating
                tensors `(batch, units)` with the rows of the ids. The
                checks of `model(ids)`, with one difference: the ids'
                values are read only where they are concrete (host arrays,
                eager tensors: every call on PyTorch, TensorFlow outside a
                `tf.function`, JAX outside `jax.jit`). Inside a compiled
                loop (keras-hub's sampler on JAX runs a traced
                `lax.while_loop`) only their dtype and shape, and the cache,
                are checked: check the prompts before the loop with
                `model.check_token_ids(prompts)`.

        Example:

        >>> import numpy as np
        >>> model = LanguageModel(20, units=8, num_layers=1, batch_size=2)
        >>> logits, _, cache = model.call_with_cache(np.ones((2, 4), "int32"))
        >>> logits, _, cache = model.call_with_cache(np.ones((2, 1), "int32"), cache)
        >>> tuple(logits.shape), len(cache)
        ((2, 1, 20), 2)
        """
        del cache_update_index
        token_ids = _input_checks.check_cache_call(self, token_ids, cache)
        if not self.built:
            self.build((ops.shape(token_ids)[0] if self.stateful else None, None))
        x, embedded, cache = self.backbone.call_with_state(token_ids, cache)
        features = self.head.softmax_features(x, embedded, training=False)
        return self.head.logits(features, training=False), features, cache

    # What the evaluation helpers and backends call, forwarded to the parts.

    def _read_state(self, variable, rows):
        return self.backbone.read_state(variable, rows)

    def _write_state(self, variable, state):
        self.backbone.write_state(variable, state)

    def _logits(self, features, training):
        return self.head.logits(features, training)

    _mixture_log_probabilities = _logits

    def _mixture_of_features(self, features, training):
        return self.head._mixture_of_features(features, training)

    # === Chunked softmax ===

    def softmax_weights(self):
        """The softmax layer's `(kernel, bias)`: kernel `(width, vocab)`.

        With tied embeddings the kernel is the transposed embedding table.
        """
        return self.head.softmax_weights()

    def target_log_probabilities(
        self, features, targets, chunk_size=None, temperature=1.0, training=False
    ):
        """Log-probability of every target, from the softmax features.

        `features` are what `model(x, training=True)` returns with
        `softmax_chunk_size` set: `(batch, samples, time, width)` (or
        `(batch, time, width)` for one sample); see
        `LanguageModelHead.target_log_probabilities` for every argument.
        `chunk_size=None` is the model's `softmax_chunk_size` (or 1024 when
        that is unset).
        """
        return self.head.target_log_probabilities(
            features, targets,
            chunk_size=chunk_size or self.softmax_chunk_size or DEFAULT_CHUNK_SIZE,
            temperature=temperature, training=training,
        )


    def reset_states(self):
        """Zeroes the carried recurrent state (every row)."""
        for variable in getattr(self, "recurrent_state_variables", []):
            variable.assign(ops.zeros(variable.shape, variable.dtype))

    def set_temperature(self, temperature):
        """Sets the softmax temperature τ used at evaluation."""
        self.head.set_temperature(temperature)
        self.temperature = self.head.temperature

    # === Generation and scoring ===

    def compile(
        self,
        optimizer="rmsprop",
        loss=None,
        metrics=None,
        weighted_metrics=None,
        *,
        sampler="greedy",
        **kwargs,
    ):
        """Configures the model for training and for `generate`.

        As `keras.Model.compile`, with the `sampler` of keras-hub's
        `CausalLM.compile`: the default sampler of `generate` (a call's own
        `sampler=` still takes precedence).

        Args:
            optimizer, loss, metrics, weighted_metrics, **kwargs: as
                `keras.Model.compile`.
            sampler: a sampler name (`"greedy"`, `"top_k"`, `"top_p"`,
                `"random"`, `"beam"`) or a `keras_mogrifier.samplers.Sampler`.
                Defaults to `"greedy"` (keras-hub's default is `"top_k"`; the
                greedy default keeps `generate` deterministic, as it was
                before `compile` took a sampler). Like keras-hub's, it is not
                saved with the model: a loaded model generates greedily until
                compiled with another.

        Example:

        >>> model = LanguageModel(12, units=8, num_layers=1, batch_size=2)
        >>> model.build((2, None))
        >>> model.compile(optimizer="adam", sampler=samplers.TopKSampler(k=3))
        >>> model.sampler.k
        3
        """
        sampler = samplers.get(sampler)  # checked before anything changes
        super().compile(
            optimizer=optimizer, loss=loss, metrics=metrics,
            weighted_metrics=weighted_metrics, **kwargs,
        )
        self.sampler = sampler

    def generate(
        self,
        prompts,
        max_length=None,
        sampler=None,
        *,
        k=None,
        p=None,
        num_beams=None,
        temperature=None,
        seed=None,
        stop_token_ids="auto",
        strip_prompt=False,
        vocabulary=None,
        jit_compile="auto",
    ):
        """Continues prompts: one compiled step per new token.

        Strings are read and written with the model's `vocabulary` (or
        `vocabulary=`); ids give ids. The samplers are keras-hub's
        (`"greedy"`, `"top_k"` with `k`, `"top_p"` with `p`, `"random"`,
        `"beam"` with `num_beams`, each with `temperature`, or a
        `keras_mogrifier.samplers.Sampler`); `sampler=None` takes the one
        given to `compile(sampler=...)`, greedy if none was.
        `max_length` counts the prompt too; `None` is the longest prompt
        plus 100 tokens. `strip_prompt=True` returns the new tokens only.
        See `keras_mogrifier.generation.generate` for every argument.

        Example:

        >>> from keras_mogrifier.data import Vocabulary
        >>> vocab = Vocabulary("the cat sat <eos>".split())
        >>> model = LanguageModel(4, units=8, num_layers=1, batch_size=2,
        ...                       vocabulary=vocab)
        >>> model.build((2, None))
        >>> len(model.generate("the cat", max_length=6, stop_token_ids=None).split())
        6
        """
        if sampler is None:
            sampler = getattr(self, "sampler", None) or "greedy"
        return generation.generate(
            self, prompts, max_length, sampler, k=k, p=p, num_beams=num_beams,
            temperature=temperature, seed=seed, stop_token_ids=stop_token_ids,
            vocabulary=vocabulary, strip_prompt=strip_prompt,
            jit_compile=jit_compile,
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
