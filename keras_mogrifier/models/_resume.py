"""`LanguageModel.fit` resuming from a `TrainingCheckpoint`, at any step.

Keras's `fit` starts epochs only at their first step. A checkpoint taken
within epoch `e`, after `s` of its `K` steps, is resumed in two calls of
Keras's `fit` that callbacks see as one: the rest of epoch `e` (`K − s`
steps, its batches numbered from `s`, its metrics continuing from the saved
accumulators), then epochs `e + 1, …`. `on_train_begin` is called once, at
the start (and the callbacks then get their saved state), and
`on_train_end` once, at the end.
"""

import keras

from keras_mogrifier.callbacks.training_checkpoint import restore_metrics


class ResumedCallbacks(keras.callbacks.CallbackList):
    """The callbacks of a resumed `fit`, across its one or two phases."""

    def __init__(self, callbacks, checkpoint, metrics, step_offset, **kwargs):
        super().__init__(callbacks, **kwargs)
        self.checkpoint = checkpoint
        self.metrics = metrics
        self.step_offset = step_offset
        self.began = False
        self.last_phase = True

    def on_train_begin(self, logs=None):
        if self.began:
            return
        self.began = True
        super().on_train_begin(logs)
        self.checkpoint.restore_callbacks()

    def on_train_end(self, logs=None):
        if self.last_phase:
            super().on_train_end(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if self.metrics is not None:
            # After Keras's `reset_metrics`: the epoch goes on from here.
            restore_metrics(self.model, self.metrics)
            self.metrics = None
        super().on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        self.step_offset = 0

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch + self.step_offset, logs)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch + self.step_offset, logs)


def fit_resumed(model, fit, callbacks, arguments, checkpoint, saved, data, steps):
    """Runs `fit` (Keras's) from the saved epoch and step; returns the
    `History` of the epochs trained."""
    epoch, step = saved["epoch"], saved["step"]
    metrics = checkpoint.restore(model, saved)
    if metrics is not None:
        _build_metrics(model, data, epoch * steps + step)
    verbose = arguments.get("verbose", "auto")
    verbose = 1 if verbose == "auto" else verbose
    epochs = arguments.get("epochs", 1)
    callback_list = ResumedCallbacks(
        callbacks, checkpoint, metrics, step,
        add_history=True, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps,
    )
    if step and epoch < epochs:
        # The rest of epoch `epoch`.
        callback_list.last_phase = epoch + 1 >= epochs
        fit(
            callbacks=callback_list,
            **dict(
                arguments, x=data.continued(epoch * steps + step),
                epochs=epoch + 1, initial_epoch=epoch,
                steps_per_epoch=steps - step,
            ),
        )
        epoch += 1
        if model.stop_training or epoch >= epochs:
            if not callback_list.last_phase:
                callback_list.last_phase = True
                callback_list.on_train_end()
            return model.history
    callback_list.last_phase = True
    callback_list.step_offset = 0
    fit(
        callbacks=callback_list,
        **dict(arguments, x=data.continued(epoch * steps), initial_epoch=epoch),
    )
    return model.history


def _build_metrics(model, data, window):
    """Builds the compiled metrics (TensorFlow builds them only when it
    traces the first step) so that a resumed epoch's can be restored."""
    compiled = getattr(model, "_compile_metrics", None)
    if compiled is None or compiled.built:
        return
    x, y = data.continued_window(window)
    model._symbolic_build(data_batch=(x, y))
