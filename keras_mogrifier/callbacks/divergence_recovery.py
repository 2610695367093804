import logging
import math
import os

import keras
import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module

logger = logging.getLogger(__name__)


def _snapshot(variables):
    # Copies: a NumPy view of a variable's buffer could change with it.
    return [np.array(keras.ops.convert_to_numpy(v), copy=True) for v in variables]


def _floating(arrays):
    return [a for a in arrays if np.issubdtype(np.asarray(a).dtype, np.inexact)]


def _all_finite(arrays):
    return all(np.all(np.isfinite(a)) for a in _floating(arrays))


def _fully_built(model):
    # `model.trainable_variables` is complete only then: an optimizer built
    # earlier would lack the weights created later ("Unknown variable").
    return model.built and all(layer.built for layer in model._flatten_layers())


def _no_nan(arrays):
    # Optimizer state may hold infinities on purpose (e.g. "no best loss
    # yet" in TwoTailedAveragingOptimizer.controller_state).
    return not any(np.any(np.isnan(a)) for a in _floating(arrays))


class DivergenceRecovery(keras.callbacks.Callback):
    """Restores the best checkpoint, with a lower learning rate, when training diverges.

    Training diverges when the training loss logged after a batch is not
    finite, or (with `factor`) exceeds `factor ×` the lowest epoch training
    loss so far (so from the second epoch on), or when the weights or the
    monitored value are not finite at the end of an epoch. Then this
    callback

    1. restores the model's weights **and every optimizer variable** (the
       moments, the step counter, the learning rate, a
       `LossScaleOptimizer`'s scale, the averages of a
       `TwoTailedAveragingOptimizer`) from its checkpoint,
    2. multiplies the learning rate by `learning_rate_decay` once per
       recovery so far: the rate becomes `learning_rate_decay**k ×` the
       rate training would have had without any recovery, `k` being the
       number of recoveries so far (Circling Back §5: "multiply the
       learning rate by 0.9" at each divergence). The learning rate is part
       of the restored state, so it is set after the restore, from the
       checkpoint's rate and the cuts it already contains: a checkpoint
       saved after `k₀` recoveries holds a rate already cut `k₀` times and
       gets `learning_rate_decay**(k − k₀)`. So with the default `0.9` a
       rate of 1.0 goes 0.9, 0.81, 0.729, … whether the recoveries restore
       the same checkpoint or a newer one saved in between (never 0.9,
       then 0.9³ = 0.729 from a checkpoint saved at 0.9),
    3. resets the model's metrics (the logged `loss` is a running mean over
       the epoch, which a non-finite batch would poison) and continues.

    The checkpoint is the state with the best `monitor` value at an epoch end
    (e.g. `val_loss`), or, with `monitor=None` or when the monitored value is
    not in the epoch logs (no validation data), the last state at an epoch
    end (and, with `save_freq=n`, every `n` batches) whose loss and weights
    are finite. Before the first checkpoint, the state at the start of
    training is used; for a model that Keras builds in the first step (on
    TensorFlow, e.g. a `Sequential` without `keras.Input`), the state after
    that step: the weights do not exist before it. (`LanguageModel.fit`
    builds its model before any callback runs, unless it is stateful with
    no `batch_size` and reads a dataset or a generator.) A checkpoint is
    kept in memory, or in an `.npz` file at `filepath`. A state with
    non-finite weights is never checkpointed, so a recovery never leaves
    non-finite weights.

    After `max_consecutive_recoveries` recoveries in a row (with no new
    checkpoint and no epoch completed without a recovery in between), the
    next divergence restores the checkpoint and raises a `RuntimeError`.
    Each recovery is logged (`logging`, and printed with `verbose=1`) and
    recorded in `recoveries_log`.

    Notes: with `steps_per_execution=k`, Keras reports logs every `k`
    batches, so divergence is seen up to `k` steps late (the restored state
    is the same). The learning rate must be a float (a variable): a
    `LearningRateSchedule` or a callable cannot be lowered, and
    `on_train_begin` raises a `ValueError` for them. Callbacks that set the
    learning rate every epoch (`LearningRateScheduler`) override the lowered
    value. Use this instead of `keras.callbacks.TerminateOnNaN`.

    Args:
        monitor: str or None. Epoch-log entry defining the best checkpoint.
            `None` keeps the last finite state. Defaults to `"val_loss"`.
        mode: str. `"min"` or `"max"`: whether lower or higher `monitor`
            values are better. Defaults to `"min"`.
        factor: float > 1 or None. Also treat a logged training loss above
            `factor ×` the lowest epoch training loss so far as a divergence
            (Keras logs the epoch's running mean after each batch). Defaults
            to `None`.
        max_consecutive_recoveries: int. Recoveries allowed in a row before
            giving up. Defaults to `5`.
        learning_rate_decay: float in (0, 1]. The `0.9` of `0.9**k`.
            Defaults to `0.9`.
        save_freq: int or None. In last-finite-state mode, also checkpoint
            every `save_freq` batches. Defaults to `None` (epoch ends only).
        filepath: str or None. Keep the checkpoint in this `.npz` file
            instead of in memory. Defaults to `None`.
        verbose: int. 1 prints each recovery. Defaults to `1`.

    Example:

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    >>> y = x.sum(axis=1, keepdims=True)
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    >>> recovery = DivergenceRecovery(monitor="val_loss")
    >>> history = model.fit(x, y, validation_split=0.25, epochs=2,
    ...                     callbacks=[recovery], verbose=0)
    >>> recovery.recoveries
    0

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2211.01848), Circling Back to
          Recurrent Models of Language, §5 (restarting from the best
          checkpoint with a lower learning rate).
    """

    def __init__(
        self,
        monitor="val_loss",
        mode="min",
        factor=None,
        max_consecutive_recoveries=5,
        learning_rate_decay=0.9,
        save_freq=None,
        filepath=None,
        verbose=1,
    ):
        if monitor is not None and not isinstance(monitor, str):
            raise ValueError(
                "Expected `monitor` to be a string or None. "
                f"Received: monitor={monitor!r}"
            )
        mode = _validation.one_of("mode", mode, {"min", "max"})
        if factor is not None:
            factor = _validation.positive_float("factor", factor)
            if factor <= 1.0:
                raise ValueError(
                    "Expected `factor` to be larger than 1. "
                    f"Received: factor={factor}"
                )
        max_consecutive_recoveries = _validation.positive_int(
            "max_consecutive_recoveries", max_consecutive_recoveries
        )
        learning_rate_decay = _validation.positive_float(
            "learning_rate_decay", learning_rate_decay
        )
        if learning_rate_decay > 1.0:
            raise ValueError(
                "Expected `learning_rate_decay` to be in (0, 1]. "
                f"Received: learning_rate_decay={learning_rate_decay}"
            )
        save_freq = _validation.optional_positive_int("save_freq", save_freq)
        if filepath is not None:
            filepath = os.fspath(filepath)
            if not filepath.endswith(".npz"):
                raise ValueError(
                    "Expected `filepath` to end in `.npz`. "
                    f"Received: filepath={filepath!r}"
                )
        verbose = _validation.non_negative_int("verbose", verbose)
        super().__init__()
        self.monitor = monitor
        self.mode = mode
        self.factor = factor
        self.max_consecutive_recoveries = max_consecutive_recoveries
        self.learning_rate_decay = learning_rate_decay
        self.save_freq = save_freq
        self.filepath = filepath
        self.verbose = verbose
        self._reset()

    def _reset(self):
        self.recoveries = 0
        self.consecutive_recoveries = 0
        self.recoveries_log = []
        self.best = None
        self.lowest_loss = math.inf
        self._checkpoint = None
        self._checkpoint_info = None
        self._epoch = 0
        self._recovered_this_epoch = False
        self._warned_missing_monitor = False
        self._pending_start = False

    # === Checkpoints ===

    def _optimizer_variables(self):
        return self.model.optimizer.variables

    def _save(self, info):
        get_backend_module().sync_training_state(self.model)
        weights = _snapshot(self.model.weights)
        optimizer_values = _snapshot(self._optimizer_variables())
        if not _all_finite(weights) or not _no_nan(optimizer_values):
            return False
        # The cuts already in this rate: a later recovery from this
        # checkpoint applies only the ones made since (see `_recover`).
        info = dict(
            info, learning_rate=self._learning_rate(), recoveries=self.recoveries
        )
        if self.filepath is None:
            self._checkpoint = (weights, optimizer_values)
        else:
            arrays = {f"model_{i}": w for i, w in enumerate(weights)}
            arrays.update(
                {f"optimizer_{i}": v for i, v in enumerate(optimizer_values)}
            )
            temporary = self.filepath[: -len(".npz")] + ".partial.npz"
            np.savez(temporary, **arrays)
            os.replace(temporary, self.filepath)
            self._checkpoint = (len(weights), len(optimizer_values))
        self._checkpoint_info = info
        self.consecutive_recoveries = 0
        return True

    def _load(self):
        if self.filepath is None:
            weights, optimizer_values = self._checkpoint
        else:
            n_weights, n_optimizer = self._checkpoint
            with np.load(self.filepath) as data:
                weights = [data[f"model_{i}"] for i in range(n_weights)]
                optimizer_values = [
                    data[f"optimizer_{i}"] for i in range(n_optimizer)
                ]
        for variable, value in zip(self.model.weights, weights):
            variable.assign(value)
        for variable, value in zip(self._optimizer_variables(), optimizer_values):
            variable.assign(value)

    def _learning_rate(self):
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    # === Recovery ===

    def _recover(self, reason):
        get_backend_module().sync_training_state(self.model)
        self._load()
        info = self._checkpoint_info
        if self.consecutive_recoveries >= self.max_consecutive_recoveries:
            message = (
                f"DivergenceRecovery: training diverged ({reason}) after "
                f"{self.consecutive_recoveries} recoveries in a row; giving "
                "up. The model and optimizer hold the checkpoint from "
                f"epoch {info['epoch']}, step {info['step']}."
            )
            logger.error(message)
            raise RuntimeError(message)
        self.recoveries += 1
        self.consecutive_recoveries += 1
        # 0.9ᵏ × the uncut rate: the checkpoint's rate already holds the
        # cuts of the recoveries made before it was saved.
        learning_rate = self.learning_rate_decay ** (
            self.recoveries - info["recoveries"]
        ) * info["learning_rate"]
        self.model.optimizer.learning_rate = learning_rate
        self.model.reset_metrics()
        self._recovered_this_epoch = True
        record = {
            "epoch": self._epoch,
            "reason": reason,
            "checkpoint_epoch": info["epoch"],
            "checkpoint_step": info["step"],
            "learning_rate": learning_rate,
        }
        self.recoveries_log.append(record)
        message = (
            f"DivergenceRecovery: {reason} in epoch {self._epoch}; restored "
            f"the checkpoint from epoch {info['epoch']}, step {info['step']} "
            f"(recovery {self.recoveries}, {self.consecutive_recoveries} in "
            f"a row); learning rate {info['learning_rate']:.4g} -> "
            f"{learning_rate:.4g}."
        )
        logger.warning(message)
        if self.verbose:
            print(message)

    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _best_mode(self, logs):
        """Whether the epoch logs can define a best checkpoint."""
        if self.monitor is None:
            return False
        if self.monitor in (logs or {}):
            return True
        if not self._warned_missing_monitor:
            self._warned_missing_monitor = True
            message = (
                f"DivergenceRecovery: `{self.monitor}` is not in the epoch "
                f"logs ({sorted(logs or {})}); keeping the last finite state "
                "instead of the best one."
            )
            logger.warning(message)
            if self.verbose:
                print(message)
        return False

    # === Resuming (TrainingCheckpoint) ===

    def get_resume_state(self):
        """What a `TrainingCheckpoint` saves of this callback: its counters,
        the best value, and its own checkpoint (the arrays, when it keeps
        them in memory; with `filepath` they stay in that file)."""
        state = {
            "recoveries": self.recoveries,
            "consecutive_recoveries": self.consecutive_recoveries,
            "recoveries_log": self.recoveries_log,
            "best": self.best,
            "lowest_loss": self.lowest_loss,
            "checkpoint_info": self._checkpoint_info,
            "warned_missing_monitor": self._warned_missing_monitor,
            "checkpoint": None,
        }
        arrays = []
        if self._checkpoint is not None:
            if self.filepath is None:
                weights, optimizer_values = self._checkpoint
                state["checkpoint"] = [len(weights), len(optimizer_values)]
                arrays = list(weights) + list(optimizer_values)
            else:
                state["checkpoint"] = list(self._checkpoint)
        return state, arrays

    def set_resume_state(self, state, arrays):
        self.recoveries = state["recoveries"]
        self.consecutive_recoveries = state["consecutive_recoveries"]
        self.recoveries_log = list(state["recoveries_log"])
        self.best = state["best"]
        self.lowest_loss = state["lowest_loss"]
        self._checkpoint_info = state["checkpoint_info"]
        self._warned_missing_monitor = state["warned_missing_monitor"]
        self._pending_start = False
        counts = state["checkpoint"]
        if counts is None:
            self._checkpoint = None
        elif self.filepath is None:
            self._checkpoint = (list(arrays[: counts[0]]), list(arrays[counts[0]:]))
        else:
            self._checkpoint = tuple(counts)

    # === Callback hooks ===

    def on_train_begin(self, logs=None):
        self._reset()
        optimizer = self.model.optimizer
        if not isinstance(optimizer.learning_rate, keras.Variable):
            raise ValueError(
                "DivergenceRecovery lowers the learning rate after a "
                "recovery, which needs the optimizer's learning rate to be a "
                "float (a variable), not a LearningRateSchedule or a "
                "callable. Received: learning_rate="
                f"{optimizer.learning_rate!r}"
            )
        if _fully_built(self.model):
            self._save_start()
        else:
            # Keras's TensorFlow trainer builds a model (and its optimizer)
            # when it traces the first step: checkpoint after that step.
            self._pending_start = True

    def _save_start(self):
        self._pending_start = False
        optimizer = self.model.optimizer
        if not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        if not self._save({"epoch": 0, "step": self._step(), "monitor": None}):
            raise ValueError(
                "The model's weights or optimizer state are not finite at the "
                "start of training; DivergenceRecovery has nothing to recover "
                "to."
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._recovered_this_epoch = False

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if self._pending_start:
            if loss is not None and not math.isfinite(float(loss)):
                raise RuntimeError(
                    f"DivergenceRecovery: the first training step's loss is "
                    f"{float(loss)}, and there is no checkpoint to recover "
                    "to: the model was built by that step (build it before "
                    "`fit`, e.g. with `keras.Input` or `model.build`, to "
                    "checkpoint the state before it)."
                )
            if _fully_built(self.model):
                self._save_start()
        if loss is None:
            return
        loss = float(loss)
        if not math.isfinite(loss):
            self._recover(f"non-finite loss {loss}")
            return
        if self.factor is not None and loss > self.factor * self.lowest_loss:
            self._recover(
                f"loss {loss:.4g} above {self.factor} x the lowest epoch "
                f"loss {self.lowest_loss:.4g}"
            )
            return
        if (
            self.save_freq is not None
            and not self._best_mode_known()
            and (batch + 1) % self.save_freq == 0
        ):
            self._save({"epoch": self._epoch, "step": self._step(), "monitor": None})

    def _best_mode_known(self):
        # Batch checkpoints only in last-finite-state mode, which is known
        # for sure once an epoch end has shown the monitor to be missing.
        return self.monitor is not None and not self._warned_missing_monitor

    def on_epoch_end(self, epoch, logs=None):
        if self._pending_start and _fully_built(self.model):
            self._save_start()
        if self._checkpoint is None:
            return  # no step has run yet: nothing to check or recover to
        logs = logs or {}
        values = [logs.get("loss")]
        best_mode = self._best_mode(logs)
        if best_mode:
            values.append(logs[self.monitor])
        if any(v is not None and not math.isfinite(float(v)) for v in values):
            self._recover(f"non-finite epoch logs {values}")
            return
        info = {"epoch": epoch + 1, "step": self._step()}
        if best_mode:
            value = float(logs[self.monitor])
            better = (
                self.best is None
                or (self.mode == "min" and value < self.best)
                or (self.mode == "max" and value > self.best)
            )
            if better:
                if self._save(dict(info, monitor=value)):
                    self.best = value
                else:
                    self._recover("non-finite weights at the end of the epoch")
                    return
        elif not self._save(dict(info, monitor=None)):
            self._recover("non-finite weights at the end of the epoch")
            return
        if not self._recovered_this_epoch:
            self.consecutive_recoveries = 0
            # Epoch means are steadier references than the first batches'.
            if logs.get("loss") is not None:
                self.lowest_loss = min(self.lowest_loss, float(logs["loss"]))

    def on_train_end(self, logs=None):
        if self._checkpoint is None:
            return
        if not _all_finite(_snapshot(self.model.weights)):
            self._recover("non-finite weights at the end of training")
