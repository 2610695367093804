"""Dynamic evaluation (Krause et al., 2018) with a fit-style API.

The public class. Its parts live in private modules: the checks and
conversions of its arguments (`_dynamic_checks`), the gradient statistics
(`_gradient_statistics`), the compiled steps and the inputs of the update
(`_adaptation_step`), one pass over the streams (`_dynamic_pass`) and
adaptive generation (`_adaptive_generation`). They never import this module.
"""

import contextlib
import functools

import keras

from keras_mogrifier import _validation
from keras_mogrifier.evaluation import _adaptation_step
from keras_mogrifier.evaluation import _adaptive_generation
from keras_mogrifier.evaluation import _documents
from keras_mogrifier.evaluation import _dynamic_checks
from keras_mogrifier.evaluation import _dynamic_pass
from keras_mogrifier.evaluation import _gradient_statistics
from keras_mogrifier.evaluation import _lora
from keras_mogrifier.evaluation import _token_model
from keras_mogrifier.evaluation import update_rules
from keras_mogrifier.evaluation._dynamic_checks import ADAPTATION_KERNEL_NAME  # noqa: F401
from keras_mogrifier.evaluation._dynamic_checks import checked_property as _checked
from keras_mogrifier.evaluation._stream_scoring import SEGMENTS_PER_CALL

NORMALIZERS = ("tensor_mean", "global_mean")


def _with_lora(method):
    """Runs `method` with the evaluator's LoRA factors attached (if any)."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        with self._adaptation_scope():
            return method(self, *args, **kwargs)

    return wrapped


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
    Mogrifier authors' code). With `learning_rate=0` the weights stay θ_g
    bit for bit and the result equals static evaluation (`adapt=False`) to
    float rounding, not to the last bit, since static scoring may read many
    segments per call (perplexity 475.925576 against 475.925579 on a briefly
    trained PTB model); with `decay_rate=0` it is RMS-normalised SGD. This is
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
    with dropout off, so the model need not be compiled. A keras-hub
    `CausalLM` (GPT-2, OPT, Llama, ...) is accepted as it is (it is called
    with an all-ones `padding_mask`), and so is a bare keras-hub backbone
    (its hidden states projected through its `ReversibleEmbedding`).
    Recurrent state is carried across segments when the model keeps it in
    variables: the `states` of stateful `keras.layers.RNN` layers, and the
    list `recurrent_state_variables` of the model or any of its layers. A
    model without state variables (a transformer) reads its context from a
    window instead: each segment is scored — and its gradient taken — in one
    call on the `context_length` tokens that end with the segment's last
    input (all there are near the start), as static sliding-window scoring
    does; each segment then costs a forward and backward pass over the
    window. Afterwards the model holds its trained weights and its recurrent
    state again, exactly, also when the evaluation fails or is interrupted.

    Documents: with `reset="document"` every document starts from θ_g and a
    zero state (or no context): `evaluate` takes a list of documents, or a
    stream cut after every `separator` token (the separator ends one
    document and is the context-only first token of the next, so the same
    tokens are scored as with `reset="never"`, the default, which adapts
    across the whole stream).

    LoRA (`lora_rank=r`): instead of the weights, the evaluator adapts
    low-rank factors `A, B` (Keras 3's own `layer.enable_lora(r)`, `B = 0` at
    first) on every `Dense`, `EinsumDense` and `Embedding` layer; they are
    attached to the model only while the evaluator runs (inside `evaluate`,
    `collect_gradient_statistics` and an `adapt_to` block) and removed
    afterwards, leaving the model's variables exactly as they were.

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
        context_length: int or `None`. For a model without carried state:
            the tokens of the window each segment is scored in (at least
            `segment_length`, at most the model's maximum). Defaults to
            `None`: the model's maximum sequence length (a keras-hub model
            without one, such as Llama, needs it given; any other model
            without one scores each segment alone). Refused for a model
            that carries its state.
        reset: str. `"never"` (adapt across the whole stream) or
            `"document"` (θ_g and the state back at every document).
            Defaults to `"never"`.
        separator: int, a list of ints or `None`. With `reset="document"`,
            the token id(s) that end a document in a stream. Defaults to
            `None` (`evaluate` then takes a list of documents).
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
        lora_rank: int or `None`. Adapt rank-`lora_rank` LoRA factors of
            every `Dense`, `EinsumDense` and `Embedding` layer instead of
            the weights (not with `variables` or `sparse`). Defaults to
            `None`.
        lora_alpha: int or `None`. LoRA's scale is `lora_alpha / lora_rank`.
            Defaults to `None` (`lora_rank`: scale 1).
        vocabulary_size: int or `None`. Token ids must lie in
            `[0, vocabulary_size)`. Defaults to `None`: taken from the model
            (`model.vocabulary_size`, its output shape and its `Embedding`
            layers).
        jit_compile: bool or `"auto"`. Compile the steps with XLA. Defaults to
            `"auto"`: whenever every layer supports XLA (JAX always compiles;
            PyTorch runs eagerly).
        validation_data: 1-D or `(streams, time)` token ids or `None`. The
            stream evaluated in `fit`. Defaults to `None`.
        gradient_data: the `data` of `collect_gradient_statistics` used in
            `fit` (re-iterable: it is read every time). Defaults to `None`.
        gradient_steps: int or `None`. `steps` for `gradient_data`. Defaults
            to `None`.
        gradient_batch_size: int. `batch_size` for `gradient_data` (for a
            model scored in windows: windows of `context_length` tokens per
            batch, `batch × K × vocabulary` logits; lower it for long
            windows). Defaults to `100`.
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
        context_length=None,
        reset="never",
        separator=None,
        normalizer="tensor_mean",
        update_rule="rms_rms_prior",
        variables=None,
        sparse=False,
        lora_rank=None,
        lora_alpha=None,
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
        _lora.check_lora(lora_rank, lora_alpha)
        if lora_rank is not None and (sparse or variables is not None):
            raise ValueError(
                "Expected one way of choosing the adapted variables: "
                "`lora_rank`, `sparse=True` or `variables`. Received: "
                f"lora_rank={lora_rank}, sparse={sparse!r}, variables={variables!r}"
            )
        _dynamic_checks.check_constructor_arguments(
            model, variables, sparse, jit_compile, vocabulary_size, gradient_steps,
            gradient_batch_size, validation_batch_size, frequency, verbose,
            validation_data, gradient_data, update_rule,
        )
        self.learning_rate = learning_rate
        self.decay_rate = decay_rate
        self.epsilon = epsilon
        self.segment_length = segment_length
        self.context_length = context_length
        self.reset = reset
        _documents.check_separator(separator, vocabulary_size)
        self.separator = separator
        self.normalizer = normalizer
        self.update_rule = update_rule
        self.variables = variables
        self.sparse = sparse
        self.lora_rank = lora_rank
        self.lora_alpha = lora_alpha
        self._lora = None  # (the model run, its `LoraAdapters`)
        self.vocabulary_size = vocabulary_size
        self.jit_compile = jit_compile
        self.validation_data = validation_data
        self.gradient_data = gradient_data
        self.gradient_steps = gradient_steps
        self.gradient_batch_size = gradient_batch_size
        self.validation_batch_size = validation_batch_size
        self.frequency = frequency
        self.verbose = verbose
        self._steps = _adaptation_step.CompiledSteps()  # the compiled functions
        self._steps_signature = (lora_rank, lora_alpha)  # the LoRA they were built with
        self._statistics = None  # (variables, [MS_g tensors in the variables' shapes])
        self.adaptation_results = None  # what `adapt_to` scored while adapting
        self._adapted_documents = []  # the enclosing `adapt_to` blocks
        self._token_model = None  # (the model, the `ids -> logits` model run)
        self._causal_checked = None  # the windowed model found causal
        if model is not None:
            self.set_model(model)
            token_model = model
            if model.built:
                token_model = self._require_model()
                self._context_window(token_model)  # a `context_length` it cannot read
                self._lora_adapters()  # `lora_rank` on a model without LoRA layers
            limit = self._vocabulary_limit(token_model)  # a larger `vocabulary_size`: refused
            _documents.check_separator(separator, limit)  # an id beyond the vocabulary

    # === Hyperparameters (validated whenever set) ===

    learning_rate = _checked("learning_rate", _validation.non_negative_float)
    decay_rate = _checked("decay_rate", _validation.non_negative_float)
    epsilon = _checked("epsilon", _validation.positive_float)
    segment_length = _checked("segment_length", _validation.positive_int)
    context_length = _checked("context_length", _validation.optional_positive_int)
    reset = _checked("reset", _validation.one_of, _documents.RESETS)
    update_rule = _checked("update_rule", _validation.one_of, update_rules.UPDATE_RULES)
    normalizer = _checked("normalizer", _validation.one_of, NORMALIZERS)

    # === Adapted variables and statistics ===

    @_with_lora
    def adapted_variables(self):
        """The model's variables that dynamic evaluation adapts (a list).

        With `lora_rank`, the LoRA factors `[A, B]` of every layer that
        takes LoRA (they belong to the model only while the evaluator runs).
        """
        if self.lora_rank is not None:
            return self._lora_adapters().variables()
        return _dynamic_checks.select_adapted_variables(
            self._require_model(), self.sparse, self.variables
        )

    @property
    def gradient_statistics(self):
        """`{variable.path: MS_g}` as NumPy arrays, or `None` before collection.

        Assign a dict of the same form (e.g. saved from an earlier run on the
        same trained weights) to skip `collect_gradient_statistics`.
        """
        return _gradient_statistics.as_numpy(self._statistics)

    @gradient_statistics.setter
    @_with_lora
    def gradient_statistics(self, values):
        if values is None:
            self._statistics = None
            return
        self._statistics = _gradient_statistics.from_values(self.adapted_variables(), values)

    @_validation.ids_checked()  # here, once (the model's calls need not)
    @_with_lora
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
                Defaults to `None`: the evaluator's `segment_length`, or for
                a model without carried state its context window (a
                transformer's statistics come from batches of its context
                length, as in training).

        Returns:
            A dict with `loss` (the mean training loss over the batches) and
            `num_batches`.
        """
        self._statistics, logs = _gradient_statistics.collect(
            self, data, steps, batch_size, segment_length
        )
        return logs

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
                is context only; `x[..., 1:]` are predicted. With
                `reset="document"`, also a list of documents (1-D sequences
                of ids, each with its first token as context); their
                `token_losses` are then a list, one array per document.
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

        `document` is one document whatever `reset` says: it is adapted on
        from θ_g as a whole, a separator in it read as any other token.

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
        return self._adapted(document, vocabulary, verbose)

    @contextlib.contextmanager
    def _adapted(self, document, vocabulary, verbose):
        with self._adaptation_scope():
            with _adaptive_generation.adapt_to(self, document, vocabulary, verbose) as model:
                yield model

    @_with_lora
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

    @_with_lora
    def _evaluate(self, x, batch_size, callbacks, verbose, adapt, return_token_losses,
                  stop_on_divergence, keep_adapted):
        # `evaluate`; with `keep_adapted`, the adapted weights stay in the
        # model when the stream is done (not after an error).
        return _dynamic_pass.run(
            self, x, batch_size, callbacks, verbose, adapt, return_token_losses,
            stop_on_divergence, keep_adapted, segments_per_call=SEGMENTS_PER_CALL,
        )

    def settings(self):
        """The evaluator's hyperparameters as a dict (what a report names)."""
        return {
            "update_rule": self.update_rule,
            "learning_rate": self.learning_rate,
            "decay_rate": self.decay_rate,
            "epsilon": self.epsilon,
            "segment_length": self.segment_length,
            "normalizer": self.normalizer,
            "context_length": self.context_length,
            "reset": self.reset,
            "separator": self.separator,
            "lora_rank": self.lora_rank,
            "lora_alpha": self.lora_alpha,
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
        """The `ids -> logits` model run: the model, or its keras-hub wrapper."""
        model = _dynamic_checks.require_model(self._model)
        if self._token_model is None or self._token_model[0] is not model:
            self._token_model = (model, _token_model.token_model(model))
        return self._token_model[1]

    def _lora_adapters(self):
        """The `LoraAdapters` of the model run (`lora_rank`), or `None`."""
        if self.lora_rank is None:
            return None
        model = self._require_model()
        if self._lora is None or self._lora[0] is not model or (
            (self._lora[1].rank, self._lora[1].alpha) != (self.lora_rank, self.lora_alpha)
        ):
            self._lora = (model, _lora.LoraAdapters(model, self.lora_rank, self.lora_alpha))
        return self._lora[1]

    def _adaptation_scope(self):
        """A block in which the model holds its LoRA factors (with `lora_rank`)."""
        adapters = self._lora_adapters() if self._model is not None else None
        return adapters.attached() if adapters is not None else contextlib.nullcontext()

    def _context_window(self, model):
        """`K`, the window each segment is scored in, or `None` (carried state).

        A windowed model must be causal (a window may hold tokens after the
        segment): checked once per model with a probe (`check_causal`).
        """
        width = _dynamic_checks.context_window(
            model, self.context_length, self.segment_length
        )
        if width is not None and self._causal_checked is not model:
            _dynamic_checks.check_causal(model, width, self._vocabulary_limit(model))
            self._causal_checked = model
        return width

    def _vocabulary_limit(self, model):
        return _dynamic_checks.vocabulary_limit(model, self.vocabulary_size)

    def _update_inputs(self, variables):
        """`(rms, hyperparameters)` for the update of `variables`, or a ValueError."""
        return _adaptation_step.update_inputs(variables, self._statistics, self.settings())

    def _step(self, kind, variables, per_stream=None):
        """The compiled function `kind` for `variables` (see `CompiledSteps.get`)."""
        # A step traced with other LoRA factors (or none) reads other variables.
        signature = (self.lora_rank, self.lora_alpha)
        if self._steps_signature != signature:
            self._steps = _adaptation_step.CompiledSteps()
            self._steps_signature = signature
        return self._steps.get(
            self._require_model(), kind, variables, self.jit_compile, self.update_rule,
            per_stream,
        )
