"""The objective of `LanguageModel`: the loss (D samples, IWAE, chunked
softmax, L2), the training metrics, `compile`'s checks and the guard that
keeps a non-finite step from changing anything."""

import threading

import keras
from keras import ops

from keras_mogrifier.losses.iwae_dropout_loss import IWAEDropoutLoss
from keras_mogrifier.metrics._token_nll_metric import TokenNLLMetric

# The carried state a guarded training step read, for `compute_loss` (one
# per thread: MirroredStrategy traces its replicas in threads).
_STEP_STATES = threading.local()


class ObjectiveMixin:
    """`compute_loss`, `compute_metrics` and `compile` of `LanguageModel`."""

    def _remember_step_state(self, initial_state, layer, training):
        # For `_guard_non_finite_step` (in `fit` only).
        if not (training is True and getattr(self, "_non_finite_guard", False)):
            return
        if layer == 0:
            _STEP_STATES.values = (id(self), [])
        _STEP_STATES.values[1].extend(initial_state)

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = self._objective(x, y, y_pred, sample_weight, training)
        if training and getattr(self, "_non_finite_guard", False):
            loss = self._guard_non_finite_step(loss)
        return loss

    def _guard_non_finite_step(self, loss):
        """A training step whose loss is not finite changes nothing (`fit`).

        Its change of the carried state is undone here, and every gradient
        is made non-finite with the loss (× exactly 1 when it is finite),
        so that the optimizer, patched for `fit`, skips the update.
        """
        finite = ops.all(ops.isfinite(loss))
        remembered = getattr(_STEP_STATES, "values", None)
        _STEP_STATES.values = None
        if remembered is not None and remembered[0] == id(self):
            for variable, before in zip(self.recurrent_state_variables, remembered[1]):
                value = ops.convert_to_tensor(variable)
                after = ops.slice(value, (0, 0), (ops.shape(before)[0], self.units))
                kept = ops.where(finite, after, before)
                variable.assign(ops.slice_update(value, (0, 0), kept))
        return loss * (1.0 + ops.stop_gradient(0.0 * loss))

    def _objective(self, x, y, y_pred, sample_weight, training):
        loss = self.loss
        if (
            isinstance(loss, IWAEDropoutLoss)
            and loss.samples not in (None, 1)
            and y_pred is not None
            and len(y_pred.shape) == 3
        ):
            # Evaluation (and Keras's symbolic build) computes one sample:
            # with dropout off the D copies would be identical, and the
            # loss of one sample is the ordinary cross-entropy.
            one_sample = IWAEDropoutLoss(
                name=loss.name, reduction=loss.reduction, dtype=loss.dtype
            )
            return self._add_regularization(one_sample(y, y_pred, sample_weight=sample_weight))
        if not (training and self.softmax_chunk_size is not None):
            return super().compute_loss(
                x, y, y_pred, sample_weight, training=training
            )
        if not isinstance(loss, IWAEDropoutLoss):
            raise ValueError(
                "Expected `compile(loss=IWAEDropoutLoss())` for a "
                "LanguageModel with `softmax_chunk_size` set (the chunked "
                "softmax computes that objective). Received: "
                f"loss={loss!r}"
            )
        if loss.samples is not None and loss.samples != self.samples:
            raise ValueError(
                f"Expected `y_pred` to have {loss.samples} samples on axis 1 "
                f"(IWAEDropoutLoss(samples={loss.samples})). Received: a "
                f"model with samples={self.samples}"
            )
        self._check_features(y_pred)
        log_prob = self.target_log_probabilities(y_pred, y, training=True)
        # The metrics need the same log-probabilities, which exist only here:
        # they are updated now (`compute_metrics` then only reports). On JAX
        # this is also the only place whose metric updates the trainer keeps
        # from inside the differentiated step.
        self._update_chunked_metrics(y, log_prob, sample_weight)
        objective = _LogMeanExpLoss(
            name=loss.name, reduction=loss.reduction, dtype=loss.dtype
        )
        if sample_weight is not None:
            # As IWAEDropoutLoss: per-sequence weights count once per token.
            ids = ops.convert_to_tensor(y)
            sample_weight = ops.convert_to_tensor(sample_weight, loss.dtype)
            while len(sample_weight.shape) < len(ids.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            sample_weight = ops.broadcast_to(sample_weight, ops.shape(ids))
        return self._add_regularization(
            objective(y, log_prob, sample_weight=sample_weight)
        )

    def _add_regularization(self, total):
        # What `Model.compute_loss` adds to the compiled loss: the layers'
        # losses (the L2 penalties).
        for extra in self.losses:
            total = total + ops.sum(ops.cast(extra, total.dtype))
        return total

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if self._is_chunked_features(y_pred):
            # Updated by `compute_loss`, which had the target probabilities.
            return self.get_metrics_result()
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def _is_chunked_features(self, y_pred):
        # Evaluation and `predict` return logits (vocabulary width), a chunked
        # training step the softmax features (a different width, see build).
        return (
            self.softmax_chunk_size is not None
            and self.built
            and y_pred.shape[-1] == self.softmax_width
        )

    def _update_chunked_metrics(self, y, log_prob, sample_weight):
        compiled = getattr(self, "_compile_metrics", None)
        if compiled is None:
            return
        # Two logits, "the target" and "anything else", carry the target's
        # probability exactly: log_softmax([lp, log(1 − e^lp)])[0] = lp.
        log_prob = ops.stop_gradient(log_prob)
        two_way = ops.stack([log_prob, _log1mexp(log_prob)], axis=-1)
        targets = ops.zeros_like(y)
        if not compiled.built:
            compiled.build(targets, two_way)
        for metric in compiled.metrics:
            if not isinstance(metric, TokenNLLMetric):
                raise ValueError(
                    "Expected training metrics of the target's probability "
                    "(`Perplexity`, `BitsPerCharacter`) with "
                    "`softmax_chunk_size` set: the logits are never formed. "
                    f"Received: metric {metric.name!r} "
                    f"({type(metric).__name__})"
                )
        compiled.update_state(targets, two_way, sample_weight)

    def _check_features(self, y_pred):
        if y_pred.shape[-1] != self.softmax_width:
            raise ValueError(
                "Expected the softmax features of a chunked training step, "
                f"last axis {self.softmax_width}, as `y_pred`. Received: "
                f"y_pred.shape={tuple(y_pred.shape)}"
            )

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, weighted_metrics=None, **kwargs):
        # A model loaded from `.keras` compiles from its serialized config.
        if isinstance(loss, dict):
            loss = keras.losses.deserialize(loss)
        if (
            isinstance(loss, IWAEDropoutLoss)
            and loss.samples is not None
            and loss.samples != self.samples
        ):
            raise ValueError(
                f"Expected `y_pred` to have {loss.samples} samples on axis 1 "
                f"(IWAEDropoutLoss(samples={loss.samples})), but the model "
                f"trains {self.samples} dropout sample(s) per sequence: use "
                f"IWAEDropoutLoss() or IWAEDropoutLoss(samples={self.samples}). "
                f"Received: a model with samples={self.samples}"
            )
        if self.softmax_chunk_size is not None:
            self._check_chunked_compile(loss, metrics, weighted_metrics)
        super().compile(
            optimizer=optimizer, loss=loss, metrics=metrics,
            weighted_metrics=weighted_metrics, **kwargs,
        )

    def compile_from_config(self, config):
        # As Keras's (which skips a subclass that overrides `compile`): the
        # checks above then run on a model loaded from `.keras` too.
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if getattr(self, "optimizer", None) is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    def _check_chunked_compile(self, loss, metrics, weighted_metrics):
        """What a chunked training step can compute, checked before any step.

        Its logits are never formed: the loss must be `IWAEDropoutLoss`,
        which the chunks compute, and the metrics must need only the
        target's probability.
        """
        if loss is not None and not isinstance(loss, IWAEDropoutLoss):
            raise ValueError(
                "Expected `compile(loss=IWAEDropoutLoss())` for a "
                "LanguageModel with `softmax_chunk_size` set (the chunked "
                f"softmax computes that objective). Received: loss={loss!r}"
            )
        for group in (metrics, weighted_metrics):
            for metric in keras.tree.flatten(group or []):
                if isinstance(metric, dict):
                    metric = keras.metrics.deserialize(metric)
                if not isinstance(metric, TokenNLLMetric):
                    raise ValueError(
                        "Expected training metrics of the target's "
                        "probability (`Perplexity()`, `BitsPerCharacter()` "
                        "objects) with `softmax_chunk_size` set: the logits "
                        f"are never formed. Received: metric {metric!r}"
                    )


def _log1mexp(x):
    """log(1 − eˣ) for x ≤ 0, accurate at both ends."""
    x = ops.minimum(x, 0.0)
    near_zero = ops.greater(x, -0.6931472)
    safe_near = ops.where(near_zero, x, -1.0)
    safe_far = ops.where(near_zero, -1.0, x)
    return ops.where(
        near_zero,
        ops.log(-ops.expm1(safe_near)),
        ops.log1p(-ops.exp(safe_far)),
    )


class _LogMeanExpLoss(keras.losses.Loss):
    """IWAEDropoutLoss from target log-probabilities instead of logits.

    `y_pred` is `log p_d(w_t)`, `(batch, samples, time)` or `(batch, time)`;
    the loss of a token is `−(logsumexp_d y_pred − ln D)`.
    """

    def call(self, y_true, y_pred):
        if len(y_pred.shape) == len(y_true.shape) + 1:
            samples = ops.cast(ops.shape(y_pred)[1], y_pred.dtype)
            y_pred = ops.logsumexp(y_pred, axis=1) - ops.log(samples)
        return ops.negative(y_pred)
