"""One pass of dynamic evaluation over token streams.

`run` is `DynamicEvaluator.evaluate` (and the adapting pass of `adapt_to`):
every check of the call, then `score_stream` (the segment loop every
test-time method shares) with the evaluator's compiled step — one forward
call per window of many segments (or the forward loop) for a static pass,
the adaptation loop otherwise — and the trained
weights restored afterwards (kept, for `adapt_to`, when the pass completes).
"""

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier import backend
from keras_mogrifier.evaluation import _documents
from keras_mogrifier.evaluation import _dynamic_checks as checks
from keras_mogrifier.evaluation import _recurrent_state
from keras_mogrifier.evaluation._stream_scoring import progress_verbosity
from keras_mogrifier.evaluation._stream_scoring import score_stream

# Static scoring of a stateful `LanguageModel` in windows of many segments
# (`scores_windows_whole`); `False` scores every segment in a call of its own.
WHOLE_WINDOW = True
# The most logits (float32) a static scoring call computes at once.
WINDOW_LOGITS = 2**23


def scores_windows_whole(model):
    """Whether `model`'s losses on a window equal those on its segments in turn.

    True for a stateful `LanguageModel`: its state carries from call to call
    and nothing in it depends on where a call starts, so without adaptation
    `K` segments scored one after the other are one window of `K · n`
    tokens. A model the evaluator knows less about keeps a call per segment.
    """
    from keras_mogrifier.models.language_model import LanguageModel

    return WHOLE_WINDOW and isinstance(model, LanguageModel) and model.stateful


def run(
    evaluator,
    x,
    batch_size,
    callbacks,
    verbose,
    adapt,
    return_token_losses,
    stop_on_divergence,
    keep_adapted,
    segments_per_call,
):
    """`DynamicEvaluator.evaluate`; with `keep_adapted`, the adapted weights
    stay in the model when the stream is done (not after an error).

    Runs `segments_per_call` segments per compiled call, or one when
    callbacks are given.
    """
    if not isinstance(adapt, bool):
        raise ValueError(f"Expected `adapt` to be a bool. Received: adapt={adapt!r}")
    if not isinstance(stop_on_divergence, bool):
        raise ValueError(
            "Expected `stop_on_divergence` to be a bool. Received: "
            f"stop_on_divergence={stop_on_divergence!r}"
        )
    checks.check_verbose(verbose)
    verbose = progress_verbosity(verbose)
    callbacks = checks.check_callbacks(callbacks)
    _validation.optional_positive_int("batch_size", batch_size)
    model = evaluator._require_model()
    limit = evaluator._vocabulary_limit(model)
    documents = None
    if evaluator.reset == "document" and not keep_adapted:
        # Each document from θ_g and a zero state (`_documents`).
        if callbacks:
            raise ValueError(
                "Expected no `callbacks` with `reset='document'` (documents "
                f"are scored one by one). Received: {len(callbacks)} callbacks"
            )
        documents = _documents.split(x, evaluator.separator, limit)
        streams = None
    else:
        streams = checks.as_streams(x, "x", limit)

    variables, rms, hyperparameters = [], [], None
    stream_size = checks.per_stream_size(model)
    if adapt:
        variables = evaluator.adapted_variables()
        rms, hyperparameters = evaluator._update_inputs(variables)
        if not all(checks.is_per_stream(v) for v in variables):
            if batch_size not in (None, 1):
                raise ValueError(
                    "Expected `batch_size=1`: dynamic evaluation of shared "
                    "weights adapts one stream at a time (use per-stream "
                    "`adaptation_kernel` matrices to adapt streams in "
                    f"parallel). Received: batch_size={batch_size}"
                )
    if documents is not None and stream_size is not None:
        raise ValueError(
            "Expected shared adapted weights with `reset='document'` (documents "
            "are scored one at a time). Received: a model with per-stream "
            f"`adaptation_kernel` matrices ({stream_size} streams)"
        )
    if batch_size is None:
        batch_size = stream_size or 1
    if stream_size is not None and batch_size != stream_size:
        raise ValueError(
            f"Expected `batch_size` to equal the number of per-stream "
            f"adaptation matrices ({stream_size}). Received: batch_size={batch_size}"
        )
    checks.check_batch_size(model, batch_size, "`batch_size`")
    segment_length = evaluator.segment_length
    # A model without carried state: each segment in a window of `width`.
    width = evaluator._context_window(model)
    checks.check_output(model, batch_size, width or segment_length, limit)

    settings = evaluator.settings()
    # Many segments per compiled call (no host round trip between them),
    # unless callbacks were given: they see the model after every
    # segment, so each segment is then a call of its own.
    per_call = 1 if callbacks else segments_per_call
    # Whether `score_segments` below runs a backend loop, one program for a
    # call of any number of segments (else calls of `per_call` or one).
    any_count = False
    # A compiling backend scores a text's last call padded to the others'
    # shape (one program per model); an eager one (PyTorch) scores it at its
    # own length: padding would be work for nothing (a short text's whole
    # window otherwise, 100 of 1,600 tokens for a 1,500-token text).
    compiles = backend.compiles_per_shape()
    if not adapt and width is None and scores_windows_whole(model):
        # Nothing changes the weights between segments: a call's `K`
        # segments are one window of `K · n` tokens for a model whose state
        # carries from call to call (the same steps, fewer calls), in
        # windows of at most `WINDOW_LOGITS` logits.
        forward = evaluator._step("forward", [])
        rows = max(1, WINDOW_LOGITS // (batch_size * int(model.vocabulary_size)))

        def window(array, start, stop):
            # (K, batch, n) segments -> (batch, K·n) columns.
            block = array[start:stop]
            return ops.convert_to_tensor(
                np.ascontiguousarray(block.transpose(1, 0, 2).reshape(block.shape[1], -1))
            )

        # Eager: the last call is the rest of the text, of any length.
        any_count = not compiles

        def score_segments(x, y, w, group, first):
            count, batch, n = x.shape
            per_window = max(1, rows // n)
            losses = []
            for start in range(0, count, per_window):
                stop = min(count, start + per_window)
                if not w[start:].any():
                    # Only the padding of a call's last segments is left
                    # (`score_stream` pads the last call to `K` segments):
                    # nothing to score, the state is not read again.
                    losses.append(np.zeros((count - start, batch, n), "float32"))
                    break
                losses.append(
                    checks.host_array(forward(window(x, start, stop), window(y, start, stop)))
                    .reshape(batch, stop - start, n).transpose(1, 0, 2)
                )
            return np.concatenate(losses, axis=0)

    elif not adapt and width is not None:
        # Windows of a model without carried state are independent: a
        # call's windows are scored side by side, as rows of one batch (in
        # calls of at most `WINDOW_LOGITS` logits).
        forward = evaluator._step("forward", [])
        vocabulary = int(evaluator._vocabulary_limit(model) or 1)

        def score_segments(x, y, w, group, first):
            count, batch, columns = x.shape
            rows = max(1, WINDOW_LOGITS // (columns * vocabulary))
            flat_x = x.reshape(count * batch, columns)
            flat_y = y.reshape(count * batch, columns)
            losses = [
                checks.host_array(forward(
                    ops.convert_to_tensor(flat_x[start : start + rows]),
                    ops.convert_to_tensor(flat_y[start : start + rows]),
                ))
                for start in range(0, count * batch, rows)
            ]
            return np.concatenate(losses, axis=0).reshape(count, batch, columns)

    elif not adapt:
        any_count = True
        forward_loop = evaluator._step("forward_loop", [])

        def score_segments(x, y, w, group, first):
            _, losses = forward_loop(
                (), (), ops.convert_to_tensor(x), ops.convert_to_tensor(y)
            )
            return checks.host_array(losses)

    else:
        any_count = True
        adaptation_loop = evaluator._step("adaptation_loop", variables)
        theta_g = _recurrent_state.snapshot(variables)
        constants = (theta_g, rms, hyperparameters)

        def score_segments(x, y, w, group, first):
            # Each stream's mean segment loss; their sum is the objective,
            # so a per-stream matrix gets its own stream's gradient.
            v = w / np.maximum(w.sum(axis=-1, keepdims=True), 1.0)
            return checks.host_array(adaptation_loop(
                constants, ops.convert_to_tensor(x), ops.convert_to_tensor(y),
                ops.convert_to_tensor(v),
            ))

    def restart():
        # Every stream (group of streams, document) starts from θ_g.
        if adapt:
            _recurrent_state.assign(variables, theta_g)

    def score(streams, callbacks=None, verbose=0, keep_final_state=False, real_length=None):
        return score_stream(
            model, streams, batch_size, segment_length, score_segments,
            start_group=lambda group: group > 0 and restart(), callbacks=callbacks,
            verbose=verbose, stop_on_divergence=stop_on_divergence,
            settings=settings, keep_final_state=keep_final_state,
            segments_per_call=per_call, context_length=width,
            real_length=real_length, pad_calls=not adapt and compiles,
            any_count=any_count,
        )

    completed = False
    try:
        if documents is None:
            results, token_losses = score(streams, callbacks, verbose, keep_adapted)
        else:
            results, token_losses = _documents.score(
                *documents, score, restart, segment_length, per_call, verbose
            )
        completed = True
    finally:
        if adapt and not (keep_adapted and completed):
            _recurrent_state.assign(variables, theta_g)
    if return_token_losses:
        results["token_losses"] = token_losses
    return results
