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


def model_gradients(model, variables, fn, jit_compile):
    del jit_compile

    def run(*args):
        parameters = [v.value for v in variables]
        flags = [p.requires_grad for p in parameters]
        try:
            for p in parameters:
                p.requires_grad_(True)
            with torch.enable_grad():
                with keras.StatelessScope() as scope:
                    objective, aux = fn(*args)
                gradients = torch.autograd.grad(
                    objective, parameters, allow_unused=True
                )
        finally:
            for p, flag in zip(parameters, flags):
                p.requires_grad_(flag)
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
    kernel = weights["kernel"]
    recurrent_kernel = weights["recurrent_kernel"]

    def mogrify(x, h):
        # `Mogrifier.mogrify`: round i gates x (odd i) or h (even i).
        for i, (kernels, bias) in enumerate(rounds, start=1):
            z = h if i % 2 == 1 else x
            for matrix in kernels:
                z = torch.matmul(z, matrix)
            if bias is not None:
                z = torch.add(z, bias)
            if i % 2 == 1:
                x = torch.sigmoid(z) * x
                if doubled:
                    x = x + x
            else:
                h = torch.sigmoid(z) * h
                if doubled:
                    h = h + h
        return x, h

    if isinstance(cell, RLSTMCell) and type(cell).step is RLSTMCell.step:
        units = cell.units
        input_bias = weights["input_bias"]
        forget_kernel = weights["forget_kernel"]
        output_kernel = weights["output_kernel"]
        output_bias = weights["output_bias"]

        def project(x):
            # `RLSTMCell.project_input`.
            z_x = torch.matmul(x, kernel)
            if z_x.shape[-1] == 2 * units:
                z_x = torch.nn.functional.pad(z_x, (0, units))
            if input_bias is not None:
                z_x = torch.add(z_x, input_bias)
            return z_x

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
                z_x = project(x)
            z = torch.add(z_x, torch.matmul(h_prev, recurrent_kernel))
            z_i, z_j, z_f = torch.chunk(z, 3, dim=-1)
            i = torch.sigmoid(z_i)
            j = torch.tanh(z_j)
            f = torch.sigmoid(torch.add(z_f, torch.matmul(i * j, forget_kernel)))
            c = f * c_prev + torch.minimum(i, 1.0 - f) * j
            c_seen = c if state_mask is None else c * state_mask
            z_o = torch.matmul(c_seen, output_kernel)
            if output_bias is not None:
                z_o = torch.add(z_o, output_bias)
            h = torch.sigmoid(z_o) * torch.tanh(c)
            return h, [h, c]

        return rlstm_step
    if isinstance(cell, MogrifierLSTMCell) and type(cell).step is MogrifierLSTMCell.step:
        capped = cell.capped_input_gate
        bias = weights["bias"]

        def lstm_step(x, states):
            h_prev, c_prev = states[0], states[1]
            if masked:
                h_prev = h_prev * cell.get_recurrent_dropout_mask(h_prev)
            if projected:
                z_x = x
            else:
                if rounds is not None:
                    x, h_prev = mogrify(x, h_prev)
                # `MogrifierLSTMCell.project_input`.
                z_x = torch.matmul(x, kernel)
                if bias is not None:
                    z_x = torch.add(z_x, bias)
            z = torch.add(z_x, torch.matmul(h_prev, recurrent_kernel))
            z_i, z_f, z_j, z_o = torch.chunk(z, 4, dim=-1)
            f = torch.sigmoid(z_f)
            i = torch.sigmoid(torch.minimum(z_i, -z_f) if capped else z_i)
            c = f * c_prev + i * torch.tanh(z_j)
            h = torch.sigmoid(z_o) * torch.tanh(c)
            return h, [h, c]

        return lstm_step
    return None


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
                    g = g.to(theta.dtype)
                    theta.lerp_(tg, decay)
                    if scale is None:
                        theta.add_(g, alpha=-learning_rate)
                    else:
                        theta.addcdiv_(g, scale, value=-learning_rate)

        return step

    return apply


def model_adaptation_loop(
    model, variables, objective, update, jit_compile, update_rule=None
):
    """Gradient, update and assignment per index, in a Python loop.

    The update runs under `torch.no_grad()`; a rule `in_place_update` knows
    updates the variables' tensors in place, any other is copied into the
    variables. Nothing is read back to the host in the loop.
    """
    gradients_of = model_gradients(model, variables, objective, jit_compile)
    fused = in_place_update(update_rule)

    def adapt(constants, *sequences):
        outputs = []
        step = fused(variables, *constants) if fused is not None else None
        for k in range(int(sequences[0].shape[0])):
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
