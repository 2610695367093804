"""What `LanguageModel`'s entry points restore when they fail.

`fit`: until its first step has completed, a failure (an error, an
interrupt, a non-finite first loss) puts back every weight and optimizer
variable it had before (device copies taken at the start, released after
that step); afterwards the model holds the state of the last step that
completed. A step with a non-finite loss is not applied (see
`LanguageModel.fit`). Every entry point also makes sure the variables hold
values after a failure (JAX's trainers take them out while they run).
"""

import contextlib
import math

import keras
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.models.non_finite_loss_error import NonFiniteLossError


class _Snapshot:
    """Device copies of the model's weights and its optimizer's variables."""

    def __init__(self, model):
        self.variables = list(model.weights)
        optimizer = getattr(model, "optimizer", None)
        if isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
            self.variables += list(optimizer.variables)
        # Copies: a variable's buffer may be updated in place (or donated).
        self.values = [ops.copy(v) for v in self.variables]

    @property
    def held(self):
        return self.values is not None

    def release(self):
        self.values = None

    def restore(self):
        if self.values is not None:
            for variable, value in zip(self.variables, self.values):
                variable.assign(value)
            self.values = None


class _StepWatch(keras.callbacks.Callback):
    """Raises `NonFiniteLossError` after a non-finite step; counts good steps.

    It reads the logged loss after every step, as `DivergenceRecovery`
    does. The model is read as `self._model`: on JAX `self.model` would
    write the training state back into the variables at every step.
    """

    def __init__(self, snapshot, stop):
        super().__init__()
        self.snapshot = snapshot
        self.stop = stop
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.stop:
            loss = (logs or {}).get("loss")
            if loss is not None and not math.isfinite(float(loss)):
                first = self.snapshot.held
                kept = (
                    "the model is as it was before `fit`"
                    if first
                    else "the model holds the weights, optimizer state and "
                    "recurrent state of the last finite step"
                )
                raise NonFiniteLossError(
                    f"Training stopped at batch {batch} of epoch {self.epoch}: "
                    f"its loss is {float(loss)}. That step's update was not "
                    f"applied; {kept}. Lower the learning rate or clip the "
                    "gradients (`global_clipnorm`), or pass "
                    "`DivergenceRecovery()` among the callbacks to restart "
                    "from a checkpoint; `fit(..., stop_on_non_finite=False)` "
                    "trains on regardless, as Keras does.",
                    epoch=self.epoch, batch=batch, loss=float(loss),
                )
        self.snapshot.release()


def _raise_kept(error, checks):
    """Raises the `ValueError` a batch check kept if `error` reports it."""
    for check in checks:
        kept = check.reported(error) if check is not None else None
        if kept is not None:
            raise kept from None


def _has_recovery(callbacks):
    from keras_mogrifier.callbacks import DivergenceRecovery

    return any(isinstance(c, DivergenceRecovery) for c in callbacks)


@contextlib.contextmanager
def guarded_fit(model, callbacks, stop_on_non_finite, checks):
    """Runs a `fit` (the body) with the guarantees above.

    Yields the callbacks to pass to Keras's `fit`. With
    `stop_on_non_finite`, a step whose loss or gradients are not finite is
    not applied (the model's `compute_loss` makes every gradient non-finite
    when the loss is, and undoes the step's change of the carried state;
    the optimizer skips the update), and unless a `DivergenceRecovery`
    handles it, `NonFiniteLossError` stops training.
    """
    backend = get_backend_module()
    snapshot = _Snapshot(model)
    stop = stop_on_non_finite and not _has_recovery(callbacks)
    watch = _StepWatch(snapshot, stop)
    optimizer = getattr(model, "optimizer", None)
    skip = (
        stop_on_non_finite
        and isinstance(optimizer, keras.optimizers.Optimizer)
        # A LossScaleOptimizer skips non-finite steps by itself.
        and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    )
    # The guard is traced into the train function: retrace when it changes.
    if (
        getattr(model, "_guarded_train_function", None)
        != (stop_on_non_finite, id(model.train_function))
    ):
        model.train_function = None
    model._non_finite_guard = stop_on_non_finite
    try:
        with contextlib.ExitStack() as stack:
            if skip:
                stack.enter_context(backend.skip_non_finite_updates(optimizer))
            stack.enter_context(backend.keep_values_on_error(model))
            stack.enter_context(_validation.ids_checked())
            yield [watch] + list(callbacks)
    except BaseException as error:
        snapshot.restore()
        _raise_kept(error, checks)
        raise
    finally:
        model._non_finite_guard = False
        model._guarded_train_function = (
            stop_on_non_finite, id(model.train_function)
        )
        snapshot.release()


@contextlib.contextmanager
def guarded_call(model, checks, carried_state=()):
    """Runs an `evaluate` or `predict` (the body): on a failure the carried
    state is put back and a batch check's error is raised as itself."""
    saved = [ops.copy(v) for v in carried_state]
    try:
        with get_backend_module().keep_values_on_error(model):
            with _validation.ids_checked():
                yield
    except BaseException as error:
        for variable, value in zip(carried_state, saved):
            variable.assign(value)
        _raise_kept(error, checks)
        raise
