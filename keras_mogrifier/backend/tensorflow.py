"""TensorFlow implementation of the compiled steps of dynamic evaluation.

This is the only module of keras_mogrifier that imports TensorFlow. It builds
three `tf.function`s around a Keras model that maps token ids `(batch, time)`
to logits `(batch, time, vocab)`:

- `make_forward_step`: scores one segment (static evaluation);
- `make_dynamic_step`: scores one segment, takes the gradient of its mean
  loss and applies the update rule of dynamic evaluation to every adapted
  variable (`make_update`, fused with XLA), all in one compiled call (no
  host round trip per tensor);
- `make_gradient_statistics_step`: accumulates squared minibatch gradients.

Each step slices its segment out of the whole (uploaded once) token array on
the device, so that a call costs one dispatch. The recurrent state lives in the
model's own state variables, which the model reads and assigns inside the
step; reading a variable cuts the gradient, which is exactly the truncation at
the segment start that dynamic evaluation uses.
"""

import keras
import tensorflow as tf


def default_jit_compile(model):
    """`jit_compile="auto"`: XLA when a GPU is visible and every layer allows it.

    On CPU, XLA did not make recurrent models faster on this project's
    machines, and Keras's cuDNN LSTM path declares itself not XLA-compatible.
    """
    if not tf.config.list_physical_devices("GPU"):
        return False
    return all(getattr(layer, "supports_jit", True) for layer in model._flatten_layers())


def _raw(variable):
    """The `tf.Variable` behind a Keras variable (what a tape can watch)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _token_losses(model, x, y):
    logits = model(x, training=False)
    logits = tf.cast(logits, "float32")
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)


def _segment(tensors, start, segment_length):
    """Slices `[:, start:start + segment_length]` with a static size."""
    out = []
    for t in tensors:
        batch = t.shape[0] if t.shape[0] is not None else tf.shape(t)[0]
        out.append(tf.slice(t, [0, start], [batch, segment_length]))
    return out


def _dense(gradient, variable):
    if gradient is None:
        return tf.zeros_like(variable)
    if isinstance(gradient, tf.IndexedSlices):
        # The update also decays every element, so it is dense anyway.
        return tf.convert_to_tensor(gradient)
    return gradient


def make_forward_step(model, segment_length, jit_compile):
    """Returns `step(x, y, w, start) -> w * token losses` of one segment.

    `x`, `y` (int32) and `w` (float32) are `(batch, padded_time)`; the segment
    is `[:, start:start + segment_length]`.
    """

    def step(x, y, w, start):
        x, y, w = _segment((x, y, w), start, segment_length)
        return _token_losses(model, x, y) * w

    return tf.function(step, jit_compile=jit_compile)


def make_update(variables):
    """Returns `update(gradients, theta_g, rms, hyperparameters)`, XLA-fused.

    For every variable θ with gradient `g`, trained value `θ_g` and `RMS`:

        θ ← θ − η · g / (RMS + ε) + min(1, λ · RMS / mean(RMS)) ⊙ (θ_g − θ)

    with `hyperparameters = [η, ε, λ, mean(RMS)]` (float32). Both terms use θ
    before the step. The update is memory-bound (it reads five arrays the size
    of the model per segment); compiled on its own with XLA it is one fused
    pass per variable instead of one pass per elementwise op, about twice as
    fast on CPU, and it compiles in a moment since it holds no loop. When the
    step around it is compiled with XLA too, it is simply inlined.
    """
    raw = [_raw(v) for v in variables]

    def update(gradients, theta_g, rms, hyperparameters):
        learning_rate, epsilon, decay_rate, mean_rms = tf.unstack(hyperparameters)
        for v, g, target, r in zip(raw, gradients, theta_g, rms):
            dtype = v.dtype
            theta = tf.convert_to_tensor(v)
            r = tf.cast(r, dtype)
            lr, eps = tf.cast(learning_rate, dtype), tf.cast(epsilon, dtype)
            decay = tf.minimum(
                tf.ones((), dtype), tf.cast(decay_rate, dtype) * r / tf.cast(mean_rms, dtype)
            )
            if isinstance(g, tf.IndexedSlices):
                # An embedding's gradient touches a few rows: scatter their
                # step (duplicate rows add up) rather than densify it.
                rows = lr * tf.cast(g.values, dtype) / (tf.gather(r, g.indices) + eps)
                new = theta + decay * (target - theta)
                v.assign(tf.tensor_scatter_nd_sub(new, g.indices[:, None], rows))
            else:
                g = tf.cast(_dense(g, v), dtype)
                v.assign(theta - lr * g / (r + eps) + decay * (target - theta))

    return tf.function(update, jit_compile=True)


def make_dynamic_step(model, variables, segment_length, jit_compile):
    """Returns the fused score-then-adapt step of dynamic evaluation.

    `step(x, y, w, start, theta_g, rms, hyperparameters)` scores the segment
    with the current weights θ and returns `w * token losses` of shape
    `(batch, segment_length)`. Then, with `g` the gradient of the sum over
    streams of each stream's mean segment loss (so a per-stream variable gets
    its own stream's gradient), it applies `make_update`'s rule to every
    variable. `rms` holds √MS_g in the shapes of the variables and
    `hyperparameters` is `[η, ε, λ, mean(RMS)]`.
    """
    raw = [_raw(v) for v in variables]
    update = make_update(variables)

    def step(x, y, w, start, theta_g, rms, hyperparameters):
        x, y, w = _segment((x, y, w), start, segment_length)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(raw)
            losses = _token_losses(model, x, y) * w
            counts = tf.maximum(tf.reduce_sum(w, axis=1), 1.0)
            objective = tf.reduce_sum(tf.reduce_sum(losses, axis=1) / counts)
        gradients = tape.gradient(objective, raw)
        gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, raw)]
        update(gradients, theta_g, rms, hyperparameters)
        return losses

    return tf.function(step, jit_compile=jit_compile)


def make_gradient_statistics_step(model, variables, per_stream, jit_compile):
    """Returns `(step, accumulators)` for the mean squared gradient MS_g.

    `step(x, y, w) -> mean loss` adds, for each variable, the square of the
    gradient of the batch's mean token loss (weighted by `w`, float32 of the
    shape of `y`) to its accumulator (a
    `tf.Variable` of float32). For a per-stream variable (leading axis = one
    slice per stream) the gradient is summed over that axis first: that is the
    gradient of one matrix shared by the whole batch, which is the statistic a
    single stream's matrix needs; its accumulator has no stream axis.
    """
    raw = [_raw(v) for v in variables]
    accumulators = [
        tf.Variable(
            tf.zeros(v.shape[1:] if ps else v.shape, "float32"), trainable=False
        )
        for v, ps in zip(raw, per_stream)
    ]

    def step(x, y, w):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(raw)
            losses = _token_losses(model, x, y) * w
            loss = tf.reduce_sum(losses) / tf.maximum(tf.reduce_sum(w), 1.0)
        gradients = tape.gradient(loss, raw)
        for v, g, acc, ps in zip(raw, gradients, accumulators, per_stream):
            g = tf.cast(_dense(g, v), "float32")
            if ps:
                g = tf.reduce_sum(g, axis=0)
            acc.assign_add(tf.square(g))
        return loss

    return tf.function(step, jit_compile=jit_compile), accumulators
