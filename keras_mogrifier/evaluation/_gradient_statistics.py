"""The gradient statistics of dynamic evaluation: `MS_g` on training data.

`collect` is `DynamicEvaluator.collect_gradient_statistics` (see there): the
mean over training batches of the squared gradient of each batch's mean
token loss, for every adapted variable. `as_numpy` and `from_values` convert
the statistics to and from the `{variable.path: array}` dict of
`DynamicEvaluator.gradient_statistics`. The statistics are held as
`(variables, [MS_g tensors in the variables' shapes])`.
"""

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.evaluation import _dynamic_checks as checks
from keras_mogrifier.evaluation import _recurrent_state


def collect(evaluator, data, steps, batch_size, segment_length):
    """`(statistics, logs)`: see `DynamicEvaluator.collect_gradient_statistics`."""
    _validation.optional_positive_int("steps", steps)
    _validation.positive_int("batch_size", batch_size)
    _validation.optional_positive_int("segment_length", segment_length)
    model = evaluator._require_model()
    # A model without carried state learns from windows of its context.
    n = segment_length or evaluator._context_window(model) or evaluator.segment_length
    variables = evaluator.adapted_variables()
    per_stream = [checks.is_per_stream(v) for v in variables]
    limit = evaluator._vocabulary_limit(model)
    stream = checks.as_training_stream(data)
    if stream is not None:
        # Checked here, once (a corpus's ids are known and not scanned);
        # its batches, cut below, are not checked again.
        stream = checks.check_ids(stream[None], "data", limit)[0]
        length = stream.shape[0] // batch_size
        windows = (length - 1) // n
        if windows < 1:
            raise ValueError(
                f"Expected `data` to hold at least `batch_size * "
                f"(segment_length + 1)` = {batch_size * (n + 1)} tokens. "
                f"Received: {stream.shape[0]} tokens"
            )
        checks.check_batch_size(model, batch_size, "`batch_size`")
        checks.check_output(model, batch_size, n, limit)
        streams = stream[: length * batch_size].reshape(batch_size, length)
        batches = (
            (streams[:, i * n : (i + 1) * n], streams[:, i * n + 1 : (i + 1) * n + 1])
            for i in range(windows)
        )
    else:
        batches = iter(data)

    step = evaluator._step("gradients", variables)
    accumulate = evaluator._step("accumulate", variables, per_stream=per_stream)
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
            x, y, w = checks.check_batch_pair(
                model, batch, limit, ids_checked=stream is not None
            )
            if count == 0 and stream is None:
                checks.check_output(model, x.shape[0], x.shape[1], limit)
            # The gradient of the batch's (weighted) mean token loss.
            v = w / max(float(np.sum(w)), 1.0)
            token_losses, gradients = step(
                ops.convert_to_tensor(x), ops.convert_to_tensor(y),
                ops.convert_to_tensor(v),
            )
            accumulators = accumulate(accumulators, gradients)
            loss_sum += float(np.sum(checks.host_array(token_losses) * v, dtype="float64"))
            count += 1
        if count == 0:
            raise ValueError("Expected `data` to yield at least one batch. Received none.")
        statistics = []
        for v, acc, ps in zip(variables, accumulators, per_stream):
            ms = ops.convert_to_tensor(acc) / count
            statistics.append(ops.broadcast_to(ms, v.shape) if ps else ms)
    finally:
        _recurrent_state.assign(states, saved_states)
    return (variables, statistics), {"loss": loss_sum / count, "num_batches": count}


def as_numpy(statistics):
    """`{variable.path: MS_g}` as NumPy arrays, or `None` without statistics."""
    if statistics is None:
        return None
    variables, values = statistics
    return {v.path: np.asarray(ops.convert_to_numpy(m)) for v, m in zip(variables, values)}


def from_values(variables, values):
    """The statistics of `variables` from a `{variable.path: array}` dict."""
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
    return (variables, tensors)
