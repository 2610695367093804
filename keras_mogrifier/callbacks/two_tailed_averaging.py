import json
import logging

import keras
import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.optimizers.two_tailed_averaging_optimizer import (
    TwoTailedAveragingOptimizer,
)
from keras_mogrifier.optimizers.two_tailed_controller import TwoTailedController

logger = logging.getLogger(__name__)

UNREGULARIZED_LOSS = "unregularized_loss"


def _weight_penalty(model):
    """Σ of the weight regularizers at the current weights (what `evaluate`
    adds to the compiled loss on top of the data's loss)."""
    total, seen = 0.0, set()
    for variable in model.variables:
        regularizer = getattr(variable, "regularizer", None)
        if regularizer is None or id(variable) in seen:
            continue
        seen.add(id(variable))
        total += float(keras.ops.convert_to_numpy(regularizer(variable.value)))
    return total


def _has_activity_regularizer(model):
    return any(
        getattr(layer, "activity_regularizer", None) is not None
        for layer in model._flatten_layers(include_self=True)
    )


def _find_two_tailed_optimizer(optimizer):
    """The `TwoTailedAveragingOptimizer` in a chain of wrappers, or `None`."""
    while optimizer is not None:
        if isinstance(optimizer, TwoTailedAveragingOptimizer):
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return None


class TwoTailedAveraging(keras.callbacks.Callback):
    """Two-Tailed Averaging: evaluates, switches and restarts the two averages.

    Works with a model compiled with a
    `keras_mogrifier.optimizers.TwoTailedAveragingOptimizer`, which updates
    the short and long running means of the weights (`θS`, `θL`) inside every
    compiled train step. Every `evaluation_frequency` optimizer steps (`E`),
    this callback evaluates the raw weights, `θS` and `θL` on the validation
    data and applies `keras_mogrifier.optimizers.TwoTailedController`'s rule:
    switch (`θL ← θS`, `S ← 0`) when the short average is at least as good
    or the long one stagnates, restart the short one when it stagnates, and
    (Algorithm 2 of the paper) use the raw weights whenever they are at
    least as good as the long average, restarting both averages when that
    average holds only the last `E` iterates. Each evaluation is logged (`logging` and, with `verbose=1`,
    printed) with the losses, the decision, the weights in use and the
    lengths `S` and `L`; `evaluations` keeps the records (dicts).

    Which weights are used:

    - Validation inside `fit` (`validation_data=` of `fit`) sees the weights
      in use, `θL` (or the raw weights when the last evaluation chose them);
      training continues from the raw weights afterwards.
    - At the end of `fit` the model holds the weights in use: `θL`, or the
      raw weights when the last evaluation chose them (also when no
      evaluation has happened yet). So `evaluate`, `predict` and `save` use the average.
      The raw weights are kept in `raw_weights`; `restore_raw_weights()`
      puts them back (do that before saving a model to resume training
      from). A later `fit` with the same callback restores them by itself.

    The averages, their lengths and the controller state live in the
    optimizer's variables, so a checkpoint with the optimizer (`model.save`,
    `ModelCheckpoint(save_weights_only=False)`) resumes exactly. Each
    evaluation costs three passes over the validation data (two when `S = 0`).
    With `steps_per_execution=k`, evaluations happen at the first batch end
    after each multiple of `E`. Tested on the TensorFlow backend.

    Args:
        validation_data: tuple `(x, y)` or `(x, y, sample_weight)`, or a
            dataset, as `model.evaluate` takes it. Needed unless `evaluate_fn`
            is given.
        evaluation_frequency: int. `E`, in optimizer steps. Defaults to
            `1000`, as in the paper.
        patience: int or None. Evaluations without improvement before a
            stagnating average is switched out or restarted; `None` for the
            paper's basic rule. Defaults to `3`.
        prefer_raw_early: bool. Use the raw weights at any evaluation where
            they are at least as good as the long average, and restart both
            averages when that average holds only the last `E` iterates
            (Algorithm 2 of the paper; see `TwoTailedController`). Defaults
            to `True`.
        monitor: str. Which entry of `model.evaluate(..., return_dict=True)`
            is the loss to minimise, or `"unregularized_loss"`: Keras's
            `"loss"` less the weight penalties that `evaluate` adds to the
            compiled loss (the L2 term), i.e. the validation loss itself.
            Circling Back's averaging compares the averages by validation
            quality, not by a penalty that shrinks as they average (an
            average of weights has a smaller L2 norm than its iterates, which
            would favour it for no better prediction). A model with activity
            regularizers needs an explicit `monitor` (their penalty depends
            on the data). Defaults to `"unregularized_loss"`.
        validation_steps: int or None. Passed to `model.evaluate` as `steps`.
        batch_size: int or None. Passed to `model.evaluate`.
        evaluate_fn: callable or None. `evaluate_fn(model) -> float`, a loss
            to minimise, used instead of `model.evaluate` (e.g. for a
            language model that carries recurrent state). Defaults to `None`.
        verbose: int. 1 prints one line per evaluation. Defaults to `1`.

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.optimizers import (
    ...     RectifiedAdam, TwoTailedAveragingOptimizer)
    >>> x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    >>> y = x.sum(axis=1, keepdims=True)
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(
    ...     optimizer=TwoTailedAveragingOptimizer(RectifiedAdam(1e-2)),
    ...     loss="mse")
    >>> tta = TwoTailedAveraging((x, y), evaluation_frequency=4, verbose=0)
    >>> history = model.fit(x, y, batch_size=16, epochs=3, callbacks=[tta],
    ...                     verbose=0)
    >>> len(tta.evaluations)
    3

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2209.12581), Two-Tailed
          Averaging: Anytime, Adaptive, Once-in-a-While Optimal Weight
          Averaging for Better Generalization.
    """

    def __init__(
        self,
        validation_data=None,
        evaluation_frequency=1000,
        patience=3,
        prefer_raw_early=True,
        monitor="unregularized_loss",
        validation_steps=None,
        batch_size=None,
        evaluate_fn=None,
        verbose=1,
    ):
        if (validation_data is None) == (evaluate_fn is None):
            raise ValueError(
                "Expected exactly one of `validation_data` and `evaluate_fn`. "
                f"Received: validation_data={type(validation_data).__name__}, "
                f"evaluate_fn={evaluate_fn!r}"
            )
        if evaluate_fn is not None and not callable(evaluate_fn):
            raise ValueError(
                "Expected `evaluate_fn` to be callable. "
                f"Received: evaluate_fn={evaluate_fn!r}"
            )
        super().__init__()
        self.validation_data = validation_data
        self.evaluation_frequency = _validation.positive_int(
            "evaluation_frequency", evaluation_frequency
        )
        self.controller = TwoTailedController(
            patience=patience, prefer_raw_early=prefer_raw_early
        )
        if not isinstance(monitor, str):
            raise ValueError(
                "Expected `monitor` to be the name of an entry of "
                "`model.evaluate(..., return_dict=True)` or "
                f"'unregularized_loss'. Received: monitor={monitor!r}"
            )
        self.monitor = monitor
        self.validation_steps = _validation.optional_positive_int(
            "validation_steps", validation_steps
        )
        self.batch_size = _validation.optional_positive_int("batch_size", batch_size)
        self.evaluate_fn = evaluate_fn
        self.verbose = _validation.non_negative_int("verbose", verbose)
        self.evaluations = []
        self.raw_weights = None
        self._optimizer = None
        self._last_index = None
        self._in_fit = False
        self._swapped_raw = None

    # === Weight handling ===

    def _model_variables(self):
        return self._optimizer.averaged_model_variables

    def _read(self, variables):
        # Copies: a NumPy view of a variable's buffer could change with it.
        return [np.array(keras.ops.convert_to_numpy(v), copy=True) for v in variables]

    def _load_average(self, which):
        for variable, average in zip(
            self._model_variables(), self._optimizer.average_variables(which)
        ):
            if average is not None:
                # A copy: on JAX the model and the optimizer would otherwise
                # share one buffer, which the next train step donates twice.
                variable.assign(keras.ops.copy(average))

    def _load_values(self, values):
        for variable, value in zip(self._model_variables(), values):
            variable.assign(value)

    def _counts(self):
        return (
            int(keras.ops.convert_to_numpy(self._optimizer.short_count)),
            int(keras.ops.convert_to_numpy(self._optimizer.long_count)),
        )

    def _read_controller_state(self):
        # The optimizer's variable is the source of truth: a checkpoint
        # restore (e.g. by DivergenceRecovery) may have changed it.
        self.controller.set_state(
            keras.ops.convert_to_numpy(self._optimizer.controller_state)
        )

    def _use_long(self):
        self._read_controller_state()
        return self.controller.weights_in_use == "long" and self._counts()[1] > 0

    def restore_raw_weights(self):
        """Puts back the raw weights that the end of `fit` replaced."""
        if self.raw_weights is None:
            raise ValueError(
                "There are no raw weights to restore: the model already holds "
                "them (fit has not ended with an average in the model)."
            )
        self._load_values(self.raw_weights)
        self.raw_weights = None

    # === Evaluation ===

    def _loss(self):
        if self.evaluate_fn is not None:
            return float(self.evaluate_fn(self.model))
        data = self.validation_data
        if isinstance(data, tuple):
            x, y = data[0], data[1] if len(data) > 1 else None
            sample_weight = data[2] if len(data) > 2 else None
        else:
            x, y, sample_weight = data, None, None
        results = self.model.evaluate(
            x,
            y,
            sample_weight=sample_weight,
            batch_size=self.batch_size,
            steps=self.validation_steps,
            verbose=0,
            return_dict=True,
        )
        if self.monitor == UNREGULARIZED_LOSS:
            return float(results["loss"]) - _weight_penalty(self.model)
        if self.monitor not in results:
            raise ValueError(
                f"Expected `monitor` to be one of {sorted(results)} or "
                f"{UNREGULARIZED_LOSS!r}. Received: monitor={self.monitor!r}"
            )
        return float(results[self.monitor])

    def _evaluate(self, step):
        # `evaluate` resets the metrics that also hold the epoch's running
        # training logs; keep and restore them.
        metric_variables = [v for m in self.model.metrics for v in m.variables]
        metric_values = self._read(metric_variables)
        raw = self._read(self._model_variables())
        short_count, long_count = self._counts()
        raw_loss = self._loss()
        short_loss = None
        if short_count > 0:
            self._load_average("short")
            short_loss = self._loss()
        self._load_average("long")
        long_loss = self._loss()
        self._load_values(raw)
        for variable, value in zip(metric_variables, metric_values):
            variable.assign(value)

        self._read_controller_state()
        decision = self.controller.decide(
            raw_loss, short_loss, long_loss, short_count, long_count,
            self.evaluation_frequency,
        )
        if decision.action == "switch":
            self._optimizer.switch()
        elif decision.action == "restart_short":
            self._optimizer.restart_short()
        elif decision.action == "restart_both":
            self._optimizer.restart()
        self._optimizer.controller_state.assign(
            np.asarray(self.controller.get_state(), dtype="float32")
        )
        new_short, new_long = self._counts()
        record = {
            "step": step,
            "raw_loss": raw_loss,
            "short_loss": short_loss,
            "long_loss": long_loss,
            "short_length": short_count,
            "long_length": long_count,
            "action": decision.action,
            "reason": decision.reason,
            "weights_in_use": decision.weights_in_use,
            "new_short_length": new_short,
            "new_long_length": new_long,
        }
        self.evaluations.append(record)
        short_text = "-" if short_loss is None else f"{short_loss:.4f}"
        message = (
            f"TwoTailedAveraging step {step}: raw {raw_loss:.4f}, short "
            f"{short_text} (S={short_count}), long {long_loss:.4f} "
            f"(L={long_count}) -> {decision.action}"
            + (f" ({decision.reason})" if decision.reason else "")
            + f"; using {decision.weights_in_use}, now S={new_short}, "
            f"L={new_long}"
        )
        logger.info(message)
        if self.verbose:
            print(message)

    # === Resuming (TrainingCheckpoint) ===

    def get_resume_state(self):
        """What a `TrainingCheckpoint` saves of this callback: the
        evaluations so far (the averages and the controller live in the
        optimizer's variables, which the checkpoint saves)."""
        return {"evaluations": json.loads(json.dumps(self.evaluations, default=float))}, []

    def set_resume_state(self, state, arrays):
        self.evaluations = list(state.get("evaluations", []))
        self._last_index = None  # read again from the restored step count

    # === Callback hooks ===

    def on_train_begin(self, logs=None):
        self._optimizer = _find_two_tailed_optimizer(self.model.optimizer)
        if self._optimizer is None:
            raise ValueError(
                "TwoTailedAveraging needs the model compiled with a "
                "keras_mogrifier.optimizers.TwoTailedAveragingOptimizer, e.g. "
                "optimizer=TwoTailedAveragingOptimizer(RectifiedAdam()). "
                f"Received: optimizer={self.model.optimizer!r}"
            )
        if (
            self.monitor == UNREGULARIZED_LOSS
            and self.evaluate_fn is None
            and _has_activity_regularizer(self.model)
        ):
            raise ValueError(
                "Expected an explicit `monitor` (a metric of "
                "`model.evaluate`) for a model with activity regularizers: "
                "their penalty depends on the data, so it cannot be taken "
                "out of the loss. Received: monitor='unregularized_loss'"
            )
        if self.raw_weights is not None:
            # A previous fit left the average in the model.
            self.restore_raw_weights()
        self._in_fit = True
        self._last_index = None

    def _sync(self):
        """Reads the step count once the optimizer is built."""
        # On JAX, `fit` holds the training state outside the variables.
        get_backend_module().sync_training_state(self.model)
        if self._last_index is None and self._optimizer.built:
            step = int(keras.ops.convert_to_numpy(self._optimizer.iterations))
            self._last_index = step // self.evaluation_frequency
        return self._last_index is not None

    def on_train_batch_begin(self, batch, logs=None):
        self._sync()

    def on_train_batch_end(self, batch, logs=None):
        get_backend_module().sync_training_state(self.model)
        if not self._sync():
            return
        step = int(keras.ops.convert_to_numpy(self._optimizer.iterations))
        index = step // self.evaluation_frequency
        if index > self._last_index:
            self._last_index = index
            self._evaluate(step)
        elif index < self._last_index:
            # The step counter went back (a checkpoint was restored).
            self._last_index = index

    def on_test_begin(self, logs=None):
        if self._in_fit and self._optimizer.built and self._use_long():
            self._swapped_raw = self._read(self._model_variables())
            self._load_average("long")

    def on_test_end(self, logs=None):
        if self._swapped_raw is not None:
            self._load_values(self._swapped_raw)
            self._swapped_raw = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._optimizer.built:
            short_count, long_count = self._counts()
            logs["tta_short_length"] = short_count
            logs["tta_long_length"] = long_count

    def on_train_end(self, logs=None):
        self._in_fit = False
        if self._optimizer.built and self._use_long():
            self.raw_weights = self._read(self._model_variables())
            self._load_average("long")
            message = (
                "TwoTailedAveraging: the model now holds the long average "
                f"(L={self._counts()[1]}); restore_raw_weights() undoes this."
            )
        else:
            message = "TwoTailedAveraging: the model keeps the raw weights."
        logger.info(message)
        if self.verbose:
            print(message)
