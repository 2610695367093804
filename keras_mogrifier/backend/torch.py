"""PyTorch implementation of the backend seam (see `__init__.py`).

The only module of keras_mogrifier that imports PyTorch. Functions run
eagerly (`jit_compile` is ignored: `torch.compile` of a recurrent model
outside `fit` costs far more to compile than it saves on CPU), under
`torch.no_grad()` unless gradients are asked for; gradients come from
`torch.autograd.grad` with respect to the variables' parameters, which are
made to require gradients for the duration of the call. The differentiated
call runs in a `keras.StatelessScope`, so that the model's own assignments
(a stateful RNN writing its carried state in place) wait until the backward
pass is done, and are then written into the variables.
"""

import contextlib
import math
import os

import keras
import torch

from keras_mogrifier.backend._shared import all_finite
from keras_mogrifier.backend._shared import check_dataset_on_host  # noqa: F401
from keras_mogrifier.backend._shared import patched
from keras_mogrifier.backend._variables import model_state


THREADS_VARIABLE = "KERAS_MOGRIFIER_TORCH_THREADS"


def _policy_threads():
    """The intra-op thread count the policy asks for, or `None` (leave it)."""
    value = os.environ.get(THREADS_VARIABLE, "auto")
    setting = value.strip().lower()
    if setting == "torch":
        return None
    if setting == "auto":
        return None if os.environ.get("OMP_NUM_THREADS") else 1
    try:
        threads = int(setting)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(
            f"Expected {THREADS_VARIABLE} to be 'auto', 'torch' or a positive integer "
            f"(PyTorch's intra-op threads). Received: {value!r}"
        )
    return threads


def apply_thread_policy():
    threads = _policy_threads()
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return thread_settings()


def thread_settings():
    intra, interop = torch.get_num_threads(), torch.get_num_interop_threads()
    policy = os.environ.get(THREADS_VARIABLE, "auto")
    return {
        "backend": "torch", "intra_op_threads": intra, "interop_threads": interop,
        "policy": policy, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "description": f"{intra} intra-op thread(s) ({THREADS_VARIABLE}={policy})",
    }


def compiles_per_shape():
    """Eager: a new shape is just another call."""
    return False


def default_jit_compile(model, many_steps=True):
    del model, many_steps
    return False


def function(fn, jit_compile):
    del jit_compile

    def run(*args):
        with torch.no_grad():
            return fn(*args)

    return run


def model_function(model, fn, jit_compile):
    del model
    return function(fn, jit_compile)


@contextlib.contextmanager
def _requiring_gradients(parameters):
    """`parameters` require gradients (and autograd records) inside; their
    own flags come back afterwards."""
    flags = [p.requires_grad for p in parameters]
    try:
        for p in parameters:
            p.requires_grad_(True)
        with torch.enable_grad():
            yield
    finally:
        for p, flag in zip(parameters, flags):
            p.requires_grad_(flag)


def model_gradients(model, variables, fn, jit_compile):
    del jit_compile

    def run(*args):
        parameters = [v.value for v in variables]
        with _requiring_gradients(parameters):
            with keras.StatelessScope() as scope:
                objective, aux = fn(*args)
            gradients = torch.autograd.grad(
                objective, parameters, allow_unused=True
            )
        with torch.no_grad():
            for v in model_state(model):
                value = scope.get_current_value(v)
                if value is not None:
                    v.assign(value.detach())
        aux = torch.utils._pytree.tree_map(
            lambda t: t.detach() if isinstance(t, torch.Tensor) else t, aux
        )
        return aux, [
            torch.zeros_like(p) if g is None else g.detach()
            for p, g in zip(parameters, gradients)
        ]

    return run


TIED_LOGITS_ROWS = 16


def tied_logits(features, table):
    """`features · tableᵀ` as `(table · featuresᵀ)ᵀ`, for up to 16 rows
    while a gradient of `table` is being taken.

    For a few rows (dynamic evaluation's segments at batch 1) the product in
    this order is faster (a 10k × 256 table and 5 rows: 0.6 against 1.0–1.3
    ms, one thread) and autograd gets the table's gradient as a tensor of
    its own rather than a transposed view, so it adds the lookup's gradient
    of a tied table to it in place instead of writing a third 10 MB tensor
    (measured: docs/results/evaluation-speed.md). Returns `None` (Keras's
    product) for more rows — the transposed result would slow the softmax
    over many — and without a gradient: scoring keeps one order of
    summation for every number of rows, so a text scores bit for bit the
    same alone and in a batch (tests/generation/score_test.py).
    """
    if not torch.is_grad_enabled():  # scoring: Keras's order (checked first: every call)
        return None
    features = keras.ops.convert_to_tensor(features)
    table = keras.ops.convert_to_tensor(table)
    rows = math.prod(features.shape[:-1])
    if rows > TIED_LOGITS_ROWS or features.dtype != table.dtype or not table.requires_grad:
        return None
    flat = features.reshape(rows, features.shape[-1])
    return torch.mm(table, flat.t()).t().reshape(*features.shape[:-1], table.shape[0])


def output_logits(logits, bias, temperature):
    """`float32(logits + bias) · temperature` in place, while no gradient is
    taken (scoring); `None` (out of place, Keras's operations) otherwise.

    At batch 1 a scored window's logits are the largest tensors of the call
    (320 × 10k floats, 12.8 MB): each fresh one costs its page faults where
    glibc returns such blocks to the system between calls, and out of place
    the bias and the temperature are two more of them. In place the same
    operations in the same order write the same numbers (checked against
    the out-of-place ones bit for bit: tests/backend_seam_test.py).
    """
    if torch.is_grad_enabled():
        return None
    return _output_logits_in_place(
        keras.ops.convert_to_tensor(logits),
        None if bias is None else keras.ops.convert_to_tensor(bias),
        None if temperature is None else keras.ops.convert_to_tensor(temperature),
    )


def _output_logits_in_place(logits, bias, temperature):
    # `output_logits` on tensors.
    if bias is not None:
        logits.add_(bias.to(logits.dtype))
    logits = logits.to(torch.float32)  # itself when already float32
    if temperature is not None:
        logits.mul_(temperature)
    return logits


def sparse_crossentropy(ids, logits, overwrite_logits=False):
    """Cross-entropy of every token, on a `(tokens, vocab)` matrix.

    `torch.nn.functional.cross_entropy` on `(batch, time, vocab)` logits
    would need the classes on axis 1: Keras moves and copies the tensor,
    forward and backward (a third of a 2 × 256, 10k-word training step).

    With `overwrite_logits`, while no gradient is taken, the log-softmax is
    written over the logits (`cross_entropy` is `log_softmax` then
    `nll_loss`: the same two kernels, the same numbers, bit for bit) rather
    than into a fresh logits-sized tensor.
    """
    logits = keras.ops.convert_to_tensor(logits)
    ids = keras.ops.convert_to_tensor(ids)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_ids = ids.reshape(-1).long()
    if overwrite_logits and not torch.is_grad_enabled() and logits.is_contiguous():
        torch._log_softmax(flat_logits, -1, False, out=flat_logits)  # a view: in place
        flat = torch.nn.functional.nll_loss(flat_logits, flat_ids, reduction="none")
    else:
        flat = torch.nn.functional.cross_entropy(flat_logits, flat_ids, reduction="none")
    return flat.reshape(ids.shape)


def rnn(
    step_function,
    inputs,
    initial_states,
    go_backwards=False,
    mask=None,
    constants=None,
    unroll=False,
    input_length=None,
    time_major=False,
    zero_output_for_mask=False,
    return_all_outputs=True,
):
    """The unmasked time loop, with nothing but the steps in it.

    Keras's PyTorch loop computes the first step twice (once to learn the
    output's shape) and counts time in a tensor; at batch 1 and a few steps
    (dynamic evaluation's segments, generation) that is a large share of
    the work. This loop runs each step once. Masks and constants are left
    to Keras's loop (returns `None`).
    """
    del unroll, input_length, zero_output_for_mask  # no mask: nothing to do
    if mask is not None or constants:
        return None
    if not time_major:
        inputs = torch.transpose(inputs, 0, 1)
    steps = torch.unbind(inputs, 0)
    if go_backwards:
        steps = steps[::-1]
    states = tuple(initial_states)
    outputs = []
    for x_t in steps:
        output, states = step_function(x_t, states)
        states = tuple(states)
        if return_all_outputs or not outputs:
            outputs.append(output)
        else:
            outputs[0] = output
    stacked = torch.stack(outputs)
    if not time_major:
        stacked = torch.transpose(stacked, 0, 1)
    return outputs[-1], stacked, states


def recurrent_step(cell, weights, training, projected):
    """The time step of the package's cells in PyTorch's own operations.

    `CellRNN` runs the cell's `recurrent_step`, written in `keras.ops`; on
    PyTorch each of its operations goes through Keras's conversions and
    dtype checks (about 100 ATen calls per layer and step at batch 1,
    against the dozen the arithmetic needs), which dominates evaluation,
    dynamic evaluation and generation, where the steps are small. For an
    `RLSTMCell` or a `MogrifierLSTMCell` — with or without mogrifier rounds,
    with or without a state dropout mask (drawn, as by the cell's own step,
    with `get_recurrent_dropout_mask` at the first step and reused) — without
    adaptation, this returns the same step — the same operations in the same
    order, so the same numbers, gradients included (autograd records them)
    — as `(x, states) -> (h, [h, c])`, where `x` is the projected input when
    the projection was hoisted out of the loop (`projected`), else the
    (dropped-out) input; otherwise (adaptation, or a subclass that overrides
    `step` or `recurrent_step`) `None`, and the cell's own step runs.
    """
    from keras_mogrifier.layers.mogrified_cell import MogrifiedCell
    from keras_mogrifier.layers.mogrifier_lstm_cell import MogrifierLSTMCell
    from keras_mogrifier.layers.rlstm_cell import RLSTMCell

    rounds = weights["mogrifier"]
    if (
        weights["adaptation"] is not None
        or type(cell).recurrent_step is not MogrifiedCell.recurrent_step
        or (projected and rounds is not None)
    ):
        return None
    masked = training and cell.recurrent_dropout > 0.0
    doubled = weights["mogrifier_doubled"]

    def mogrify(x, h):
        return _mogrify(rounds, doubled, x, h)

    if isinstance(cell, RLSTMCell) and type(cell).step is RLSTMCell.step:

        def rlstm_step(x, states):
            h_prev, c_prev = states[0], states[1]
            state_mask = None
            if masked:
                state_mask = cell.get_recurrent_dropout_mask(h_prev)
                h_prev = h_prev * state_mask
            if projected:
                z_x = x
            else:
                if rounds is not None:
                    x, h_prev = mogrify(x, h_prev)
                z_x = _rlstm_projection(cell.units, weights, x)
            h, c = _rlstm_gates(weights, z_x, h_prev, c_prev, state_mask)
            return h, [h, c]

        return rlstm_step
    if isinstance(cell, MogrifierLSTMCell) and type(cell).step is MogrifierLSTMCell.step:
        capped = cell.capped_input_gate

        def lstm_step(x, states):
            h_prev, c_prev = states[0], states[1]
            if masked:
                h_prev = h_prev * cell.get_recurrent_dropout_mask(h_prev)
            if projected:
                z_x = x
            else:
                if rounds is not None:
                    x, h_prev = mogrify(x, h_prev)
                z_x = _lstm_projection(weights, x)
            h, c = _lstm_gates(weights, capped, z_x, h_prev, c_prev)
            return h, [h, c]

        return lstm_step
    return None


# The fused steps' arithmetic. With a `tape` (a list), each also appends
# what its hand-written backward pass (`adaptation_gradients`) reads; the
# operations, and so the numbers, are the same either way.


def _mogrify(rounds, doubled, x, h, tape=None):
    # `Mogrifier.mogrify`: round i gates x (odd i) or h (even i).
    for i, (kernels, bias) in enumerate(rounds, start=1):
        z = h if i % 2 == 1 else x
        inputs = []
        for matrix in kernels:
            inputs.append(z)
            z = torch.matmul(z, matrix)
        if bias is not None:
            z = torch.add(z, bias)
        gate = torch.sigmoid(z)
        gated = x if i % 2 == 1 else h
        if tape is not None:
            tape.append((inputs, gate, gated))
        gated = gate * gated
        if doubled:
            gated = gated + gated
        if i % 2 == 1:
            x = gated
        else:
            h = gated
    return x, h


def _rlstm_projection(units, weights, x):
    # `RLSTMCell.project_input`.
    z_x = torch.matmul(x, weights["kernel"])
    if z_x.shape[-1] == 2 * units:
        z_x = torch.nn.functional.pad(z_x, (0, units))
    if weights["input_bias"] is not None:
        z_x = torch.add(z_x, weights["input_bias"])
    return z_x


def _rlstm_gates(weights, z_x, h_prev, c_prev, state_mask, tape=None):
    # `RLSTMCell.step`.
    z = torch.add(z_x, torch.matmul(h_prev, weights["recurrent_kernel"]))
    z_i, z_j, z_f = torch.chunk(z, 3, dim=-1)
    i = torch.sigmoid(z_i)
    j = torch.tanh(z_j)
    ij = i * j
    f = torch.sigmoid(torch.add(z_f, torch.matmul(ij, weights["forget_kernel"])))
    capped = torch.minimum(i, 1.0 - f)
    c = f * c_prev + capped * j
    c_seen = c if state_mask is None else c * state_mask
    z_o = torch.matmul(c_seen, weights["output_kernel"])
    if weights["output_bias"] is not None:
        z_o = torch.add(z_o, weights["output_bias"])
    o = torch.sigmoid(z_o)
    tanh_c = torch.tanh(c)
    if tape is not None:
        tape.append((h_prev, c_prev, i, j, ij, f, capped, c, o, tanh_c))
    return o * tanh_c, c


def _lstm_projection(weights, x):
    # `MogrifierLSTMCell.project_input`.
    z_x = torch.matmul(x, weights["kernel"])
    if weights["bias"] is not None:
        z_x = torch.add(z_x, weights["bias"])
    return z_x


def _lstm_gates(weights, capped, z_x, h_prev, c_prev, tape=None):
    # `MogrifierLSTMCell.step`.
    z = torch.add(z_x, torch.matmul(h_prev, weights["recurrent_kernel"]))
    z_i, z_f, z_j, z_o = torch.chunk(z, 4, dim=-1)
    f = torch.sigmoid(z_f)
    i = torch.sigmoid(torch.minimum(z_i, -z_f) if capped else z_i)
    tanh_j = torch.tanh(z_j)
    c = f * c_prev + i * tanh_j
    o = torch.sigmoid(z_o)
    tanh_c = torch.tanh(c)
    if tape is not None:
        tape.append((h_prev, c_prev, z_i, z_f, f, i, tanh_j, c, o, tanh_c))
    return o * tanh_c, c


def decoding_step(model):
    """A `LanguageModel`'s decoding step in PyTorch's own operations.

    `generate` on PyTorch runs its model eagerly, one token per call; at
    batch 1 the arithmetic of a token is small and Keras's per-operation
    overhead (argument conversion, dtype checks, `Layer.__call__`) was most
    of its time (`benchmarks/torch_generation_floor.py`). For the package's
    own `LanguageModel` — the recurrent backbone (residual, skip or plain),
    cells with a fused PyTorch step (`recurrent_step`), a tied or untied
    output layer without Dual, projection or mixture of softmaxes, full
    precision, no LoRA or quantisation — this returns
    `step(tokens, uniform=None, sampler=None)`: reads `tokens` (an int32
    host array `(b,)`, ids in range) into the leading `b` rows of the
    carried state, written in place — the embedding lookup, each layer's
    fused step — and with a `sampler` also runs the output layer, the
    model's temperature and the sampler on `uniform` (float32 `(b,)`) and
    returns the next ids (int32 `(b,)`); without one, `None` (a known
    token: no output layer). The same operations in the same order as
    `Decoder.step`'s (`call_with_cache` then `sampler(logits, uniform)`),
    so the same state and ids (tests/generation/decoding_step_test.py).
    `GreedySampler` runs as PyTorch's own operations too (its
    `softmax(stable_logits)` then `argmax`); another sampler is called on
    the logits, its inputs trusted. The weights are read once, when the
    step is made: make one per generation. Otherwise `None`.
    """
    from keras_mogrifier.layers.cell_rnn import CellRNN
    from keras_mogrifier.layers.language_model_head import LanguageModelHead
    from keras_mogrifier.layers.mogrified_cell import fold_mogrifier_doubling
    from keras_mogrifier.models.language_model import LanguageModel
    from keras_mogrifier.models.recurrent_backbone import RecurrentBackbone
    from keras_mogrifier.models.recurrent_backbone import _sum
    from keras_mogrifier.samplers.greedy_sampler import GreedySampler
    from keras_mogrifier.samplers.sampler import inputs_checked

    backbone = getattr(model, "backbone", None)
    head = getattr(model, "head", None)
    if (
        not isinstance(model, LanguageModel)
        or type(model).call_with_cache is not LanguageModel.call_with_cache
        or type(backbone) is not RecurrentBackbone
        or type(head) is not LanguageModelHead
        or head.dual_layer is not None
        or head.projection is not None
        or head.mixture is not None
        or not backbone._lean(False)
        or any(
            layer.dtype_policy.compute_dtype != layer.dtype_policy.variable_dtype
            or getattr(layer, "lora_enabled", False)
            or getattr(layer, "quantization_mode", None)
            for layer in model._flatten_layers(include_self=True, recursive=True)
        )
    ):
        return None
    steps = []
    for rnn in backbone.recurrent_layers:
        if type(rnn).inner_loop is not CellRNN.inner_loop or rnn.go_backwards:
            return None
        # The one-token call's weights (`_prepares_per_sequence(1)`), read
        # once, the mogrifier's doublings folded (exact: the same numbers);
        # the input projected inside the step, as the unhoisted loop does:
        # the same operations as `project_input` (tests).
        weights = fold_mogrifier_doubling(rnn.cell.step_weights(per_sequence=False))
        step = recurrent_step(rnn.cell, weights, False, projected=False)
        if step is None:
            return None
        steps.append(step)
    states = [keras.ops.convert_to_tensor(v) for v in model.recurrent_state_variables]
    table = keras.ops.convert_to_tensor(backbone.embedding.embeddings)
    output_layer = head.output_layer
    if output_layer is None:
        output_table = keras.ops.convert_to_tensor(head.embedding.embeddings).t()
    # `LanguageModelHead._output`: the untied layer adds its own bias.
    bias = None if output_layer is not None else head.output_bias
    if bias is not None:
        bias = keras.ops.convert_to_tensor(bias)
    temperature = keras.ops.convert_to_tensor(head.temperature_variable)
    residual, skip = backbone.residual, backbone.skip_connections
    last = len(steps) - 1

    def decoding_step(tokens, uniform=None, sampler=None):
        rows = tokens.shape[0]
        with torch.no_grad():
            ids = torch.from_numpy(tokens).to(table.device, torch.int64)
            x = torch.nn.functional.embedding(ids, table)
            outputs = []
            for k, step in enumerate(steps):
                h_state, c_state = states[2 * k][:rows], states[2 * k + 1][:rows]
                h, (_, c) = step(x, [h_state, c_state])
                h_state.copy_(h)
                c_state.copy_(c)
                outputs.append(h)
                if sampler is None and k == last:
                    return None  # a known token: the state is all it changes
                # The backbone's wiring, its own sum (the same order).
                x = _sum(outputs) if residual else h
            if not residual and skip:
                x = _sum(outputs)
            if output_layer is None:
                logits = torch.matmul(x, output_table)
            else:
                logits = output_layer.call(x)
            logits = _output_logits_in_place(logits, bias, temperature)
            if type(sampler) is GreedySampler:
                # `GreedySampler`: argmax of softmax(stable_logits(logits, T)).
                logits.sub_(torch.amax(logits, dim=-1, keepdim=True))
                if sampler.temperature != 1.0:  # x / 1 is x
                    logits.div_(sampler.temperature)
                next_tokens = torch.argmax(torch.softmax(logits, dim=-1), dim=-1)
            else:
                with inputs_checked():
                    next_tokens = sampler(logits, torch.from_numpy(uniform).to(logits.device))
        return next_tokens.to(torch.int32).cpu().numpy()

    return decoding_step


def adaptation_gradients(model, variables):
    """Dynamic evaluation's gradients by a hand-written backward pass.

    Autograd records every small operation of the recurrent loop (about 30
    per layer and token) and, in its backward pass, takes each weight's
    gradient once per token, as a product of one row by one row, summed
    into the weight's gradient step after step: on a 2-core CPU at batch 1
    that was most of a segment's time (`benchmarks/dynamic_floor.py`).
    For the package's own `LanguageModel` — `decoding_step`'s models,
    with the output layer tied to the embedding, the state carried
    (`stateful`), and `variables` among the embedding, the output bias and
    the cells' weights — this returns `gradients_of(x, y, v, update=None)
    -> (losses, gradients)`: what `model_gradients(model, variables,
    objective)` returns for dynamic evaluation's objective `Σ v ⊙
    token_losses(model, x, y)`, the carried state advanced the same way.
    The forward pass is the package's own (`recurrent_step`'s operations,
    in the same order: the same losses and state, bit for bit); its
    backward pass is written out — the gates' derivatives from the saved
    activations, each weight's gradient one product per segment, the
    embedding's rows added into the tied table's gradient — so the
    gradients equal autograd's to float rounding
    (tests/evaluation/adaptation_gradients_test.py). The cells' weights are
    read as `step_weights()` gives them — the variables or views of them
    (a split bias), valid while the variables are updated in place, so
    read once while the same `update` runs — and their gradients reach the
    variables through the views' strides (through autograd where a weight
    is computed from a variable instead).

    With `update` (`in_place_update`'s step for `variables`) the tied
    table is updated here, in the pass over the table that computes the
    features' gradient (`_tied_table_pass`), and its gradient comes back as
    `None`: pass the gradients to that `update`. Without it, the table's
    gradient is written into one buffer, reused at every call: use each
    call's gradients before the next call. Otherwise `None`.
    """
    from keras_mogrifier.layers.mogrified_cell import MogrifiedCell
    from keras_mogrifier.layers.mogrifier_lstm_cell import MogrifierLSTMCell
    from keras_mogrifier.layers.rlstm_cell import RLSTMCell
    from keras_mogrifier.models.language_model import LanguageModel
    from keras_mogrifier.models.recurrent_backbone import _sum

    if decoding_step(model) is None or type(model) is not LanguageModel:
        return None
    backbone, head = model.backbone, model.head
    if head.output_layer is not None or not backbone.stateful:
        return None
    cells = []
    for rnn in backbone.recurrent_layers:
        cell = rnn.cell
        if type(cell).recurrent_step is not MogrifiedCell.recurrent_step:
            return None
        if isinstance(cell, RLSTMCell) and type(cell).step is RLSTMCell.step:
            cells.append((cell, "rlstm"))
        elif isinstance(cell, MogrifierLSTMCell) and type(cell).step is MogrifierLSTMCell.step:
            cells.append((cell, "lstm"))
        else:
            return None
    table_variable = backbone.embedding.embeddings
    if head.embedding.embeddings is not table_variable:
        return None
    known = {id(table_variable), id(head.output_bias)}
    known.update(id(w) for cell, _ in cells for w in cell.trainable_weights)
    if any(id(v) not in known for v in variables):
        return None
    residual, skip = backbone.residual, backbone.skip_connections
    buffer = []
    cache = {}

    def gradients_of(x, y, v, update=None):
        parameters = [variable.value for variable in variables]
        adapted = {id(p) for p in parameters}
        x = keras.ops.convert_to_tensor(x)
        rows, n = x.shape
        # Views of the same parameters stay valid; weights computed from
        # them (`mapping` None) are prepared anew every time.
        key = tuple(id(p) for p in parameters)
        if cache.get("key") != key or cache["mapping"] is None:
            cache.clear()
            cache.update(_prepared_cells(cells, adapted))
            cache["key"] = key
        losses, gradient_of = forward_backward(
            x, y, v, rows, n, parameters, adapted, update
        )
        # `None` for the table where `update` has updated it already.
        gradients = [
            gradient_of[id(p)] if id(p) in gradient_of else torch.zeros_like(p)
            for p in parameters
        ]
        return losses.reshape(rows, n), gradients

    def forward_backward(x, y, v, rows, n, parameters, adapted, update):
        ids = x.reshape(-1).long()
        targets = keras.ops.convert_to_tensor(y).reshape(-1).long()
        weights_of = keras.ops.convert_to_tensor(v).reshape(-1).to(torch.float32)
        table = table_variable.value
        bias = head.output_bias.value
        detached = cache["detached"]
        terms = None
        if update is not None and id(table) in adapted:
            terms = update.terms[id(table)]
        with torch.no_grad():
            # Forward: the backbone (`RecurrentBackbone._run`, lean), the
            # state read from and written into the state variables.
            states = [
                keras.ops.convert_to_tensor(s) for s in backbone.recurrent_state_variables
            ]
            layer_input = torch.nn.functional.embedding(ids.reshape(rows, n), table)
            inputs, outputs, tapes = [], [], []
            new_states = []
            for k, ((cell, kind), w) in enumerate(zip(cells, detached)):
                h = states[2 * k][:rows].clone()
                c = states[2 * k + 1][:rows].clone()
                inputs.append(layer_input)
                sequence, h, c, tape = _taped_layer(cell, kind, w, layer_input, h, c)
                new_states += [h, c]
                outputs.append(sequence)
                tapes.append(tape)
                layer_input = _sum(outputs) if residual else sequence
            features = layer_input
            if not residual and skip:
                features = _sum(outputs)
            # The head (`LanguageModelHead._output`, tied): the logits,
            # their bias and temperature, the token losses.
            flat = features.reshape(rows * n, features.shape[-1])
            if rows * n <= TIED_LOGITS_ROWS and id(table) in adapted:
                logits = torch.mm(table, flat.t()).t()  # `tied_logits`
            else:
                logits = torch.matmul(features, table.t()).reshape(rows * n, -1)
            logits = logits + bias
            logits = logits.to(torch.float32)
            temperature = keras.ops.convert_to_tensor(head.temperature_variable)
            logits = logits * temperature
            log_p = torch.log_softmax(logits, -1)
            losses = -torch.gather(log_p, 1, targets[:, None])[:, 0]
            for variable, state in zip(backbone.recurrent_state_variables, new_states):
                variable.value[:rows].copy_(state)
            # Backward: ∂(Σ v ⊙ losses)/∂logits = v ⊙ (softmax − one-hot),
            # through the temperature.
            d_logits = log_p.exp_()
            d_logits[torch.arange(rows * n), targets] -= 1.0
            d_logits.mul_((weights_of * temperature)[:, None])
            d_logits = d_logits.to(table.dtype)
            gradient_of = {}
            if id(bias) in adapted:
                gradient_of[id(bias)] = d_logits.sum(0)
            if terms is not None:
                # The table's update by its output product's gradient, in
                # the same pass over the table as the features' gradient.
                d_features = _tied_table_pass(
                    table, d_logits, flat, terms, update.learning_rate
                )
                gradient_of[id(table)] = None
            else:
                d_features = torch.mm(d_logits, table)
                if id(table) in adapted:
                    if not buffer or buffer[0].shape != table.shape:
                        buffer[:] = [torch.empty_like(table)]
                    gradient_of[id(table)] = torch.mm(d_logits.t(), flat, out=buffer[0])
            d_features = d_features.reshape(features.shape)
            # The backbone's wiring, backwards.
            last = len(cells) - 1
            d_inputs = [None] * len(cells)
            cell_gradients = []
            for k in reversed(range(len(cells))):
                d_out = d_features if (k == last or residual or skip) else None
                if residual:
                    for later in d_inputs[k + 1:]:
                        d_out = later if d_out is None else d_out + later
                elif k < last:
                    d_out = d_inputs[k + 1] if d_out is None else d_out + d_inputs[k + 1]
                cell, kind = cells[k]
                d_inputs[k], grads = _taped_layer_backward(
                    cell, kind, detached[k], inputs[k], tapes[k], d_out
                )
                cell_gradients.append((k, grads))
            if id(table) in adapted:
                d_embedded = d_inputs[0].reshape(rows * n, -1).to(table.dtype)
                if terms is None:
                    gradient_of[id(table)].index_add_(0, ids, d_embedded)
                else:
                    # The lookup's rows of the table's gradient (the update
                    # is linear in the gradient: the rest is applied).
                    _, _, scale = terms
                    if scale is not None:
                        d_embedded = d_embedded / scale[ids]
                    table.index_add_(0, ids, d_embedded, alpha=-update.learning_rate)
            # The prepared weights' gradients, to the variables'.
            mapping = cache["mapping"]
            if mapping is not None:
                for k, grads in cell_gradients:
                    for tensor, gradient in _weight_pairs(detached[k], grads):
                        place = mapping.get(id(tensor))
                        if place is None:
                            continue
                        parameter, view = place
                        if view is None:
                            gradient_of[id(parameter)] = gradient
                        else:
                            total = gradient_of.get(id(parameter))
                            if total is None:
                                total = gradient_of[id(parameter)] = torch.zeros_like(parameter)
                            total.as_strided(*view).add_(gradient)
        if mapping is None:
            derived, d_derived = [], []
            for k, grads in cell_gradients:
                for tensor, gradient in _weight_pairs(cache["recorded"][k], grads):
                    if tensor.requires_grad:
                        derived.append(tensor)
                        d_derived.append(gradient)
            own = cache["own"]
            if own:
                mapped = torch.autograd.grad(derived, own, d_derived, allow_unused=True)
                for p, g in zip(own, mapped):
                    gradient_of[id(p)] = g
        return losses, gradient_of

    return gradients_of


TIED_TABLE_CHUNK_ROWS = 2048


def _tied_table_pass(table, d_logits, features, terms, step_size):
    """`d_logits · table`, and the table updated in place by the rule's
    step for the gradient `d_logitsᵀ · features`, in one pass over the table.

    Chunks of 2,048 rows (2 MB of a 256-wide table): each chunk's
    gradient, its decay and its step are computed while the chunk is in
    cache, instead of writing the table-sized gradient and reading it back
    (10k × 256: 0.4–0.6 ms a segment less, 2-core EPYC, one thread).
    """
    tg, decay, scale = terms
    d_features = torch.zeros(d_logits.shape[0], table.shape[1], dtype=table.dtype)
    rows = min(TIED_TABLE_CHUNK_ROWS, table.shape[0])
    gradient = torch.empty(rows, table.shape[1], dtype=table.dtype)
    transposed = d_logits.t()
    for start in range(0, table.shape[0], rows):
        stop = min(start + rows, table.shape[0])
        theta = table[start:stop]
        d_features.addmm_(d_logits[:, start:stop], theta)
        g = torch.mm(transposed[start:stop], features, out=gradient[: stop - start])
        theta.lerp_(tg[start:stop], decay if not torch.is_tensor(decay) else decay[start:stop])
        if scale is None:
            theta.add_(g, alpha=-step_size)
        else:
            theta.addcdiv_(g, scale[start:stop], value=-step_size)
    return d_features


def _prepared_cells(cells, adapted):
    """The cells' weights for `adaptation_gradients`, and how their
    gradients reach the variables.

    Returns `{"detached", "mapping", "recorded", "own"}`: the weights as the
    loop reads them (detached); and either `mapping`, `{id(weight):
    (parameter, view)}` where every prepared weight that depends on an
    adapted variable is that variable or a view of it (`view`: `(size,
    stride, offset)` into it, `None` for the variable itself) — then the
    weights stay valid while the variables are updated in place — or
    `mapping=None` with the weights `recorded` by autograd from the
    variables `own` (a weight computed from them: prepared anew each time).
    """
    own = [[w.value for w in cell.trainable_weights if id(w.value) in adapted] for cell, _ in cells]
    flat_own = [p for group in own for p in group]
    with _requiring_gradients(flat_own):
        # The per-step weights (not `per_sequence`'s folded and padded
        # copies): the variables or views of them, valid while the
        # variables are updated in place; the same numbers.
        recorded = [cell.step_weights() for cell, _ in cells]
    mapping = {}
    by_id = {id(p): p for p in flat_own}
    for weights in recorded:
        for tensor in _weight_tensors(weights):
            if id(tensor) in by_id:
                mapping[id(tensor)] = (tensor, None)
                continue
            if not tensor.requires_grad:  # (read after the flags are restored)
                continue
            base = tensor._base
            if base is None or id(base) not in by_id:
                mapping = None
                break
            offset = tensor.storage_offset() - base.storage_offset()
            mapping[id(tensor)] = (base, (tensor.size(), tensor.stride(), offset))
        if mapping is None:
            break
    detached = [_detached_weights(w) for w in recorded]
    if mapping is not None:
        # Keyed by the detached tensors the loop reads.
        mapping = {
            id(d): mapping[id(r)]
            for weights, plain in zip(recorded, detached)
            for r, d in zip(_weight_tensors(weights), _weight_tensors(plain))
            if id(r) in mapping
        }
    return {"detached": detached, "mapping": mapping, "recorded": recorded, "own": flat_own}


def _weight_tensors(weights):
    for name in sorted(weights):
        value = weights[name]
        if name == "mogrifier" and value is not None:
            for kernels, b in value:
                yield from kernels
                if b is not None:
                    yield b
        elif isinstance(value, torch.Tensor):
            yield value


def _detached_weights(weights):
    out = {}
    for name, value in weights.items():
        if name == "mogrifier" and value is not None:
            value = [
                ([m.detach() for m in kernels], None if b is None else b.detach())
                for kernels, b in value
            ]
        elif isinstance(value, torch.Tensor):
            value = value.detach()
        out[name] = value
    return out


def _weight_pairs(weights, gradients):
    """`(weight tensor, its gradient)` for every gradient in `gradients`."""
    for name, gradient in gradients.items():
        if name == "mogrifier":
            for (kernels, b), (d_kernels, d_b) in zip(weights["mogrifier"], gradient):
                yield from zip(kernels, d_kernels)
                if b is not None:
                    yield b, d_b
        elif weights[name] is not None:
            yield weights[name], gradient


def _taped_layer(cell, kind, weights, x, h, c):
    """One recurrent layer forward over `x` `(batch, time, m)` from `(h, c)`,
    as `CellRNN.inner_loop` runs it at inference with the fused step;
    returns `(outputs (batch, time, units), h, c, tape)`."""
    steps = x.shape[1]
    x = torch.transpose(x, 0, 1)
    rounds = weights["mogrifier"]
    hoisted = cell.hoists_input_projection
    if kind == "rlstm":
        def project(x_t):
            return _rlstm_projection(cell.units, weights, x_t)

        def gates(z, h_prev, c, tape):
            return _rlstm_gates(weights, z, h_prev, c, None, tape)
    else:
        def project(x_t):
            return _lstm_projection(weights, x_t)

        def gates(z, h_prev, c, tape):
            return _lstm_gates(weights, cell.capped_input_gate, z, h_prev, c, tape)
    if hoisted:
        # `project_input` of every step at once, as `CellRNN` hoists it.
        z_x = project(x.reshape(-1, x.shape[-1])).reshape(steps, x.shape[1], -1)
    tape = {"steps": [], "mogrifier": [], "inputs": []}
    outputs = []
    for t in range(steps):
        if hoisted:
            z = z_x[t]
            h_prev = h
        else:
            x_t, h_prev = x[t], h
            if rounds is not None:
                rounds_tape = []
                x_t, h_prev = _mogrify(
                    rounds, weights["mogrifier_doubled"], x_t, h_prev, rounds_tape
                )
                tape["mogrifier"].append(rounds_tape)
            tape["inputs"].append(x_t)
            z = project(x_t)
        h, c = gates(z, h_prev, c, tape["steps"])
        outputs.append(h)
    if hoisted:
        tape["inputs"] = x
    return torch.transpose(torch.stack(outputs), 0, 1), h, c, tape


def _taped_layer_backward(cell, kind, weights, x, tape, d_outputs):
    """The backward pass of `_taped_layer`: from the gradient of the
    outputs `(batch, time, units)`, the input's gradient `(batch, time, m)`
    and the weights' gradients (by name, as `step_weights` names them)."""
    units = cell.units
    steps = len(tape["steps"])
    d_outputs = torch.transpose(d_outputs, 0, 1)
    saved = [torch.stack(values) for values in zip(*tape["steps"])]
    if kind == "rlstm":
        h_prev, c_prev, i, j, ij, f, capped, c, o, tanh_c = saved
        one_f = 1.0 - f
        # torch.minimum's derivative: to the smaller input, halved at a tie.
        to_i = (i < one_f).to(i.dtype) + 0.5 * (i == one_f).to(i.dtype)
        d_i_gate = i * (1.0 - i)
        d_j_gate = 1.0 - j * j
        a_o = tanh_c * o * (1.0 - o)
        a_c = o * (1.0 - tanh_c * tanh_c)
        a_f = (c_prev - j * (1.0 - to_i)) * (f * one_f)
        a_i = j * to_i * d_i_gate
        b_i = j * d_i_gate
        a_j = capped * d_j_gate
        b_j = i * d_j_gate
        width = 3 * units
    else:
        h_prev, c_prev, z_i, z_f, f, i, tanh_j, c, o, tanh_c = saved
        a_o = tanh_c * o * (1.0 - o)
        a_c = o * (1.0 - tanh_c * tanh_c)
        a_i = tanh_j * i * (1.0 - i)
        a_j = i * (1.0 - tanh_j * tanh_j)
        a_f = c_prev * f * (1.0 - f)
        if cell.capped_input_gate:
            minus_f = -z_f
            to_i = (z_i < minus_f).to(i.dtype) + 0.5 * (z_i == minus_f).to(i.dtype)
            a_f = a_f - a_i * (1.0 - to_i)
            a_i = a_i * to_i
        width = 4 * units
    # Per step from here on (views; indexing in the loop costs a call each).
    if kind == "rlstm":
        a_o, a_c, a_f, a_i, b_i, a_j, b_j, f = (
            t.unbind(0) for t in (a_o, a_c, a_f, a_i, b_i, a_j, b_j, f)
        )
    else:
        a_o, a_c, a_f, a_i, a_j, f = (t.unbind(0) for t in (a_o, a_c, a_f, a_i, a_j, f))
    d_outputs = d_outputs.unbind(0)
    batch = d_outputs[0].shape[0]
    d_z = torch.empty(steps, batch, width, dtype=d_outputs[0].dtype)
    d_z_o = torch.empty(steps, batch, units, dtype=d_z.dtype) if kind == "rlstm" else None
    recurrent_t = weights["recurrent_kernel"].t()
    rounds = weights["mogrifier"]
    hoisted = rounds is None and cell.hoists_input_projection
    kernel = weights["kernel"]
    narrow = kind == "rlstm" and kernel.shape[-1] == 2 * units
    kernel_t = kernel.t()
    d_x = None if hoisted else [None] * steps
    mogrifier_rows = mogrifier_factors = None
    if rounds is not None:
        mogrifier_factors = _mogrify_factors(tape["mogrifier"], weights["mogrifier_doubled"])
        transposed = [[m.t() for m in kernels] for kernels, _ in rounds]
        # Per round: each matrix's (input, output gradient) rows, then the
        # bias's gradient rows.
        mogrifier_rows = [[[] for _ in kernels] + [[]] for kernels, _ in rounds]
    if kind == "rlstm":
        output_t = weights["output_kernel"].t()
        forget_t = weights["forget_kernel"].t()
    d_h = d_c = None
    for t in reversed(range(steps)):
        dh = d_outputs[t] if d_h is None else d_outputs[t] + d_h
        dz = d_z[t]
        if kind == "rlstm":
            dzo = torch.mul(dh, a_o[t], out=d_z_o[t])
            dc = dh * a_c[t]
            if d_c is not None:
                dc += d_c
            dc = torch.addmm(dc, dzo, output_t)
            dzf = torch.mul(dc, a_f[t], out=dz[:, 2 * units:])
            dij = torch.mm(dzf, forget_t)
            torch.mul(dc, a_i[t], out=dz[:, :units]).addcmul_(dij, b_i[t])
            torch.mul(dc, a_j[t], out=dz[:, units:2 * units]).addcmul_(dij, b_j[t])
        else:
            torch.mul(dh, a_o[t], out=dz[:, 3 * units:])
            dc = dh * a_c[t]
            if d_c is not None:
                dc += d_c
            torch.mul(dc, a_i[t], out=dz[:, :units])
            torch.mul(dc, a_f[t], out=dz[:, units:2 * units])
            torch.mul(dc, a_j[t], out=dz[:, 2 * units:3 * units])
        d_h = torch.mm(dz, recurrent_t)
        d_c = dc * f[t]
        if not hoisted:
            d_in = torch.mm(dz[:, :2 * units] if narrow else dz, kernel_t)
            if rounds is not None:
                d_in, d_h = _mogrify_backward(
                    transposed, tape["mogrifier"][t], mogrifier_factors[t], d_in, d_h,
                    mogrifier_rows,
                )
            d_x[t] = d_in
    flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
    gradients = {"recurrent_kernel": torch.mm(flat(h_prev).t(), flat(d_z))}
    inputs = tape["inputs"] if hoisted else torch.stack(tape["inputs"])
    d_projected = d_z[..., :2 * units] if narrow else d_z
    gradients["kernel"] = torch.mm(flat(inputs).t(), flat(d_projected))
    if hoisted:
        d_x = torch.mm(flat(d_projected), kernel_t).reshape(steps, batch, -1)
    else:
        d_x = torch.stack(d_x)
    if kind == "rlstm":
        gradients["forget_kernel"] = torch.mm(flat(ij).t(), flat(d_z[..., 2 * units:]))
        gradients["output_kernel"] = torch.mm(flat(c).t(), flat(d_z_o))
        gradients["input_bias"] = flat(d_z).sum(0)
        gradients["output_bias"] = flat(d_z_o).sum(0)
    else:
        gradients["bias"] = flat(d_z).sum(0)
    if rounds is not None:
        gradients["mogrifier"] = [
            (
                [
                    torch.mm(torch.cat([a for a, _ in pairs]).t(), torch.cat([d for _, d in pairs]))
                    for pairs in rows[:-1]
                ],
                None if bias is None else torch.cat(rows[-1]).sum(0),
            )
            for rows, (_, bias) in zip(mogrifier_rows, rounds)
        ]
    return torch.transpose(d_x, 0, 1), gradients


def _mogrify_factors(tapes, doubled):
    """Per step and round, `(∂out/∂gated, ∂out/∂z)` of `_mogrify`'s gate
    `out = d · σ(z) ⊙ gated` (d = 2 if `doubled`, else 1) but for the
    output's gradient, computed for every step at once."""
    factors = []
    for r in range(len(tapes[0])):
        gate = torch.stack([tape[r][1] for tape in tapes])
        gated = torch.stack([tape[r][2] for tape in tapes])
        if doubled:
            gate = gate + gate
        d_z = gated * gate * (1.0 - (gate * 0.5 if doubled else gate))
        factors.append((gate.unbind(0), d_z.unbind(0)))
    return [[(g[t], z[t]) for g, z in factors] for t in range(len(tapes))]


def _mogrify_backward(transposed, tape, factors, d_x, d_h, rows):
    """The backward pass of `_mogrify` for one step: the gradients of its
    inputs `x` and `h` from those of its outputs (`transposed`: each
    round's matrices, transposed); each matrix's input rows and output
    gradients appended to `rows` (summed into the weights' gradients once
    per segment)."""
    for i in reversed(range(1, len(transposed) + 1)):
        kernels = transposed[i - 1]
        inputs = tape[i - 1][0]
        to_gated, to_z = factors[i - 1]
        odd = i % 2 == 1
        d_out = d_x if odd else d_h
        d_gated = d_out * to_gated
        d_z = d_out * to_z
        rows[i - 1][-1].append(d_z)
        for k in reversed(range(len(kernels))):
            rows[i - 1][k].append((inputs[k], d_z))
            d_z = torch.mm(d_z, kernels[k])
        if odd:
            d_x, d_h = d_gated, d_h + d_z
        else:
            d_x, d_h = d_x + d_z, d_gated
    return d_x, d_h


def _stacked(outputs):
    return torch.utils._pytree.tree_map(
        lambda *xs: torch.stack(xs), *outputs
    ) if len(outputs) > 1 else torch.utils._pytree.tree_map(
        lambda x: x[None], outputs[0]
    )


def model_loop(model, fn, jit_compile):
    """A Python loop over the leading axis, under `torch.no_grad()`.

    Nothing leaves the device between iterations (no host round trip); the
    outputs are stacked at the end.
    """
    del model, jit_compile

    def run(carry, constants, *sequences):
        outputs = []
        with torch.no_grad():
            for k in range(int(sequences[0].shape[0])):
                carry, output = fn(carry, constants, *[s[k] for s in sequences])
                outputs.append(output)
        return carry, _stacked(outputs)

    return run


def in_place_update(update_rule):
    """The update rule `update_rule` as PyTorch's fused in-place operations.

    Returns `apply(variables, theta_g, rms, hyperparameters) -> step`, where
    `step(gradients)` updates every variable's tensor in place, or `None` for
    a rule it does not know. Written as `update_rules` writes the rule, evaluated
    eagerly, every elementwise operation is a pass over every adapted weight
    (the tied 10k × 256 table is 10 MB): about ten passes and a copy into
    the variable per segment. Here the terms that do not change during a
    call (`RMS + ε`, the decay `min(1, λ · RMS / mean(RMS))`) are computed
    once per call and each segment's update is two passes, in place:
    `θ.lerp_(θ_g, decay)` (`θ + decay · (θ_g − θ)`) then
    `θ.addcdiv_(g, RMS + ε, value=-η)` — the same rule (both terms read θ
    before the step), rounded differently (to float32 rounding of the
    `keras.ops` form; the rule tests of
    `tests/evaluation/dynamic_evaluator_test.py` run through it).
    """
    if update_rule not in ("sgd", "rms_global_prior", "rms_rms_prior"):
        return None

    def apply(variables, theta_g, rms, hyperparameters):
        learning_rate, epsilon, decay_rate, mean_rms = (
            float(h) for h in hyperparameters.detach().cpu().tolist()
        )
        with torch.no_grad():
            targets = [v.value for v in variables]
            invariants = []
            for theta, tg, r in zip(targets, theta_g, rms):
                r = r.to(theta.dtype)
                if update_rule == "rms_rms_prior":
                    decay = torch.minimum(
                        torch.ones((), dtype=theta.dtype, device=theta.device),
                        decay_rate * r / mean_rms,
                    )
                else:
                    decay = decay_rate
                scale = None if update_rule == "sgd" else r + epsilon
                invariants.append((tg.to(theta.dtype), decay, scale))

            def step(gradients):
                for theta, g, (tg, decay, scale) in zip(targets, gradients, invariants):
                    if g is None:  # updated already (`adaptation_gradients`)
                        continue
                    g = g.to(theta.dtype)
                    theta.lerp_(tg, decay)
                    if scale is None:
                        theta.add_(g, alpha=-learning_rate)
                    else:
                        theta.addcdiv_(g, scale, value=-learning_rate)

            step.terms = dict(zip((id(t) for t in targets), invariants))
            step.learning_rate = learning_rate
        return step

    return apply


def model_adaptation_loop(
    model, variables, objective, update, jit_compile, update_rule=None,
    token_losses_objective=False,
):
    """Gradient, update and assignment per index, in a Python loop.

    The update runs under `torch.no_grad()`; a rule `in_place_update` knows
    updates the variables' tensors in place, any other is copied into the
    variables. Nothing is read back to the host in the loop. Where the
    objective is dynamic evaluation's own (`token_losses_objective`) and
    `adaptation_gradients` covers the model, its hand-written backward pass
    takes the gradients.
    """
    by_hand = None
    if token_losses_objective:
        by_hand = adaptation_gradients(model, variables)
    gradients_of = by_hand or model_gradients(model, variables, objective, jit_compile)
    fused = in_place_update(update_rule)

    def adapt(constants, *sequences):
        outputs = []
        step = fused(variables, *constants) if fused is not None else None
        for k in range(int(sequences[0].shape[0])):
            if by_hand is not None and step is not None:
                aux, gradients = by_hand(*[s[k] for s in sequences], update=step)
            else:
                aux, gradients = gradients_of(*[s[k] for s in sequences])
            with torch.no_grad():
                if step is not None:
                    step(gradients)
                else:
                    values = [v.value for v in variables]
                    for variable, value in zip(
                        variables, update(values, gradients, *constants)
                    ):
                        variable.assign(value)
            outputs.append(aux)
        return _stacked(outputs)

    return adapt


def sync_training_state(model):
    del model  # `fit` updates the variables themselves


def data_parallel(devices=None):
    raise ValueError(
        "Expected KERAS_BACKEND=tensorflow (MirroredStrategy) or jax "
        "(keras.distribution.DataParallel) for data-parallel training: Keras "
        "offers no multi-device `fit` with the PyTorch backend. Received: "
        f"backend 'torch', devices={devices!r}"
    )


@contextlib.contextmanager
def skip_non_finite_updates(optimizer):
    """`optimizer.apply` (what the PyTorch trainer calls) skips non-finite steps.

    The step runs eagerly: a Python branch on the (synchronised) flag.
    """
    original = optimizer.apply

    def apply(grads, trainable_variables=None):
        grads = list(grads)
        if bool(all_finite(grads)):
            original(grads, trainable_variables)

    with patched(optimizer, "apply", apply):
        yield


@contextlib.contextmanager
def keep_values_on_error(model):
    del model  # the trainer updates the variables in place
    yield


def optimize_compiled_code(enabled):
    del enabled  # no such setting
    return False


def run_functions_eagerly(enabled):
    del enabled  # eager anyway
    return False


def is_concrete(x):
    del x
    return not torch.compiler.is_compiling()
