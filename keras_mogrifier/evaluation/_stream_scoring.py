"""Scoring token streams segment by segment: what every test-time method shares.

Dynamic evaluation (`DynamicEvaluator`) and the neural cache (`NeuralCache`)
read a stream in the same order — segments of n predicted tokens, the
recurrent state carried from segment to segment, a progress bar and
callbacks, the same report — and differ only in what they do with a segment.
`score_stream` is that common loop; each method passes a `score_segments`
function.
"""

import math
import sys

import keras
import numpy as np

from keras_mogrifier.evaluation import _recurrent_state
from keras_mogrifier.evaluation.divergence_error import DivergenceError

# A token loss above this (ln of float64's largest number) has a perplexity
# that no float can hold: the weights have diverged, although the loss is
# finite (SGD at η = 1e20 gives losses near 4e19). A model with finite
# logits cannot assign a token e^-709 without logits that far apart.
MAX_TOKEN_LOSS = math.log(np.finfo("float64").max)

# Segments scored (and adapted to) per compiled call when no callback needs
# to see the model after each one: no host round trip between them.
SEGMENTS_PER_CALL = 64


def score_stream(
    model,
    streams,
    batch_size,
    segment_length,
    score_segments,
    start_group=None,
    callbacks=None,
    verbose=0,
    stop_on_divergence=True,
    settings=None,
    keep_final_state=False,
    segments_per_call=1,
    context_length=None,
    real_length=None,
    pad_calls=False,
    any_count=False,
):
    """Scores `streams` segment by segment and returns the report.

    Args:
        model: the model whose recurrent state variables are carried from
            segment to segment, reset at the start of every group of streams
            and restored afterwards (also after an error).
        streams: int32 array `(streams, time)`; `x[:, 1:]` are predicted.
        batch_size: int. Streams scored at once (a short last group is padded
            with copies of the first stream at weight 0).
        segment_length: int. n, predicted tokens per segment (the last one is
            padded at weight 0).
        score_segments: `f(x, y, w, group, first) -> token losses`: scores
            `K` consecutive segments of a group, in order, from segment
            `first` on, and returns a `(K, batch_size, n)` array of the loss
            of every token (`x`, `y` int32 and `w` float32 NumPy arrays of
            that shape, `w` 0 for padding). `K` is `segments_per_call` or
            1: the calls have the same shapes for a stream of any length
            (with `any_count`, `K` is `segments_per_call` or the rest).
        start_group: `f(group)` or None, called before a group's first
            segment (after its state reset).
        callbacks: list of `keras.callbacks.Callback` or None: they get
            `on_test_begin`, `on_test_batch_begin/end` (one batch per segment,
            logs with the running `loss` and `perplexity`) and `on_test_end`.
            With `segments_per_call > 1` a call's segments are reported
            together, after the call.
        verbose: 0, 1 or 2: Keras's progress bar (with an ETA).
        stop_on_divergence: bool. Raise `DivergenceError` at the first segment
            with a token loss that is not finite or above `MAX_TOKEN_LOSS`
            (709.78 nats), found after the call that scored it.
        settings: dict or None. Named in a `DivergenceError`.
        keep_final_state: bool. For one group of streams: its last segment
            holds only real tokens (no padding: it may be shorter than
            `segment_length`, and is then scored in a call of its own) and,
            when the stream is done, the model keeps the state it reached
            (the streams' state after their last input token). After an
            error the state is restored all the same.
        segments_per_call: int. The most segments `score_segments` scores
            at once. Defaults to `1`.
        context_length: int or `None`. For a model without carried state:
            each segment is given to `score_segments` in a window of
            `W` columns that ends with
            its last real input (or the first `W` columns, when the segment
            ends before column `W`: a causal model's scores of the earlier
            columns do not depend on the later ones), so `x`, `y` and `w`
            are `(K, batch, W)` (`W = context_length`, or for a shorter
            stream the power of two at or above its padded length, if
            smaller), `w` non-zero on the segment's own real
            columns only, and `score_segments` returns `(K, batch, W)`
            losses of which those columns are kept. Defaults to `None` (the
            segment alone, `(K, batch, n)`).
        real_length: int or `None`. Predicted tokens per stream that are
            text; those after it are padding (weight 0, in no window), which
            the caller drops from `token_losses`. Defaults to `None` (all).
        pad_calls: bool. Where nothing changes between segments (static
            scoring), the segments after the last full call are one more
            full call, padded with segments at weight 0 (their losses are
            dropped), instead of a call per segment. Not with callbacks,
            `keep_final_state` or `context_length` (a windowed model's
            windows go side by side in calls of a fixed number of rows
            anyway). Defaults to `False`.
        any_count: bool. `score_segments` runs one compiled program for
            any `K` (the backends' loops: `model_loop`,
            `model_adaptation_loop`): the segments after the last full call
            are one call of the rest, not a call per segment. Defaults to
            `False`.

    Returns:
        `(report, token_losses)`: the report holds `loss` (token-weighted mean
        nats), `perplexity`, `bits_per_token` and `num_tokens`;
        `token_losses` is float32 `(streams, time - 1)`.
    """
    n = segment_length
    num_streams, time = streams.shape
    predicted = time - 1
    num_segments = -(-predicted // n)
    num_groups = -(-num_streams // batch_size)
    # A windowed model reads windows of `context_length` columns; a stream
    # shorter than that is padded (after it, at weight 0: a causal model's
    # scores of the earlier columns do not see it) to a power of two
    # columns, or `context_length`: few shapes, at most twice the work.
    columns = num_segments * n
    if context_length is not None and columns < context_length:
        columns = min(context_length, 1 << (columns - 1).bit_length())
    # Static scoring of a model with carried state: whole calls only, the
    # last one padded with segments at weight 0 (one compiled shape).
    whole_calls = (
        pad_calls and segments_per_call > 1 and not keep_final_state
        and context_length is None
    )
    if whole_calls:
        columns = -(-num_segments // segments_per_call) * segments_per_call * n
    inputs = np.zeros((num_groups * batch_size, columns), "int32")
    targets = np.zeros_like(inputs)
    weights = np.zeros(inputs.shape, "float32")
    inputs[:num_streams, :predicted] = streams[:, :-1]
    targets[:num_streams, :predicted] = streams[:, 1:]
    weights[:num_streams, :predicted] = 1.0
    real = predicted if real_length is None else min(real_length, predicted)
    weights[:, real:] = 0.0
    # Padding streams repeat the first stream at weight 0: they run like real
    # text but count for nothing.
    inputs[num_streams:, :predicted] = streams[0, :-1]
    targets[num_streams:, :predicted] = streams[0, 1:]
    # Tokens counted after each segment of a group, for the running logs.
    seen_per_segment = np.minimum(np.arange(1, num_segments + 1) * n, predicted)

    def by_segment(array, rows, first, count, end=None):
        # (batch, K·n) columns -> (K, batch, n); one short last segment
        # (columns up to `end`) -> (1, batch, end - first·n).
        if end is not None:
            return np.ascontiguousarray(array[rows, first * n : end][None])
        block = array[rows, first * n : (first + count) * n]
        return np.ascontiguousarray(
            block.reshape(block.shape[0], count, n).transpose(1, 0, 2)
        )

    width = None if context_length is None else min(context_length, inputs.shape[1])

    def spans(first, count, end):
        # Each segment's window start, first column and last real column + 1
        # (the window ends with the segment's last real input, or is the
        # first `width` columns; padding columns are never kept: loss 0).
        out = []
        for k in range(count):
            s = first + k
            stop = max(s * n, min(end if end is not None else (s + 1) * n, real))
            start = min(max(0, stop - width), inputs.shape[1] - width)
            out.append((start, s * n, stop))
        return out

    def by_window(array, rows, windows):
        return np.ascontiguousarray(
            np.stack([array[rows, start : start + width] for start, _, _ in windows])
        )

    def score_call(rows, group, first, count, end):
        # `score_segments` on the call's segments (alone or in their
        # windows); returns their weights and losses, `(K, batch, n)` (or
        # the short last segment's columns).
        w = by_segment(weights, rows, first, count, end)
        if width is None:
            losses = score_segments(
                by_segment(inputs, rows, first, count, end),
                by_segment(targets, rows, first, count, end),
                w, group, first,
            )
            return w, losses
        windows = spans(first, count, end)
        window_weights = np.zeros((count, w.shape[1], width), "float32")
        for k, (start, low, high) in enumerate(windows):
            window_weights[k, :, low - start : high - start] = weights[rows, low:high]
        window_losses = np.asarray(score_segments(
            by_window(inputs, rows, windows), by_window(targets, rows, windows),
            window_weights, group, first,
        ))
        losses = np.zeros(w.shape, "float32")
        for k, (start, low, high) in enumerate(windows):
            losses[k, :, : high - low] = window_losses[k, :, low - start : high - start]
        return w, losses

    # The calls: (first segment, segments, last column or None). Every call
    # holds `segments_per_call` segments or one, so that the compiled
    # functions see the same shapes whatever the stream's length: a model is
    # compiled once, not once per text (the rest after the last full call
    # goes one segment per call) — or, with `any_count`, the rest is one
    # call, which the backend's loop runs in the same program. With `keep_final_state`, a short last
    # segment is a call of its own, so that no padding token moves the
    # state that is kept.
    short_end = keep_final_state and predicted < num_segments * n
    whole = num_segments - 1 if short_end else num_segments
    if whole_calls:
        whole = columns // n
    calls = []
    first = 0
    while segments_per_call > 1 and first + segments_per_call <= whole:
        calls.append((first, segments_per_call, None))
        first += segments_per_call
    if any_count and segments_per_call > 1 and first < whole:
        calls.append((first, whole - first, None))
    else:
        calls += [(s, 1, None) for s in range(first, whole)]
    if short_end:
        calls.append((num_segments - 1, 1, predicted))

    states = _recurrent_state.state_variables(model)
    callback_list = keras.callbacks.CallbackList(
        callbacks,
        add_progbar=verbose != 0,
        model=model,
        verbose=verbose,
        epochs=1,
        steps=num_groups * num_segments,
    )
    report = bool(callback_list.callbacks)
    saved_states = _recurrent_state.snapshot(states)
    losses = []
    loss_sum, tokens_done = 0.0, 0
    completed = False
    try:
        callback_list.on_test_begin()
        for group in range(num_groups):
            rows = slice(group * batch_size, (group + 1) * batch_size)
            group_tokens = min(batch_size, num_streams - group * batch_size)
            _recurrent_state.reset(states)
            if start_group is not None:
                start_group(group)
            for first, count, end in calls:
                if count == 1:
                    callback_list.on_test_batch_begin(group * num_segments + first)
                w, token_losses = score_call(rows, group, first, count, end)
                chunk = np.asarray(token_losses, "float32") * w
                for k in range(min(count, num_segments - first)):
                    s = first + k
                    index = group * num_segments + s
                    segment_losses = chunk[k]
                    if count > 1:
                        callback_list.on_test_batch_begin(index)
                    diverged = ~np.isfinite(segment_losses) | (
                        segment_losses > MAX_TOKEN_LOSS
                    )
                    if stop_on_divergence and diverged.any():
                        row, column = np.argwhere(diverged)[0]
                        raise DivergenceError.at(
                            stream=int(group * batch_size + row),
                            token=int(s * n + column + 1),
                            segment=int(s),
                            loss=float(segment_losses[row, column]),
                            settings=settings or {},
                            tokens_scored=int(tokens_done + group_tokens * s * n),
                        )
                    if segment_losses.shape[1] < n:
                        segment_losses = np.pad(
                            segment_losses, ((0, 0), (0, n - segment_losses.shape[1]))
                        )
                    losses.append(segment_losses)
                    if report:
                        loss_sum += float(np.sum(segment_losses, dtype="float64"))
                        seen = tokens_done + group_tokens * int(seen_per_segment[s])
                        running = loss_sum / seen
                        callback_list.on_test_batch_end(
                            index, {"loss": running, "perplexity": safe_exp(running)}
                        )
            tokens_done += group_tokens * predicted
        completed = True
    finally:
        if not (keep_final_state and completed):
            _recurrent_state.assign(states, saved_states)

    per_group = [
        np.concatenate(losses[g * num_segments : (g + 1) * num_segments], axis=1)
        for g in range(num_groups)
    ]
    token_losses = np.concatenate(per_group, axis=0)[:num_streams, :predicted]
    results = summary(token_losses)
    callback_list.on_test_end(
        {k: results[k] for k in ("loss", "perplexity", "bits_per_token")}
    )
    return results, token_losses


def summary(token_losses):
    """The report of token losses: `loss` (mean nats), `perplexity`,
    `bits_per_token` and `num_tokens`."""
    loss = float(np.sum(token_losses, dtype="float64") / token_losses.size)
    return {
        "loss": loss,
        "perplexity": safe_exp(loss),
        "bits_per_token": loss / math.log(2.0),
        "num_tokens": int(token_losses.size),
    }


def progress_verbosity(verbose):
    """`"auto"`: a progress bar (1) on a terminal, none (0) in a log or a pipe."""
    if verbose == "auto":
        isatty = getattr(sys.stdout, "isatty", None)
        return 1 if isatty is not None and isatty() else 0
    return verbose


def safe_exp(value):
    try:
        return math.exp(value)
    except OverflowError:
        return float("inf")
