"""Dynamic evaluation (Krause et al., 2018) with a fit-style API."""

import contextlib
import numbers

import keras
import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.backend import sparse_crossentropy
from keras_mogrifier.evaluation import _recurrent_state
from keras_mogrifier.evaluation import _adaptive_generation
from keras_mogrifier.evaluation import update_rules
from keras_mogrifier.evaluation._stream_scoring import progress_verbosity
from keras_mogrifier.evaluation._stream_scoring import SEGMENTS_PER_CALL
from keras_mogrifier.evaluation._stream_scoring import score_stream
from keras_mogrifier.generation import text as text_lib

ADAPTATION_KERNEL_NAME = "adaptation_kernel"
NORMALIZERS = ("tensor_mean", "global_mean")
WHOLE_WINDOW = True
# The most logits (float32) a static scoring call computes at once.
WINDOW_LOGITS = 2**23


class DynamicEvaluator(keras.callbacks.Callback):
    """Scores a token stream while adapting the model to it (dynamic evaluation).

    The stream `w_0 … w_N` is cut into segments of `segment_length` predicted
    tokens. Each segment is first scored with the current weights θ (the
    reported loss: predict, then adapt); then the gradient `g` of its **mean**
    token cross-entropy (truncated at the segment start, the recurrent state
    carried over from the previous segment) updates every adapted variable:

    ```
    θ ← θ − η · g / (RMS + ε) + min(1, λ · RMS / mean(RMS)) ⊙ (θ_g − θ)
    ```

    where θ_g are the trained weights, both terms use θ before the step,
    `RMS = sqrt(MS_g)` with `MS_g` the mean over training minibatches of the
    squared gradient of each minibatch's mean loss (see
    `collect_gradient_statistics`), and `mean(RMS)` is the mean over variables
    of each variable's mean RMS (`normalizer="tensor_mean"`, as in Krause's
    released code) or the mean over all elements (`"global_mean"`, as in the
    Mogrifier authors' code). With `learning_rate=0` the result is exactly the
    static evaluation; with `decay_rate=0` it is RMS-normalised SGD. This is
    Krause et al.'s eq. 8 (`update_rule="rms_rms_prior"`); the simpler rules
    of their ablation are `"rms_global_prior"` (eq. 6, the decay
    `λ (θ_g − θ)` for every element alike) and `"sgd"` (eq. 4,
    `θ − η g + λ (θ_g − θ)`, which needs no gradient statistics; with
    `decay_rate=0` it is plain SGD, and with `segment_length=1` as well
    Mikolov's "traditional dynamic evaluation", which Krause et al. §4-5
    describe in words: n = 1 in their segmentation, eq. 2); see
    `update_rules`. An element without
    gradient statistics takes its tensor's mean RMS (see `docs/`), and a
    segment whose loss is not finite stops the pass (`DivergenceError`).

    The model maps token ids `(batch, time)` to logits `(batch, time, vocab)`;
    the evaluator computes the sparse cross-entropy from the logits itself,
    with dropout off, so the model need not be compiled. Recurrent state is
    carried across segments when the model keeps it in variables: the
    `states` of stateful `keras.layers.RNN` layers, and the list
    `recurrent_state_variables` of the model or any of its layers. A model
    with no state variables starts every segment from a zero state, so context
    is then not carried across segments. Afterwards the model holds its
    trained weights and its recurrent state again, exactly, also when the
    evaluation fails or is interrupted.

    Sparse dynamic evaluation (`sparse=True`, Krause et al. §6) adapts only the
    zero-initialised `adaptation_kernel` matrices that recurrent cells create
    with `adaptation_units=H` (`h' = h + [h[:, :H] @ M, 0]`). A cell built with
    `adaptation_streams=S` holds one matrix per stream, shape `(S, H, H)`; the
    evaluator then adapts `S` streams at once, each with its own matrix.

    Adaptive generation: `with evaluator.adapt_to(document) as model:` hands
    the model back adapted to a document (the same updates as `evaluate`),
    for `generate` and `score`, and restores the trained weights on exit.

    The evaluator is also a `keras.callbacks.Callback`: given
    `validation_data` and `gradient_data`, in `fit` it evaluates the
    validation stream dynamically at the end of the last epoch (and every
    `frequency` epochs) and adds `val_dynamic_loss` and
    `val_dynamic_perplexity` to that epoch's logs, so that `History`,
    `TensorBoard` or KerasTuner placed after it in the list see them. It
    hooks epoch events only.

    Args:
        model: `keras.Model` or `None`. The language model. Defaults to `None`
            (the model of `fit` when used as a callback).
        learning_rate: float. η, the step size (≥ 0). Defaults to `5e-5`.
        decay_rate: float. λ, the rate of decay back to θ_g (≥ 0). Defaults to
            `2e-3`.
        epsilon: float. ε, added to RMS after the square root (> 0). Defaults
            to `2e-5`.
        segment_length: int. n, predicted tokens per segment and per update.
            Defaults to `5`.
        normalizer: str. `"tensor_mean"` or `"global_mean"`, how `mean(RMS)` is
            taken. Defaults to `"tensor_mean"`.
        update_rule: str. `"rms_rms_prior"` (eq. 8), `"rms_global_prior"`
            (eq. 6) or `"sgd"` (eq. 4, no statistics needed). Defaults to
            `"rms_rms_prior"`.
        variables: `None`, a list of the model's variables, or a callable
            `variable -> bool` applied to `model.variables`: the adapted
            variables. Defaults to `None`, `model.trainable_variables`.
        sparse: bool. Adapt only the model's `adaptation_kernel` variables.
            Defaults to `False`.
        vocabulary_size: int or `None`. Token ids must lie in
            `[0, vocabulary_size)`. Defaults to `None`: taken from the model
            (`model.vocabulary_size`, its output shape and its `Embedding`
            layers).
        jit_compile: bool or `"auto"`. Compile the steps with XLA. Defaults to
            `"auto"`: when a GPU is visible and every layer supports XLA.
        validation_data: 1-D or `(streams, time)` token ids or `None`. The
            stream evaluated in `fit`. Defaults to `None`.
        gradient_data: the `data` of `collect_gradient_statistics` used in
            `fit` (re-iterable: it is read every time). Defaults to `None`.
        gradient_steps: int or `None`. `steps` for `gradient_data`. Defaults
            to `None`.
        gradient_batch_size: int. `batch_size` for `gradient_data`. Defaults
            to `100`.
        validation_batch_size: int or `None`. `batch_size` for
            `validation_data`. Defaults to `None`.
        frequency: int or `None`. In `fit`, also evaluate every `frequency`
            epochs. Defaults to `None` (last epoch only).
        verbose: int or `"auto"`. Progress of the evaluation inside `fit`.
            Defaults to `0`.

    Example:

    >>> import numpy as np
    >>> import keras
    >>> from keras_mogrifier.evaluation import DynamicEvaluator
    >>> model = keras.Sequential([
    ...     keras.Input(batch_shape=(1, None), dtype="int32"),
    ...     keras.layers.Embedding(50, 16),
    ...     keras.layers.LSTM(16, stateful=True, return_sequences=True),
    ...     keras.layers.Dense(50),
    ... ])
    >>> train = np.random.default_rng(0).integers(0, 50, 500)
    >>> test = np.tile(np.arange(10), 20)
    >>> ev = DynamicEvaluator(model, learning_rate=1e-3, segment_length=5)
    >>> _ = ev.collect_gradient_statistics(train, batch_size=1)
    >>> results = ev.evaluate(test, verbose=0)
    >>> sorted(results)
    ['bits_per_token', 'loss', 'num_tokens', 'perplexity']
    >>> results["num_tokens"]
    199

    Reference:
        Krause, Kahembwe, Murray and Renals, "Dynamic Evaluation of Neural
        Sequence Models", ICML 2018, https://arxiv.org/abs/1709.07432
    """

    def __init__(
        self,
        model=None,
        *,
        learning_rate=5e-5,
        decay_rate=2e-3,
        epsilon=2e-5,
        segment_length=5,
        normalizer="tensor_mean",
        update_rule="rms_rms_prior",
        variables=None,
        sparse=False,
        vocabulary_size=None,
        jit_compile="auto",
        validation_data=None,
        gradient_data=None,
        gradient_steps=None,
        gradient_batch_size=100,
        validation_batch_size=None,
        frequency=None,
        verbose=0,
    ):
        super().__init__()
        if model is not None and not isinstance(model, keras.Layer):
            raise ValueError(
                "Expected `model` to be a Keras model or `None`. "
                f"Received: model={model!r}"
            )
        if not (variables is None or callable(variables) or _is_sequence(variables)):
            raise ValueError(
                "Expected `variables` to be `None`, a list of variables or a "
                f"callable `variable -> bool`. Received: variables={variables!r}"
            )
        if not isinstance(sparse, bool):
            raise ValueError(f"Expected `sparse` to be a bool. Received: sparse={sparse!r}")
        if sparse and variables is not None:
            raise ValueError(
                "Expected at most one of `sparse=True` and `variables`. "
                f"Received: sparse={sparse!r}, variables={variables!r}"
            )
        if jit_compile not in ("auto", True, False):
            raise ValueError(
                "Expected `jit_compile` to be True, False or 'auto'. "
                f"Received: jit_compile={jit_compile!r}"
            )
        _validation.optional_positive_int("vocabulary_size", vocabulary_size)
        _validation.optional_positive_int("gradient_steps", gradient_steps)
        _validation.positive_int("gradient_batch_size", gradient_batch_size)
        _validation.optional_positive_int("validation_batch_size", validation_batch_size)
        _validation.optional_positive_int("frequency", frequency)
        _check_verbose(verbose)
        if validation_data is not None:
            _as_streams(validation_data, "validation_data", vocabulary_size)
            needs = update_rules.NEEDS_STATISTICS.get(update_rule, True)
            if gradient_data is None and needs:
                raise ValueError(
                    "Expected `gradient_data` (training data for the gradient "
                    "statistics) when `validation_data` is given. "
                    "Received: gradient_data=None"
                )
        self.learning_rate = learning_rate
        self.decay_rate = decay_rate
        self.epsilon = epsilon
        self.segment_length = segment_length
        self.normalizer = normalizer
        self.update_rule = update_rule
        self.variables = variables
        self.sparse = sparse
        self.vocabulary_size = vocabulary_size
        self.jit_compile = jit_compile
        self.validation_data = validation_data
        self.gradient_data = gradient_data
        self.gradient_steps = gradient_steps
        self.gradient_batch_size = gradient_batch_size
        self.validation_batch_size = validation_batch_size
        self.frequency = frequency
        self.verbose = verbose
        self._backend = get_backend_module()
        self._steps = {}
        self._steps_model = None
        self._statistics = None  # (variables, [MS_g tensors in the variables' shapes])
        self.adaptation_results = None  # what `adapt_to` scored while adapting
        self._adapted_documents = []  # the enclosing `adapt_to` blocks
        if model is not None:
            self._vocabulary_limit(model)  # a larger `vocabulary_size`: refused
            self.set_model(model)

    # === Hyperparameters (validated whenever set) ===

    @property
    def learning_rate(self):
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self._learning_rate = _validation.non_negative_float("learning_rate", value)

    @property
    def decay_rate(self):
        return self._decay_rate

    @decay_rate.setter
    def decay_rate(self, value):
        self._decay_rate = _validation.non_negative_float("decay_rate", value)

    @property
    def epsilon(self):
        return self._epsilon

    @epsilon.setter
    def epsilon(self, value):
        self._epsilon = _validation.positive_float("epsilon", value)

    @property
    def segment_length(self):
        return self._segment_length

    @segment_length.setter
    def segment_length(self, value):
        self._segment_length = _validation.positive_int("segment_length", value)

    @property
    def update_rule(self):
        return self._update_rule

    @update_rule.setter
    def update_rule(self, value):
        self._update_rule = _validation.one_of("update_rule", value, update_rules.UPDATE_RULES)

    @property
    def normalizer(self):
        return self._normalizer

    @normalizer.setter
    def normalizer(self, value):
        self._normalizer = _validation.one_of("normalizer", value, NORMALIZERS)

    # === Adapted variables and statistics ===

    def adapted_variables(self):
        """The model's variables that dynamic evaluation adapts (a list)."""
        model = self._require_model()
        if self.sparse:
            chosen = [v for v in model.variables if _is_adaptation_kernel(v)]
            if not chosen:
                raise ValueError(
                    "Expected the model to hold `adaptation_kernel` variables for "
                    "`sparse=True` (build its recurrent cells with "
                    "`adaptation_units=H`). Received a model without any."
                )
        elif self.variables is None:
            chosen = list(model.trainable_variables)
        elif callable(self.variables):
            chosen = [v for v in model.variables if self.variables(v)]
        else:
            known = {id(v) for v in model.variables}
            chosen = list(self.variables)
            for v in chosen:
                if id(v) not in known:
                    raise ValueError(
                        "Expected every entry of `variables` to be a variable "
                        f"of the model. Received: {v!r}"
                    )
        unique, seen = [], set()
        for v in chosen:
            if id(v) not in seen:
                seen.add(id(v))
                unique.append(v)
        if not unique:
            raise ValueError(
                "Expected at least one variable to adapt. Received: no variables "
                f"(variables={self.variables!r})"
            )
        for v in unique:
            if not keras.backend.is_float_dtype(v.dtype):
                raise ValueError(
                    f"Expected adapted variables to be floating point. Received: "
                    f"{v.path} of dtype {v.dtype}"
                )
        return unique

    @property
    def gradient_statistics(self):
        """`{variable.path: MS_g}` as NumPy arrays, or `None` before collection.

        Assign a dict of the same form (e.g. saved from an earlier run on the
        same trained weights) to skip `collect_gradient_statistics`.
        """
        if self._statistics is None:
            return None
        variables, values = self._statistics
        return {v.path: np.asarray(ops.convert_to_numpy(m)) for v, m in zip(variables, values)}

    @gradient_statistics.setter
    def gradient_statistics(self, values):
        if values is None:
            self._statistics = None
            return
        variables = self.adapted_variables()
        if not isinstance(values, dict):
            raise ValueError(
                "Expected `gradient_statistics` to be a dict `{variable.path: "
                f"array}}`. Received: {type(values).__name__}"
            )
        tensors = []
        for v in variables:
            if v.path not in values:
                raise ValueError(
                    f"Expected `gradient_statistics` to hold {v.path!r}. Received "
                    f"keys: {sorted(values)}"
                )
            value = np.asarray(values[v.path], dtype="float32")
            if value.shape != tuple(v.shape) or not np.all(np.isfinite(value)) or np.any(value < 0):
                raise ValueError(
                    f"Expected `gradient_statistics[{v.path!r}]` to be finite, "
                    f"non-negative and of shape {tuple(v.shape)}. Received: shape "
                    f"{value.shape}"
                )
            tensors.append(ops.convert_to_tensor(value))
        self._statistics = (variables, tensors)

    @_validation.ids_checked()  # here, once (the model's calls need not)
    def collect_gradient_statistics(self, data, steps=None, batch_size=100, segment_length=None):
        """Gathers `MS_g`, the mean squared minibatch gradient, on training data.

        For every batch the gradient of the batch's mean token loss is taken
        with respect to the adapted variables (dropout off, weights unchanged)
        and squared; `MS_g` is the mean of these squares over the batches.
        The recurrent state is carried from batch to batch, starts from zero,
        and the model's state is restored afterwards. In sparse mode the
        `adaptation_kernel` matrices stay at their value (zero) while this
        runs; a per-stream matrix gets the statistics of one matrix shared by
        the batch, so `batch_size` must then equal its number of streams.

        Args:
            data: a 1-D stream of token ids, which is cut into `batch_size`
                contiguous streams and windows of `segment_length` tokens; or
                an iterable (a `tf.data.Dataset`, a `keras.utils.PyDataset`
                such as `keras_mogrifier.data.StreamDataset`, a list, a
                generator) of `(x, y)` or `(x, y, sample_weight)` batches of
                token ids `(batch, time)`, used as given (the mean loss of a
                batch is then weighted).
            steps: int or `None`. At most this many batches. Defaults to
                `None` (all).
            batch_size: int. Streams per batch for a 1-D `data`. Defaults to
                `100`.
            segment_length: int or `None`. Window length for a 1-D `data`.
                Defaults to `None`, the evaluator's `segment_length`.

        Returns:
            A dict with `loss` (the mean training loss over the batches) and
            `num_batches`.
        """
        _validation.optional_positive_int("steps", steps)
        _validation.positive_int("batch_size", batch_size)
        _validation.optional_positive_int("segment_length", segment_length)
        n = segment_length or self.segment_length
        model = self._require_model()
        variables = self.adapted_variables()
        per_stream = [_is_per_stream(v) for v in variables]
        limit = self._vocabulary_limit(model)
        stream = _as_training_stream(data)
        if stream is not None:
            # Checked here, once (a corpus's ids are known and not scanned);
            # its batches, cut below, are not checked again.
            stream = _check_ids(stream[None], "data", limit)[0]
            length = stream.shape[0] // batch_size
            windows = (length - 1) // n
            if windows < 1:
                raise ValueError(
                    f"Expected `data` to hold at least `batch_size * "
                    f"(segment_length + 1)` = {batch_size * (n + 1)} tokens. "
                    f"Received: {stream.shape[0]} tokens"
                )
            self._check_batch(model, batch_size, "`batch_size`")
            _check_output(model, batch_size, n)
            streams = stream[: length * batch_size].reshape(batch_size, length)
            batches = (
                (streams[:, i * n : (i + 1) * n], streams[:, i * n + 1 : (i + 1) * n + 1])
                for i in range(windows)
            )
        else:
            batches = iter(data)

        step = self._step("gradients", variables)
        accumulate = self._step("accumulate", variables, per_stream=per_stream)
        states = _recurrent_state.state_variables(model)
        saved_states = _recurrent_state.snapshot(states)
        count, loss_sum = 0, 0.0
        accumulators = [
            ops.zeros(v.shape[1:] if ps else v.shape, "float32")
            for v, ps in zip(variables, per_stream)
        ]
        try:
            _recurrent_state.reset(states)
            for batch in batches:
                if steps is not None and count >= steps:
                    break
                x, y, w = self._check_batch_pair(
                    model, batch, limit, ids_checked=stream is not None
                )
                if count == 0 and stream is None:
                    _check_output(model, x.shape[0], x.shape[1])
                # The gradient of the batch's (weighted) mean token loss.
                v = w / max(float(np.sum(w)), 1.0)
                token_losses, gradients = step(
                    ops.convert_to_tensor(x), ops.convert_to_tensor(y),
                    ops.convert_to_tensor(v),
                )
                accumulators = accumulate(accumulators, gradients)
                loss_sum += float(np.sum(_numpy(token_losses) * v, dtype="float64"))
                count += 1
            if count == 0:
                raise ValueError("Expected `data` to yield at least one batch. Received none.")
            statistics = []
            for v, acc, ps in zip(variables, accumulators, per_stream):
                ms = ops.convert_to_tensor(acc) / count
                statistics.append(ops.broadcast_to(ms, v.shape) if ps else ms)
        finally:
            _recurrent_state.assign(states, saved_states)
        self._statistics = (variables, statistics)
        return {"loss": loss_sum / count, "num_batches": count}

    # === Evaluation ===

    @_validation.ids_checked()  # here, once (the model's calls need not)
    def evaluate(
        self,
        x,
        batch_size=None,
        callbacks=None,
        verbose="auto",
        adapt=True,
        return_token_losses=False,
        stop_on_divergence=True,
    ):
        """Scores `x` with dynamic evaluation and returns the metrics.

        Args:
            x: token ids, a 1-D stream or `(streams, time)` independent
                streams of equal length; each stream is adapted on its own,
                starting from the trained weights. The first token of a stream
                is context only; `x[..., 1:]` are predicted.
            batch_size: int or `None`. Streams run at once. Adapting shared
                weights needs one stream at a time (1); per-stream
                `adaptation_kernel` matrices need exactly their number of
                streams, which is then the default. Defaults to `None`.
            callbacks: list of `keras.callbacks.Callback` or `None`. They get
                `on_test_begin`, `on_test_batch_begin/end` (one batch per
                segment, logs with the running `loss` and `perplexity`) and
                `on_test_end`. Defaults to `None`.
            verbose: `"auto"`, 0, 1 or 2. Progress bar. Defaults to `"auto"`
                (a bar on a terminal, none in a log or a pipe).
            adapt: bool. `False` scores the stream statically, with the same
                segments and carried state, and needs no gradient statistics;
                a stateful `LanguageModel` then reads many segments per call
                (windows of up to 64 segments and 2²³ logits: the same losses
                to float rounding, 2–4× faster than a call per segment).
                Defaults to `True`.
            return_token_losses: bool. Also return `token_losses`, a float32
                array `(streams, time - 1)` of the loss of every predicted
                token. Defaults to `False`.
            stop_on_divergence: bool. Stop at the first segment with a token
                loss that is not finite or above 709.78 nats (a perplexity no
                float holds) and raise `DivergenceError` (naming the stream,
                the token and the settings) instead of scoring the rest of
                the stream for nothing. The weights and state are restored
                either way. Defaults to `True`.

        Returns:
            A dict with `loss` (the token-weighted mean cross-entropy in nats),
            `perplexity` (`exp(loss)`), `bits_per_token` (`loss / ln 2`) and
            `num_tokens` (predicted tokens), and `token_losses` if asked.
        """
        return self._evaluate(
            x, batch_size, callbacks, verbose, adapt, return_token_losses,
            stop_on_divergence, keep_adapted=False,
        )

    @contextlib.contextmanager
    def adapt_to(self, document, *, vocabulary=None, verbose=0):
        """Adapts the model to `document` and hands it back adapted.

        Adaptive generation (Krause et al. §7.4): inside the `with` block the
        model holds the weights that dynamic evaluation reaches at the end of
        `document` (the same segments, update rule and carried state as
        `evaluate`), and row 0 of its carried recurrent state is the
        document's: the state dynamic evaluation reached, every token but the
        last read (the last one is the next input). `generate` (below)
        continues the document from there, and can keep adapting on what it
        samples; the model's own `generate` and `score` start from a zero
        state, with the adapted weights. On exit — also after an error — the
        model holds the weights and the carried recurrent state it had before
        the block, exactly.

        Blocks nest: an inner block adapts further, starting from the outer
        block's weights, and its update rule decays toward them (the outer
        block's weights are its θ_g), not toward the trained weights; on exit
        the outer block's weights and state are back.

        Needs gradient statistics (`collect_gradient_statistics`), as
        `evaluate` does. The scores of the document while adapting (the
        dict `evaluate` returns) are kept in `adaptation_results`.

        Args:
            document: a string (read with the model's `vocabulary` or
                `vocabulary=`) or a 1-D stream of token ids; at least 2
                tokens.
            vocabulary: a `keras_mogrifier.data.Vocabulary` or `None`. For a
                string `document`. Defaults to the model's.
            verbose: 0, 1, 2 or `"auto"`. Progress while adapting. Defaults
                to `0`.

        Yields:
            The model, adapted.

        Example:

        ```python
        evaluator = DynamicEvaluator(model, learning_rate=1e-4)
        evaluator.collect_gradient_statistics(corpus.train, batch_size=20)
        with evaluator.adapt_to(article) as adapted:
            adapted.generate("the company said", max_length=30)
            evaluator.generate(max_length=30, sampler="top_k")  # continues it
        ```
        """
        model = self._require_model()
        vocab = None
        if isinstance(document, str):
            vocab = text_lib.resolve_vocabulary(model, vocabulary)
            if vocab is None:
                raise ValueError(
                    "Expected a vocabulary to read a text `document`: build "
                    "the model with `vocabulary=` or pass `vocabulary=`. "
                    "Received: a string and no vocabulary"
                )
            document = text_lib.encode(vocab, document, where="document")
        streams = _as_streams(document, "document", self._vocabulary_limit(model))
        if streams.shape[0] != 1:
            raise ValueError(
                "Expected one document (a 1-D stream of token ids). Received: "
                f"{streams.shape[0]} streams"
            )
        variables = self.adapted_variables()
        theta_g = _recurrent_state.snapshot(variables)
        states = _recurrent_state.state_variables(model)
        saved_states = _recurrent_state.snapshot(states)
        documents = self._adapted_documents
        depth = len(documents)
        try:
            self.adaptation_results = self._evaluate(
                streams, None, None, verbose, True, False, True, keep_adapted=True
            )
            documents.append(
                {"ids": streams[0], "prior": theta_g, "variables": variables,
                 "vocabulary": vocab}
            )
            yield model
        finally:
            del documents[depth:]
            _recurrent_state.assign(variables, theta_g)
            _recurrent_state.assign(states, saved_states)

    def generate(
        self,
        max_length,
        prompt=None,
        sampler="random",
        *,
        k=None,
        p=None,
        temperature=None,
        seed=None,
        stop_token_ids="auto",
        keep_adapting=True,
        vocabulary=None,
        jit_compile="auto",
    ):
        """Continues the document of the enclosing `adapt_to` block.

        Krause et al. §7.4 condition a dynamically evaluated model on a
        document and sample its continuation "continuing to apply dynamic
        evaluation during sampling" (§3: each generated segment is sampled
        with fixed weights, then the weights take a dynamic-evaluation step
        on it). This does that: from the document's state (inside
        `with evaluator.adapt_to(document):`), it reads the document's last
        token, then `prompt` if given, then samples; with `keep_adapting`,
        after every `segment_length` tokens read or sampled it takes the
        evaluator's update on them (the same rule, statistics and θ_g as the
        block: the weights the block started from). Afterwards the model
        holds the block's weights and state again.

        Args:
            max_length: int. Tokens to return: `prompt` and the continuation.
            prompt: a string, a 1-D sequence of ids or `None`: tokens that
                follow the document before sampling starts. Defaults to
                `None`.
            sampler: `"greedy"`, `"top_k"`, `"top_p"`, `"random"` or a
                `keras_mogrifier.samplers.Sampler` (not beam search).
                Defaults to `"random"`.
            k, p, temperature: the sampler's settings, as in
                `LanguageModel.generate`.
            seed: int or `None`. Seed of the sampling. Defaults to `None`.
            stop_token_ids: `"auto"`, `None` or ids: stop after one of them.
                `"auto"` is the vocabulary's `<eos>`. Defaults to `"auto"`.
            keep_adapting: bool. Adapt on the tokens read and sampled.
                Defaults to `True` (Krause et al.).
            vocabulary: a `Vocabulary` or `None` (the block's or the
                model's).
            jit_compile: bool or `"auto"`. Defaults to `"auto"`.

        Returns:
            A string (for a text document or prompt, with a vocabulary) or an
            int32 array: the prompt and the continuation.
        """
        return _adaptive_generation.continue_document(
            self, max_length, prompt, sampler, k=k, p=p, temperature=temperature,
            seed=seed, stop_token_ids=stop_token_ids, keep_adapting=keep_adapting,
            vocabulary=vocabulary, jit_compile=jit_compile,
        )

    def _evaluate(
        self,
        x,
        batch_size,
        callbacks,
        verbose,
        adapt,
        return_token_losses,
        stop_on_divergence,
        keep_adapted,
    ):
        # `evaluate`; with `keep_adapted`, the adapted weights stay in the
        # model when the stream is done (not after an error).
        if not isinstance(adapt, bool):
            raise ValueError(f"Expected `adapt` to be a bool. Received: adapt={adapt!r}")
        if not isinstance(stop_on_divergence, bool):
            raise ValueError(
                "Expected `stop_on_divergence` to be a bool. Received: "
                f"stop_on_divergence={stop_on_divergence!r}"
            )
        _check_verbose(verbose)
        verbose = progress_verbosity(verbose)
        callbacks = _check_callbacks(callbacks)
        _validation.optional_positive_int("batch_size", batch_size)
        model = self._require_model()
        streams = _as_streams(x, "x", self._vocabulary_limit(model))

        variables, rms, hyperparameters = [], [], None
        stream_size = _per_stream_size(model)
        if adapt:
            variables = self.adapted_variables()
            rms, hyperparameters = self._update_inputs(variables)
            if not all(_is_per_stream(v) for v in variables):
                if batch_size not in (None, 1):
                    raise ValueError(
                        "Expected `batch_size=1`: dynamic evaluation of shared "
                        "weights adapts one stream at a time (use per-stream "
                        "`adaptation_kernel` matrices to adapt streams in "
                        f"parallel). Received: batch_size={batch_size}"
                    )
        if batch_size is None:
            batch_size = stream_size or 1
        if stream_size is not None and batch_size != stream_size:
            raise ValueError(
                f"Expected `batch_size` to equal the number of per-stream "
                f"adaptation matrices ({stream_size}). Received: batch_size={batch_size}"
            )
        self._check_batch(model, batch_size, "`batch_size`")
        _check_output(model, batch_size, self.segment_length)

        settings = self.settings()
        # Many segments per compiled call (no host round trip between them),
        # unless callbacks were given: they see the model after every
        # segment, so each segment is then a call of its own.
        per_call = 1 if callbacks else SEGMENTS_PER_CALL
        if not adapt and _scores_windows_whole(model):
            # Nothing changes the weights between segments: a call's `K`
            # segments are one window of `K · n` tokens for a model whose
            # state carries from call to call (the same steps, fewer calls),
            # in windows of at most `WINDOW_LOGITS` logits.
            forward = self._step("forward", [])
            rows = max(1, WINDOW_LOGITS // (batch_size * _vocabulary_size(model)))

            def score_segments(x, y, w, group, first):
                k, b, n = x.shape
                per_window = max(1, rows // n)
                losses = []
                for start in range(0, k, per_window):
                    stop = min(k, start + per_window)
                    window = lambda a: ops.convert_to_tensor(
                        np.ascontiguousarray(a[start:stop].transpose(1, 0, 2).reshape(b, -1))
                    )
                    losses.append(
                        _numpy(forward(window(x), window(y)))
                        .reshape(b, stop - start, n).transpose(1, 0, 2)
                    )
                return np.concatenate(losses, axis=0)

            results, token_losses = score_stream(
                model, streams, batch_size, self.segment_length, score_segments,
                callbacks=callbacks, verbose=verbose,
                stop_on_divergence=stop_on_divergence, settings=settings,
                segments_per_call=per_call,
            )
        elif not adapt:
            forward_loop = self._step("forward_loop", [])

            def score_segments(x, y, w, group, first):
                _, losses = forward_loop(
                    (), (), ops.convert_to_tensor(x), ops.convert_to_tensor(y)
                )
                return _numpy(losses)

            results, token_losses = score_stream(
                model, streams, batch_size, self.segment_length, score_segments,
                callbacks=callbacks, verbose=verbose,
                stop_on_divergence=stop_on_divergence, settings=settings,
                segments_per_call=per_call,
            )
        else:
            adaptation_loop = self._step("adaptation_loop", variables)
            theta_g = _recurrent_state.snapshot(variables)
            constants = (theta_g, rms, hyperparameters)

            def start_group(group):
                # Every stream (group of streams) starts from θ_g.
                if group > 0:
                    _recurrent_state.assign(variables, theta_g)

            def score_segments(x, y, w, group, first):
                # Each stream's mean segment loss; their sum is the objective,
                # so a per-stream matrix gets its own stream's gradient.
                v = w / np.maximum(w.sum(axis=-1, keepdims=True), 1.0)
                return _numpy(adaptation_loop(
                    constants, ops.convert_to_tensor(x), ops.convert_to_tensor(y),
                    ops.convert_to_tensor(v),
                ))

            completed = False
            try:
                results, token_losses = score_stream(
                    model, streams, batch_size, self.segment_length, score_segments,
                    start_group=start_group, callbacks=callbacks, verbose=verbose,
                    stop_on_divergence=stop_on_divergence, settings=settings,
                    keep_final_state=keep_adapted,
                    segments_per_call=per_call,
                )
                completed = True
            finally:
                if not (keep_adapted and completed):
                    _recurrent_state.assign(variables, theta_g)
        if return_token_losses:
            results["token_losses"] = token_losses
        return results

    def settings(self):
        """The evaluator's hyperparameters as a dict (what a report names)."""
        return {
            "update_rule": self.update_rule,
            "learning_rate": self.learning_rate,
            "decay_rate": self.decay_rate,
            "epsilon": self.epsilon,
            "segment_length": self.segment_length,
            "normalizer": self.normalizer,
        }

    # === Callback ===

    def on_epoch_end(self, epoch, logs=None):
        if self.validation_data is None:
            return
        epochs = (self.params or {}).get("epochs")
        last = epochs is not None and epoch + 1 == epochs
        periodic = self.frequency is not None and (epoch + 1) % self.frequency == 0
        if not (last or periodic):
            return
        if update_rules.NEEDS_STATISTICS[self.update_rule]:
            self.collect_gradient_statistics(
                self.gradient_data,
                steps=self.gradient_steps,
                batch_size=self.gradient_batch_size,
            )
        results = self.evaluate(
            self.validation_data,
            batch_size=self.validation_batch_size,
            verbose=self.verbose,
        )
        if logs is not None:
            logs["val_dynamic_loss"] = results["loss"]
            logs["val_dynamic_perplexity"] = results["perplexity"]

    # === Internals ===

    def _require_model(self):
        model = self._model
        if model is None:
            raise ValueError(
                "Expected a model: pass `model` to `DynamicEvaluator` or use it "
                "as a callback in `fit`. Received: model=None"
            )
        if not model.built:
            raise ValueError(
                "Expected a built model (call it once, or give it an `Input`). "
                f"Received an unbuilt model: {model.name}"
            )
        return model

    def _vocabulary_limit(self, model):
        own = self._model_vocabulary_limit(model)
        if self.vocabulary_size is None:
            return own
        if own is not None and self.vocabulary_size > own:
            raise ValueError(
                f"Expected `vocabulary_size` to be at most the model's "
                f"vocabulary ({own} ids: its embedding and output); an id "
                f"≥ {own} has no embedding row. Received: "
                f"vocabulary_size={self.vocabulary_size}"
            )
        return self.vocabulary_size

    def _model_vocabulary_limit(self, model):
        limits = []
        size = getattr(model, "vocabulary_size", None)
        if isinstance(size, numbers.Integral):
            limits.append(int(size))
        try:
            last = model.output_shape[-1]
        except (AttributeError, ValueError, TypeError, IndexError):
            last = None  # e.g. a subclassed model: no static output shape
        if isinstance(last, numbers.Integral):
            limits.append(int(last))
        for layer in _recurrent_state._layers(model):
            if isinstance(layer, keras.layers.Embedding):
                limits.append(int(layer.input_dim))
        return min(limits) if limits else None

    def _check_batch(self, model, batch_size, subject):
        message = _recurrent_state.batch_size_error(model, batch_size, subject)
        if message:
            raise ValueError(message)

    def _check_batch_pair(self, model, batch, limit, ids_checked=False):
        if not (isinstance(batch, (tuple, list)) and len(batch) in (2, 3)):
            raise ValueError(
                "Expected `data` to yield `(x, y)` or `(x, y, sample_weight)` "
                f"batches of token ids. Received: {type(batch).__name__}"
            )
        x, y = (np.asarray(ops.convert_to_numpy(t)) for t in batch[:2])
        if x.ndim != 2 or x.shape != y.shape:
            raise ValueError(
                "Expected `x` and `y` of a batch to have the same shape "
                f"(batch, time). Received: {x.shape} and {y.shape}"
            )
        if len(batch) == 3:
            w = np.asarray(ops.convert_to_numpy(batch[2]), "float32")
            if w.shape != y.shape or not np.all(np.isfinite(w)) or np.any(w < 0):
                raise ValueError(
                    "Expected the sample weights of a batch to be finite, "
                    f"non-negative and of shape {y.shape}. Received shape {w.shape}"
                )
        else:
            w = np.ones(y.shape, "float32")
        if not ids_checked:
            x = _check_ids(x, "data", limit)
            y = _check_ids(y, "data", limit)
        size = _per_stream_size(model)
        if size is not None and x.shape[0] != size:
            raise ValueError(
                f"Expected batches of exactly {size} streams, the number of "
                f"per-stream adaptation matrices. Received: {x.shape[0]}"
            )
        self._check_batch(model, x.shape[0], "the batch size of `data`")
        return x, y, w

    def _update_inputs(self, variables):
        """`(rms, hyperparameters)` for the update of `variables`, or a ValueError."""
        if update_rules.NEEDS_STATISTICS[self.update_rule]:
            if self._statistics is None or [
                id(v) for v in self._statistics[0]
            ] != [id(v) for v in variables]:
                raise ValueError(
                    "Expected gradient statistics of the adapted variables "
                    f"(update_rule={self.update_rule!r} divides by their "
                    "RMS): call `collect_gradient_statistics(training_data)` "
                    "(or set `gradient_statistics`) before `evaluate`. "
                    "Received none."
                )
            return self._update_terms()
        # The rule reads no statistics: placeholders of the right shapes.
        rms = [ops.zeros(v.shape, "float32") for v in variables]
        hyperparameters = ops.convert_to_tensor(
            [self.learning_rate, self.epsilon, self.decay_rate, 1.0], "float32"
        )
        return rms, hyperparameters

    def _update_terms(self):
        """The RMS each variable is updated with, and `[η, ε, λ, mean(RMS)]`.

        `mean(RMS)`, the normaliser of the decay, is taken over the gathered
        statistics as they are. An element whose statistics are zero — it
        had no gradient in any statistics batch, such as the embedding row of
        a word absent from that data — would otherwise get an unbounded step
        `η · g / ε` and no decay at all: it takes the mean RMS of the
        elements of its tensor that have statistics instead (the normaliser
        itself when no element of the tensor has any), for both the step and
        the decay. Every other element keeps its own RMS, so where statistics
        exist the rule is exactly SPEC §5.
        """
        raw = [np.sqrt(np.asarray(ops.convert_to_numpy(ms), "float64")) for ms in self._statistics[1]]
        if self.normalizer == "tensor_mean":
            mean_rms = float(np.mean([r.mean() for r in raw]))
        else:
            mean_rms = float(sum(r.sum() for r in raw) / sum(r.size for r in raw))
        if not mean_rms > 0:
            raise ValueError(
                "Expected gradient statistics with a non-zero mean RMS. "
                "Received all-zero statistics (do the adapted variables "
                "affect the loss?)"
            )
        rms = []
        for r in raw:
            seen = r > 0
            fill = r[seen].mean() if seen.any() else mean_rms
            rms.append(ops.convert_to_tensor(np.where(seen, r, fill).astype("float32")))
        hyperparameters = ops.convert_to_tensor(
            [self.learning_rate, self.epsilon, self.decay_rate, mean_rms], "float32"
        )
        return rms, hyperparameters

    def _step(self, kind, variables, per_stream=None):
        """The compiled function `kind` for `variables`, built once per model.

        - `"forward_loop"`: `((), (), x, y) -> ((), token losses)` for
          `K` segments `(K, batch, n)` in order, the model in inference mode
          (its carried state is updated from segment to segment);
        - `"gradients"`: `(x, y, v) -> (token losses, gradients)`, the
          gradients of `Σ v ⊙ token losses` with respect to `variables`;
        - `"adaptation_loop"`: `((θ_g, RMS, hyperparameters), x, y, v) ->
          token losses` for `K` segments in order: each scored, then
          `variables` updated by the update rule from the gradient of
          `Σ v ⊙ token losses`, inside one compiled call;
        - `"accumulate"`: adds the squared gradients to the accumulators
          (summed over the stream axis of per-stream variables first).
        """
        model = self._model
        if self._steps_model is not model:
            self._steps = {}
            self._steps_model = model
        jit = self.jit_compile
        if jit == "auto":
            jit = self._backend.default_jit_compile(model)
        key = (kind, tuple(id(v) for v in variables), jit, self.update_rule)
        if key in self._steps:
            return self._steps[key]
        backend = self._backend
        if kind == "forward":
            built = backend.model_function(
                model, lambda x, y: _token_losses(model, x, y), jit
            )
        elif kind == "forward_loop":

            def forward(carry, constants, x, y):
                return carry, _token_losses(model, x, y)

            built = backend.model_loop(model, forward, jit)
        elif kind == "gradients":

            def objective(x, y, v):
                token_losses = _token_losses(model, x, y)
                return ops.sum(token_losses * v), token_losses

            built = backend.model_gradients(model, variables, objective, jit)
        elif kind == "adaptation_loop":
            rule = update_rules.get(self.update_rule)

            def objective(x, y, v):
                token_losses = _token_losses(model, x, y)
                return ops.sum(token_losses * v), token_losses

            def update(thetas, gradients, theta_g, rms, hyperparameters):
                return [
                    rule(t, g, tg, r, hyperparameters)
                    for t, g, tg, r in zip(thetas, gradients, theta_g, rms)
                ]

            built = backend.model_adaptation_loop(model, variables, objective, update, jit)
        else:
            flags = tuple(per_stream)

            def accumulate(accumulators, gradients):
                out = []
                for acc, g, ps in zip(accumulators, gradients, flags):
                    g = ops.cast(g, "float32")
                    if ps:
                        g = ops.sum(g, axis=0)
                    out.append(acc + ops.square(g))
                return out

            built = backend.function(accumulate, jit_compile=True)
        self._steps[key] = built
        return built


def _check_output(model, batch_size, time):
    """Raises unless `model` maps ids `(batch, time)` to `(batch, time, vocab)`.

    Found symbolically (`compute_output_spec`: nothing runs, no state
    changes); a model that cannot be called symbolically is not checked here.
    """
    try:
        spec = model.compute_output_spec(
            keras.KerasTensor((batch_size, time), dtype="int32")
        )
        shape = tuple(spec.shape)
    except Exception:
        return
    if len(shape) != 3 or shape[0] not in (None, batch_size) or shape[1] not in (
        None, time
    ):
        raise ValueError(
            "Expected the model to map token ids (batch, time) to logits "
            "(batch, time, vocabulary). Received: a model whose output for "
            f"inputs of shape {(batch_size, time)} has shape {shape}"
        )


def _scores_windows_whole(model):
    """Whether `model`'s losses on a window equal those on its segments in turn.

    True for a stateful `LanguageModel` (its state carries from call to
    call and nothing in it depends on where a call starts), on the backends
    where one call of `K · n` steps is cheaper than `K` calls (`WHOLE_WINDOW`).
    """
    from keras_mogrifier.models.language_model import LanguageModel

    return (
        WHOLE_WINDOW
        and isinstance(model, LanguageModel)
        and model.stateful
    )


def _vocabulary_size(model):
    return int(model.vocabulary_size)


def _token_losses(model, x, y):
    """Sparse cross-entropy of every token, float32, dropout off."""
    logits = ops.cast(model(x, training=False), "float32")
    return sparse_crossentropy(y, logits)


def _numpy(tensor):
    return np.asarray(ops.convert_to_numpy(tensor))


def _is_sequence(value):
    return isinstance(value, (list, tuple))


def _is_adaptation_kernel(variable):
    return variable.name == ADAPTATION_KERNEL_NAME or variable.path.endswith(
        "/" + ADAPTATION_KERNEL_NAME
    )


def _is_per_stream(variable):
    return _is_adaptation_kernel(variable) and len(variable.shape) == 3


def _per_stream_size(model):
    sizes = {int(v.shape[0]) for v in model.variables if _is_per_stream(v)}
    if len(sizes) > 1:
        raise ValueError(
            "Expected every per-stream `adaptation_kernel` of the model to have "
            f"the same number of streams. Received: {sorted(sizes)}"
        )
    return sizes.pop() if sizes else None


def _check_verbose(verbose):
    if verbose not in ("auto", 0, 1, 2) or isinstance(verbose, bool):
        raise ValueError(
            f"Expected `verbose` to be 'auto', 0, 1 or 2. Received: verbose={verbose!r}"
        )


def _check_callbacks(callbacks):
    if callbacks is None:
        return []
    if not _is_sequence(callbacks) or not all(
        isinstance(c, keras.callbacks.Callback) for c in callbacks
    ):
        raise ValueError(
            "Expected `callbacks` to be a list of `keras.callbacks.Callback`. "
            f"Received: callbacks={callbacks!r}"
        )
    return list(callbacks)


def _to_numpy(value):
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    return np.asarray(ops.convert_to_numpy(value))


def _check_ids(array, name, limit):
    # No copy when already int32: a view of a corpus's ids stays one.
    return _validation.token_ids(name, array, limit).astype("int32", copy=False)


def _as_streams(x, name, limit):
    """`x` as int32 `(streams, time)` after every check, or a ValueError."""
    try:
        array = _to_numpy(x)
    except Exception as error:  # ragged lists, objects NumPy cannot read
        raise ValueError(
            f"Expected `{name}` to be an array of token ids. Received: {type(x).__name__}"
        ) from error
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2:
        raise ValueError(
            f"Expected `{name}` to be 1-D (one stream) or 2-D (streams, time). "
            f"Received shape {array.shape}"
        )
    if array.shape[0] < 1 or array.shape[1] < 2:
        raise ValueError(
            f"Expected each stream of `{name}` to hold at least 2 tokens (the "
            f"first is context only). Received shape {array.shape}"
        )
    return _check_ids(array, name, limit)


def _as_training_stream(data):
    """A 1-D array when `data` is one stream; `None` for an iterable of batches."""
    if isinstance(data, (list, tuple)):
        if data and all(isinstance(t, numbers.Integral) for t in data):
            return np.asarray(data)
        if not data:
            raise ValueError("Expected `data` to be non-empty. Received an empty list")
        return None
    if isinstance(data, np.ndarray) or (
        hasattr(data, "shape") and hasattr(data, "dtype") and not hasattr(data, "element_spec")
    ):
        array = _to_numpy(data)
        if array.ndim != 1:
            raise ValueError(
                "Expected `data` to be a 1-D stream of token ids or an iterable "
                f"of `(x, y)` batches. Received an array of shape {array.shape}"
            )
        return array
    if not hasattr(data, "__iter__"):
        raise ValueError(
            "Expected `data` to be a 1-D stream of token ids or an iterable of "
            f"`(x, y)` batches. Received: {type(data).__name__}"
        )
    return None
