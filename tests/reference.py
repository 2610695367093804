"""Independent NumPy implementations of the equations of SPEC §1–3.

Written from the equations alone (not from the package's code), with the
weights passed explicitly, one time step at a time.
"""

import numpy as np


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def mogrify(x, h, rounds):
    """`rounds` is a list of (matrices, bias) per round, in order.

    Odd rounds (1, 3, ...) gate x by h, even rounds gate h by x; each round
    multiplies its source by its matrices in turn.
    """
    for i, (matrices, bias) in enumerate(rounds, start=1):
        source = h if i % 2 == 1 else x
        z = source
        for m in matrices:
            z = z @ m
        if bias is not None:
            z = z + bias
        if i % 2 == 1:
            x = 2.0 * sigmoid(z) * x
        else:
            h = 2.0 * sigmoid(z) * h
    return x, h


def lstm_step(x, h, c, kernel, recurrent_kernel, bias, capped=True):
    n = h.shape[-1]
    z = x @ kernel + h @ recurrent_kernel + (0 if bias is None else bias)
    i = sigmoid(z[:, :n])
    f = sigmoid(z[:, n : 2 * n])
    j = np.tanh(z[:, 2 * n : 3 * n])
    o = sigmoid(z[:, 3 * n :])
    if capped:
        i = np.minimum(i, 1.0 - f)
    c = f * c + i * j
    return o * np.tanh(c), c


def rlstm_step(
    x, h, c, kernel, recurrent_kernel, forget_kernel, output_kernel, bias,
    state_mask=None,
):
    n = h.shape[-1]
    b = np.zeros(4 * n) if bias is None else bias
    w_i, w_j = kernel[:, :n], kernel[:, n:]
    u_i, u_j, u_f = (recurrent_kernel[:, k * n : (k + 1) * n] for k in range(3))
    b_i, b_j, b_f, b_o = (b[k * n : (k + 1) * n] for k in range(4))
    i = sigmoid(x @ w_i + h @ u_i + b_i)
    j = np.tanh(x @ w_j + h @ u_j + b_j)
    f = sigmoid((i * j) @ forget_kernel + h @ u_f + b_f)
    c = f * c + np.minimum(i, 1.0 - f) * j
    c_seen = c if state_mask is None else c * state_mask
    o = sigmoid(c_seen @ output_kernel + b_o)
    return o * np.tanh(c), c


def run_sequence(step, xs, n, rounds=(), input_mask=None, state_mask=None,
                 adaptation=None, **weights):
    """Runs a mogrified cell over `xs` (batch, time, m) from zero state.

    Masks are per sequence (shared over time). `adaptation` is an (H, H)
    matrix added as h[:, :H] += h[:, :H] @ M after each step.
    """
    batch, time, _ = xs.shape
    h = np.zeros((batch, n))
    c = np.zeros((batch, n))
    outputs = []
    for t in range(time):
        x = xs[:, t]
        hp = h
        if input_mask is not None:
            x = x * input_mask
        if state_mask is not None:
            hp = hp * state_mask
        x, hp = mogrify(x, hp, rounds)
        if step is rlstm_step:
            h, c = step(x, hp, c, state_mask=state_mask, **weights)
        else:
            h, c = step(x, hp, c, **weights)
        if adaptation is not None:
            size = adaptation.shape[0]
            h = h.copy()
            h[:, :size] = h[:, :size] + h[:, :size] @ adaptation
        outputs.append(h)
    return np.stack(outputs, axis=1), h, c


def token_nll(ids, logits):
    """-log((1/D) Σ_d softmax(logits_d)[w]) in float64 (SPEC §4).

    `logits` is `(batch, samples, time, vocab)`, or `(batch, time, vocab)`
    for one sample; `ids` is `(batch, time)`.
    """
    logits = np.asarray(logits, np.float64)
    if logits.ndim == ids.ndim + 1:
        logits = logits[:, None]
    shift = logits.max(axis=-1, keepdims=True)
    log_z = shift[..., 0] + np.log(np.exp(logits - shift).sum(-1))
    idx = np.broadcast_to(ids[:, None, :, None], logits.shape[:-1] + (1,))
    log_p = np.take_along_axis(logits, idx, axis=-1)[..., 0] - log_z
    m = log_p.max(axis=1, keepdims=True)
    return -(m[:, 0] + np.log(np.exp(log_p - m).mean(axis=1)))


def neural_cache_losses(features, log_p_model, targets, cache_size, interpolation, flatness):
    """Krause et al.'s eq. 3, position by position (one stream, one pass).

    `features` `(T, d)` are the cache's keys, `log_p_model` `(T, V)` the
    model's log-probabilities and `targets` `(T,)` the tokens predicted; the
    cache at position t holds the last `cache_size` positions before it:
    `p = (1 - λ) p_model(y_t) + λ Σ_{i: y_i = y_t} softmax_i(θ h_t · h_i)`.
    Returns the losses `-log p`, `(T,)`.
    """
    h = np.asarray(features, "float64")
    losses = []
    for t, y in enumerate(targets):
        p = np.exp(log_p_model[t, y])
        past = np.arange(max(0, t - cache_size), t)
        if interpolation > 0 and len(past):
            scores = flatness * h[past] @ h[t]
            weights = np.exp(scores - scores.max())
            hit = weights[targets[past] == y].sum()
            p = (1 - interpolation) * p + interpolation * hit / weights.sum()
        losses.append(-np.log(p))
    return np.array(losses)
