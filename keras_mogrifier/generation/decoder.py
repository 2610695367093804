"""A stateful language model driven one step at a time: the decoding loop's core."""

import contextlib

import keras
import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier import backend as backend_seam
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.samplers.beam_sampler import BeamSampler
from keras_mogrifier.samplers.greedy_sampler import GreedySampler
from keras_mogrifier.samplers.random_sampler import RandomSampler
from keras_mogrifier.samplers.sampler import Sampler
from keras_mogrifier.samplers.sampler import inputs_checked
from keras_mogrifier.samplers.sampler import stable_logits
from keras_mogrifier.samplers.top_k_sampler import TopKSampler
from keras_mogrifier.samplers.top_p_sampler import TopPSampler

# Lengths of the windows in which known tokens (prompts, scored texts) are
# read: few compiled shapes, few calls. What is left over is read one step
# at a time.
WINDOWS = (64, 16, 4)
_BUILT_IN_SAMPLERS = (BeamSampler, GreedySampler, RandomSampler, TopKSampler, TopPSampler)
# The score of an empty beam: far below any sum of log-probabilities.
_NO_BEAM = -1e9


class Decoder:
    """Runs a stateful `LanguageModel` through its carried state.

    A `LanguageModel` with `stateful=True` keeps each row's recurrent state
    in `recurrent_state_variables` from one call to the next, so text is
    read once: a window of known tokens is one call (`read`), each new token
    one call (`step`). Both are compiled once per input shape with the
    backend seam's `model_function`, which keeps the state the model
    assigns. Each call goes through `LanguageModel.call_with_cache` with the
    leading rows of the carried state as the cache, written back after it
    (`logits_through_cache`; the numbers of a stateful call). Rows are the
    first `b` rows of the model's state (`b` at most `capacity`); the state
    is not reset between calls — `fresh_state()` starts from zero and restores the carried state afterwards.

    Every argument is checked on the host before anything runs (token ids:
    integers in `[0, vocabulary_size)`, one per row; uniforms: floats in
    `[0, 1)`, one per row; the sampler: one of the right kind), with a
    `ValueError` that names it; and a step that fails all the same (a
    custom sampler that raises) leaves the carried state as it was, on
    every backend.

    The logits are the model's at evaluation: dropout off, one sample,
    multiplied by the model's softmax temperature.

    Args:
        model: a built `LanguageModel` with `stateful=True`.
        jit_compile: bool or `"auto"`. Compile with XLA (see
            `keras_mogrifier.backend`). Defaults to `"auto"`.

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.models import LanguageModel
    >>> model = LanguageModel(20, units=8, num_layers=1, batch_size=2)
    >>> model.build((2, None))
    >>> decoder = Decoder(model)
    >>> with decoder.fresh_state():
    ...     next_ids, log_probs = decoder.step(np.array([3, 4]), np.zeros(2, "float32"))
    >>> tuple(log_probs.shape)
    (2, 20)
    """

    def __init__(self, model, jit_compile="auto"):
        check_model(model)
        if jit_compile not in ("auto", True, False):
            raise ValueError(
                "Expected `jit_compile` to be True, False or 'auto'. "
                f"Received: jit_compile={jit_compile!r}"
            )
        self.model = model
        backend = get_backend_module()
        if jit_compile == "auto":
            jit_compile = backend.default_jit_compile(model, many_steps=False)
        self.jit_compile = bool(jit_compile)
        self._backend = backend
        self._read = backend.model_function(model, self._read_fn, self.jit_compile)
        # A known token changes only the state: the package's own
        # `call_with_cache` computes the state with its backbone alone.
        from keras_mogrifier.models.language_model import LanguageModel

        self._reads_backbone = (
            isinstance(model, LanguageModel)
            and type(model).call_with_cache is LanguageModel.call_with_cache
        )
        self._advance = backend.model_function(model, self._advance_fn, self.jit_compile)
        self._steps = {}

    @property
    def capacity(self):
        """How many rows can run at once (the rows of the carried state)."""
        return int(self.model.recurrent_state_variables[0].shape[0])

    @contextlib.contextmanager
    def fresh_state(self):
        """Zero recurrent state inside; the carried state is restored on exit."""
        states = self.model.recurrent_state_variables
        saved = [ops.copy(v.value) for v in states]
        try:
            self.reset_state()
            yield self
        finally:
            for v, value in zip(states, saved):
                v.assign(value)

    def reset_state(self):
        """Zeroes the recurrent state of every row."""
        for v in self.model.recurrent_state_variables:
            v.assign(ops.zeros(v.shape, v.dtype))

    def read(self, inputs, targets):
        """Reads `inputs` `(b, t)` and returns `log p(targets)` `(b, t)`."""
        inputs = self._ids("inputs", inputs, 2)
        targets = self._ids("targets", targets, 2)
        if targets.shape != inputs.shape:
            raise ValueError(
                "Expected `targets` of the shape of `inputs` "
                f"{inputs.shape}. Received: targets.shape={targets.shape}"
            )
        return self._guarded(self._read, _int_tensor(inputs), _int_tensor(targets))

    def step(self, tokens, uniform, sampler=None):
        """Reads one token per row and picks the next.

        Args:
            tokens: int `(b,)`. The current token of every row.
            uniform: float32 `(b,)` in `[0, 1)`. The step's randomness.
            sampler: a `Sampler` or `None` (greedy).

        Returns:
            `(next_tokens, log_probs)`: int32 `(b,)` and the model's
            log-probabilities of the next token, float32 `(b, vocabulary)`.
        """
        sampler = GreedySampler() if sampler is None else sampler
        if not isinstance(sampler, Sampler) or isinstance(sampler, BeamSampler):
            raise ValueError(
                "Expected a `keras_mogrifier.samplers.Sampler` that picks one "
                "token per row (beam search runs through `beam_step`). "
                f"Received: sampler={sampler!r}"
            )
        tokens = self._ids("tokens", tokens, 1)
        uniform = _uniforms(uniform, tokens.shape[0])
        return self._guarded(
            self._compiled_step(sampler),
            _int_tensor(tokens),
            ops.convert_to_tensor(uniform, "float32"),
        )

    def _compiled_step(self, sampler):
        key = ("step",) + _sampler_key(sampler)
        step = self._steps.get(key)
        if step is None:
            step = self._backend.model_function(
                self.model, self._step_fn(sampler), self.jit_compile
            )
            self._steps[key] = step
        return step

    def generation_steps(self, sampler):
        """`read_known` and `step` for a loop that checked its own inputs.

        `generate`'s loop: its ids are its prompts' (checked) and the
        sampler's own, its uniforms its generator's. Returns `(read,
        step)`. `read(tokens, length)` reads `tokens[:, :length]` (int32
        host array `(b, t)`) into the carried state and returns how many it
        read: all of them, or — where the model is compiled, as
        `read_known` — whole windows, the rest left to `step`. `step(tokens,
        uniform) -> next_tokens` (int32 `(b,)` ids, float32 `(b,)` uniforms
        in `[0, 1)`; int32 `(b,)` out, on the host) advances the carried
        state as `step` does and returns the ids `step` returns — without
        the log-probabilities, without checking its inputs again, and
        without the saved copy of the state that `step` restores on an
        error: run both inside `fresh_state()`, which restores the carried
        state however the loop ends. Where the backend has a decoding step
        of its own for the model (`keras_mogrifier.backend.decoding_step`:
        PyTorch's, which runs eagerly), it runs both, token by token, a
        known token without the output layer; it reads the weights once,
        so ask for the steps once per generation.

        Args:
            sampler: a `Sampler` that picks one token per row (not a
                `BeamSampler`).
        """
        if not isinstance(sampler, Sampler) or isinstance(sampler, BeamSampler):
            raise ValueError(
                "Expected a `keras_mogrifier.samplers.Sampler` that picks one "
                f"token per row. Received: sampler={sampler!r}"
            )
        own = backend_seam.decoding_step(self.model)
        if own is not None:

            def read_each(tokens, length):
                for position in range(length):
                    own(np.ascontiguousarray(tokens[:, position]))
                return length

            return read_each, lambda tokens, uniform: own(tokens, uniform, sampler)
        compiled = self._compiled_step(sampler)

        def compiled_step(tokens, uniform):
            with _validation.ids_checked():
                sampled, _ = compiled(_int_tensor(tokens), ops.convert_to_tensor(uniform))
            return np.asarray(ops.convert_to_numpy(sampled))

        return self.read_known, compiled_step

    def beam_step(self, tokens, scores, generating, forced, finished, pad, sampler):
        """One step of beam search; the state rows follow their beams.

        Row `i · B + j` of the state is beam `j` of prompt `i` (`B` =
        `sampler.num_beams`). Each beam reads its current token; the `B`
        best extensions of each prompt's beams become its new beams, and
        the state rows are reordered to match.

        Args:
            tokens: int `(b · B,)`. Each beam's current token.
            scores: float32 `(b, B)`. Each beam's total log-probability.
            generating: bool `(b,)`. Prompts past their prompt tokens; the
                others keep their beams and take `forced`.
            forced: int `(b,)`. The next prompt token of the others.
            finished: bool `(b · B,)`. Beams that ended with a stop token:
                their only extension is `pad`, at no cost.
            pad: int. The token that extends a finished beam.
            sampler: a `BeamSampler`.

        Returns:
            `(next_tokens (b · B,), scores (b, B), parents (b, B))`.
        """
        if not isinstance(sampler, BeamSampler):
            raise ValueError(
                "Expected a `keras_mogrifier.samplers.BeamSampler` for "
                f"`beam_step`. Received: sampler={sampler!r}"
            )
        beams = sampler.num_beams
        tokens = self._ids("tokens", tokens, 1)
        if tokens.shape[0] % beams:
            raise ValueError(
                f"Expected `tokens` to hold num_beams={beams} rows per prompt. "
                f"Received: tokens.shape={tokens.shape}"
            )
        prompts = tokens.shape[0] // beams
        scores = np.asarray(_validation.to_host(scores), "float32")
        if scores.shape != (prompts, beams) or np.isnan(scores).any():
            raise ValueError(
                f"Expected `scores` of shape {(prompts, beams)}, without NaN. "
                f"Received: scores of shape {scores.shape}"
            )
        generating = _flags("generating", generating, (prompts,))
        finished = _flags("finished", finished, (prompts * beams,))
        forced = _validation.token_ids(
            "forced", forced, self.model.vocabulary_size, ndim=1
        )
        if forced.shape != (prompts,):
            raise ValueError(
                f"Expected `forced` of shape {(prompts,)}. Received: "
                f"forced.shape={forced.shape}"
            )
        pad = _validation.token_ids(
            "pad", np.asarray(pad), self.model.vocabulary_size, ndim=0
        )
        key = ("beam",) + _sampler_key(sampler)
        step = self._steps.get(key)
        if step is None:
            step = self._backend.model_function(
                self.model, self._beam_step_fn(sampler), self.jit_compile
            )
            self._steps[key] = step
        return self._guarded(
            step,
            _int_tensor(tokens),
            ops.convert_to_tensor(scores, "float32"),
            ops.convert_to_tensor(generating),
            _int_tensor(forced),
            ops.convert_to_tensor(finished),
            _int_tensor(pad),
        )

    def _ids(self, name, ids, ndim):
        """Token ids checked on the host: integers in range, rows ≤ capacity."""
        ids = _validation.token_ids(name, ids, self.model.vocabulary_size, ndim=ndim)
        if ids.shape[0] > self.capacity or ids.shape[0] == 0 or (
            ndim == 2 and ids.shape[1] == 0
        ):
            raise ValueError(
                f"Expected `{name}` to have between 1 and {self.capacity} rows "
                "(the rows of the model's recurrent state) and at least one "
                f"token. Received: {name}.shape={ids.shape}"
            )
        return ids

    def _guarded(self, step, *args):
        # A step that raises (a custom sampler, an interrupt) leaves the
        # carried state as it was: on PyTorch the model has assigned it by
        # then.
        # Every entry point checked its ids on the host before: the model
        # call does not scan them again (PyTorch runs it eagerly).
        states = self.model.recurrent_state_variables
        saved = [ops.copy(v.value) for v in states]
        try:
            with _validation.ids_checked():
                return step(*args)
        except BaseException:
            for variable, value in zip(states, saved):
                variable.assign(value)
            raise

    def read_known(self, tokens, length):
        """Reads `tokens[:, :length]` in windows; returns how many were read.

        Whole windows of `WINDOWS` lengths only: the rest (fewer than the
        shortest window) is left for `step`. Only the carried state
        changes: no log-probabilities are computed (the package's
        `LanguageModel` runs its backbone alone), the state is the one
        `read` leaves.
        """
        position = 0
        for window in WINDOWS:
            while length - position >= window:
                inputs = self._ids("tokens", tokens[:, position : position + window], 2)
                self._guarded(self._advance, _int_tensor(inputs))
                position += window
        return position

    def _advance_fn(self, inputs):
        # What `_read_fn` does to the carried state, without the logits of
        # every known token (a window's output layer is most of its work).
        model = self.model
        if self._reads_backbone:
            _through_cache(model, inputs, model.backbone.call_with_state)
        else:
            _through_cache(model, inputs, model.call_with_cache)
        return ops.zeros((), "int32")

    def _read_fn(self, inputs, targets):
        logits = logits_through_cache(self.model, inputs)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        return ops.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]

    def _step_fn(self, sampler):
        model = self.model

        def sampling_step(tokens, uniform):
            logits = logits_through_cache(model, tokens[:, None])
            logits = ops.cast(logits[:, 0], "float32")
            with inputs_checked():  # the uniforms on the host, before
                return sampler(logits, uniform), ops.log_softmax(logits, axis=-1)

        return sampling_step


    def _beam_step_fn(self, sampler):
        model = self.model
        beams = sampler.num_beams

        def beam_search_step(tokens, scores, generating, forced, finished, pad):
            logits = logits_through_cache(model, tokens[:, None])
            logits = ops.cast(logits[:, 0], "float32")
            log_probs = ops.log_softmax(
                stable_logits(logits, sampler.temperature), axis=-1
            )
            vocabulary = log_probs.shape[-1]
            only_pad = ops.where(
                ops.equal(ops.arange(vocabulary, dtype="int32"), pad), 0.0, _NO_BEAM
            )
            log_probs = ops.where(finished[:, None], only_pad[None, :], log_probs)
            prompts = ops.shape(scores)[0]
            candidates = ops.reshape(
                scores[:, :, None] + ops.reshape(log_probs, (prompts, beams, vocabulary)),
                (prompts, beams * vocabulary),
            )
            best, index = ops.top_k(candidates, k=beams, sorted=True)
            index = ops.cast(index, "int32")
            same = ops.broadcast_to(ops.arange(beams, dtype="int32")[None, :], ops.shape(index))
            parents = ops.where(generating[:, None], index // vocabulary, same)
            next_tokens = ops.where(
                generating[:, None], index % vocabulary, ops.cast(forced, "int32")[:, None]
            )
            scores = ops.where(generating[:, None], best, scores)
            rows = ops.reshape(
                ops.arange(prompts, dtype="int32")[:, None] * beams + parents, (-1,)
            )
            for variable in model.recurrent_state_variables:
                value = ops.convert_to_tensor(variable)
                reordered = ops.take(value, rows, axis=0)
                variable.assign(ops.slice_update(value, (0, 0), reordered))
            return ops.reshape(next_tokens, (-1,)), scores, parents

        return beam_search_step


def logits_through_cache(model, ids):
    """The model's logits of `ids` at evaluation, through `call_with_cache`.

    The cache is the leading rows of the carried state (`b` rows of
    `recurrent_state_variables` for `b` rows of ids), written back after
    the call: the same numbers as a stateful call at evaluation
    (`model(ids, training=False)`: dropout off, temperature applied), with
    the recurrent state handed over as keras-hub's samplers hand a cache.
    """
    return _through_cache(model, ids, model.call_with_cache)


def _through_cache(model, ids, call):
    """`call(ids, cache)`'s first output, the cache being the leading rows
    of the carried state, written back after it."""
    variables = model.recurrent_state_variables
    rows = ops.shape(ids)[0]
    cache = [model._read_state(variable, rows) for variable in variables]
    output, _, cache = call(ids, cache)
    for variable, state in zip(variables, cache):
        model._write_state(variable, state)
    return output


def decoder_for(model, jit_compile="auto"):
    """The model's `Decoder` (one per setting, kept on the model)."""
    check_model(model)
    cache = model.__dict__.get("_decoders")
    if cache is None:
        cache = {}
        # Plain attribute: not tracked or saved by Keras.
        object.__setattr__(model, "_decoders", cache)
    decoder = cache.get(jit_compile)
    if decoder is None:
        decoder = cache[jit_compile] = Decoder(model, jit_compile)
    return decoder


def check_model(model):
    """A `ValueError` unless `model` can be driven through its carried state."""
    if not isinstance(model, keras.Model) or not hasattr(model, "vocabulary_size"):
        raise ValueError(
            "Expected a `keras_mogrifier.LanguageModel`. "
            f"Received: {type(model).__name__}"
        )
    if not getattr(model, "stateful", False):
        raise ValueError(
            "Expected a stateful LanguageModel: generation and scoring carry "
            "the recurrent state from one step to the next (use "
            "`model.with_options(stateful=True, batch_size=n)`). Received: "
            "stateful=False"
        )
    if not model.built or not getattr(model, "recurrent_state_variables", None):
        raise ValueError(
            "Expected a built model (call it once, or `model.build((batch, "
            f"None))`). Received an unbuilt model: {model.name}"
        )


def _sampler_key(sampler):
    # A built-in sampler is known by its settings (a new `TopKSampler(k=5)`
    # reuses the compiled step); any other by identity, since its
    # `get_config` need not cover everything `get_next_token` reads.
    if type(sampler) in _BUILT_IN_SAMPLERS:
        return (type(sampler).__name__, tuple(sorted(sampler.get_config().items())))
    return ("object", id(sampler), sampler)


def _int_tensor(x):
    # Called on ids already checked (integers in range).
    return ops.convert_to_tensor(np.asarray(x, "int32"))


def _uniforms(uniform, rows):
    """One float in `[0, 1)` per row, as float32, or a ValueError."""
    try:
        array = np.asarray(_validation.to_host(uniform))
    except Exception as error:
        raise ValueError(
            f"Expected `uniform` to be {rows} numbers in [0, 1). Received: "
            f"{type(uniform).__name__}"
        ) from error
    if array.dtype == bool or not np.issubdtype(array.dtype, np.number) or (
        array.shape != (rows,)
    ):
        raise ValueError(
            f"Expected `uniform` to be a float array of shape ({rows},), one "
            f"number in [0, 1) per row. Received: uniform of shape "
            f"{array.shape} and dtype {array.dtype}"
        )
    array = array.astype("float32")
    bad = ~((array >= 0.0) & (array < 1.0))
    if bad.any():
        raise ValueError(
            "Expected `uniform` to hold numbers in [0, 1). Received: "
            f"{float(array[bad][0])} at row {int(np.flatnonzero(bad)[0])}"
        )
    return array


def _flags(name, value, shape):
    array = np.asarray(_validation.to_host(value))
    if array.dtype != bool or array.shape != shape:
        raise ValueError(
            f"Expected `{name}` to be a bool array of shape {shape}. "
            f"Received: shape {array.shape}, dtype {array.dtype}"
        )
    return array
