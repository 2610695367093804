"""`fit`, `evaluate`, `predict` and `__call__` of `LanguageModel`: what they
are given is checked before anything changes."""

import keras
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.callbacks.training_checkpoint import TrainingCheckpoint
from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.models import _resume
from keras_mogrifier.models import _input_checks
from keras_mogrifier.models import _safe_calls


class EntryPointsMixin:
    """The training and evaluation entry points of `LanguageModel`."""

    def fit(
        self, x=None, y=None, *args, callbacks=None, stop_on_non_finite=True,
        reset_state_each_epoch=None, **kwargs,
    ):
        """Trains the model: `keras.Model.fit`, with what it is given checked.

        Everything given is checked before anything changes (token ids,
        shapes, sample weights, batch sizes against the carried state, and
        `shuffle`, which a stateful model refuses); data that comes batch by
        batch is checked on the host as each batch is fetched, before its
        update.

        **Across epochs.** A stateful model given a `StreamDataset` (with
        `drop_remainder=True`) trains the way the Mogrifier authors do:
        there is no epoch boundary in the data or in the state. Every stream
        goes on reading its text where the previous epoch left it
        (`StreamDataset.continued()`, wrapping around the text with a
        seeded, jittered start) and the carried recurrent state goes with it
        (still dropped per row with `drop_state_probability`). An epoch is
        `len(dataset)` windows (or `steps_per_epoch`), and with
        `initial_epoch=e` training reads the windows the uninterrupted run
        would have read in epoch `e`. Validation starts from zero state and
        leaves the training state as it found it. Any other data (arrays,
        other datasets) restarts every epoch, so the state is zeroed at each
        epoch's start. `reset_state_each_epoch=True` gives a `StreamDataset`
        that old behaviour too (each epoch restarts the streams from their
        starts, from zero state): use it to reproduce results trained that
        way (before version 0.2); `False` carries the state across epochs
        whatever the data.

        A step whose loss (or a gradient) is NaN or infinite is not applied
        and does not move the carried state; with `stop_on_non_finite=True`
        (the default) training then stops with a `NonFiniteLossError`,
        leaving the model at its last finite step, unless a
        `DivergenceRecovery` among the callbacks restarts it from a
        checkpoint. With `stop_on_non_finite=False` nothing of this is done
        (Keras's behaviour: the weights become non-finite). If `fit` fails
        before its first step has completed (an error, an interrupt), every
        weight and optimizer variable is put back as it was. See
        docs/guarantees.md.

        Args:
            x, y, *args, callbacks, **kwargs: as `keras.Model.fit`.
            stop_on_non_finite: bool. See above. Defaults to `True`.
            reset_state_each_epoch: bool or None. Zero the carried state and
                restart the streams at each epoch's start (`True`), carry
                both across epochs (`False`), or (`None`, the default) carry
                them when the data is a `StreamDataset`, which continues
                across epochs, and reset them for other data. Ignored for a
                model without carried state.
        """
        if not isinstance(stop_on_non_finite, bool):
            raise ValueError(
                "Expected `stop_on_non_finite` to be a bool. Received: "
                f"stop_on_non_finite={stop_on_non_finite!r}"
            )
        if reset_state_each_epoch is not None and not isinstance(
            reset_state_each_epoch, bool
        ):
            raise ValueError(
                "Expected `reset_state_each_epoch` to be a bool or None. "
                f"Received: reset_state_each_epoch={reset_state_each_epoch!r}"
            )
        arguments = _input_checks.bind(keras.Model.fit, x, y, *args, **kwargs)
        callbacks = list(arguments.pop("callbacks", None) or callbacks or [])
        if self.stateful and arguments.get("shuffle", False):
            raise ValueError(
                "Expected `shuffle=False` for a stateful LanguageModel: it "
                "carries the recurrent state from one batch to the next, so "
                "the windows of each stream must arrive in order (truncated "
                "backpropagation through time); shuffled, each window would "
                "start from another window's state. Use stateful=False to "
                f"train on shuffled independent sequences. Received: "
                f"shuffle={arguments['shuffle']!r}"
            )
        batch_size = arguments.get("batch_size")
        arguments["x"], check = _input_checks.prepare(
            self, arguments.get("x"), arguments.get("y"),
            arguments.get("sample_weight"), batch_size, training=True,
            targets=True, role="training data",
        )
        validation, validation_check = _input_checks.prepare_validation_data(
            self, arguments.get("validation_data"),
            arguments.get("validation_batch_size") or batch_size,
        )
        if validation is not None:
            arguments["validation_data"] = validation
        data = arguments.get("x")
        self._build_before_fit(data, batch_size)
        continued = False
        if self.stateful:
            continued = (
                isinstance(data, StreamDataset)
                and data.drop_remainder
                and reset_state_each_epoch is not True
            )
            if reset_state_each_epoch is None:
                reset_state_each_epoch = not continued
            if reset_state_each_epoch:
                callbacks.insert(0, _ResetStatesEachEpoch())
            # Windows must arrive in order for the state to be carried.
            arguments.setdefault("shuffle", False)
        steps = None
        if continued:
            steps = arguments.get("steps_per_epoch") or data.steps_per_epoch
            steps = _validation.positive_int("steps_per_epoch", steps)
            arguments["steps_per_epoch"] = steps
        checkpoints = [c for c in callbacks if isinstance(c, TrainingCheckpoint)]
        if len(checkpoints) > 1:
            raise ValueError(
                "Expected at most one TrainingCheckpoint among the callbacks. "
                f"Received: {len(checkpoints)}"
            )
        checkpoint = checkpoints[0] if checkpoints else None
        saved = None
        if checkpoint is not None:
            checkpoint.bind(self, data, steps, callbacks)
            if checkpoint.resume:
                saved = self._checkpoint_to_resume(checkpoint, continued)
        if continued and saved is None:
            initial_epoch = _validation.non_negative_int(
                "initial_epoch", arguments.get("initial_epoch", 0)
            )
            arguments["x"] = data.continued(initial_epoch * steps)
        with _safe_calls.guarded_fit(
            self, callbacks, stop_on_non_finite, [check, validation_check]
        ) as callbacks:
            if saved is not None:
                return _resume.fit_resumed(
                    self, super().fit, callbacks, arguments, checkpoint, saved,
                    data, steps,
                )
            return super().fit(callbacks=callbacks, **arguments)

    def _checkpoint_to_resume(self, checkpoint, continued):
        """The saved progress of `checkpoint`, checked against this run
        (`None` when there is none: the run starts from the beginning)."""
        saved = checkpoint.read()
        if saved is None:
            return None
        if saved.get("format") != 2:
            raise ValueError(
                f"Expected a checkpoint written by TrainingCheckpoint in "
                f"{checkpoint.directory!r}. Received: one in an older format "
                "(last.keras and progress.json only), which resumes at an "
                "epoch's start only: load it with "
                "keras_mogrifier.pipeline.language_modeling.load_checkpoint"
            )
        if not continued:
            raise ValueError(
                "Expected a StreamDataset as training data (with "
                "drop_remainder=True and the state carried across epochs) to "
                "resume from a TrainingCheckpoint: its windows are a function "
                "of the epoch and step, so the run can go on where it "
                "stopped. Received: other data, or reset_state_each_epoch=True"
            )
        checkpoint.check(saved)
        return saved

    def _build_before_fit(self, x, batch_size):
        """Builds the model from its first batch before `fit` calls any callback.

        Keras's TensorFlow trainer builds a model only when it traces the
        first step, after `on_train_begin`; JAX's and PyTorch's build it
        before. Built here, every callback (`DivergenceRecovery`'s first
        checkpoint, an optimizer it builds) sees all the weights on every
        backend, and `fit`'s own snapshot covers them too.
        """
        if self.built:
            return
        rows = self.batch_size
        if rows is None and self.stateful:
            rows = _input_checks.first_batch_rows(x, batch_size)
            if rows is None:
                return  # the trainer builds it from the batches it reads
        self.build((rows, None))

    def evaluate(self, x=None, y=None, *args, **kwargs):
        arguments = _input_checks.bind(keras.Model.evaluate, x, y, *args, **kwargs)
        check = None
        if not arguments.get("_use_cached_eval_dataset", False):
            # (Inside `fit`, the validation data was checked by `fit`.)
            arguments["x"], check = _input_checks.prepare(
                self, arguments.get("x"), arguments.get("y"),
                arguments.get("sample_weight"), arguments.get("batch_size"),
                training=False, targets=True, role="data",
            )
        # Evaluation starts from zero state and leaves the carried training
        # state as it found it, so evaluating mid-epoch (e.g. Two-Tailed
        # Averaging every E steps) does not disturb truncated BPTT.
        carried = list(getattr(self, "recurrent_state_variables", []))
        saved = [ops.copy(v) for v in carried]
        self.reset_states()
        try:
            with _safe_calls.guarded_call(self, [check]):
                return super().evaluate(**arguments)
        finally:
            for variable, value in zip(carried, saved):
                variable.assign(value)

    def predict(self, x, *args, **kwargs):
        arguments = _input_checks.bind(keras.Model.predict, x, *args, **kwargs)
        arguments["x"], check = _input_checks.prepare(
            self, arguments.get("x"), None, None, arguments.get("batch_size"),
            training=False, targets=False, role="data",
        )
        # The carried state moves on with the windows predicted; if `predict`
        # fails, it is put back.
        carried = list(getattr(self, "recurrent_state_variables", []))
        with _safe_calls.guarded_call(self, [check], carried):
            return super().predict(**arguments)

    def __call__(self, *args, **kwargs):
        inputs = args[0] if args else kwargs.get("inputs")
        training = kwargs.get("training", args[1] if len(args) > 1 else None)
        self._check_call_inputs(inputs, training is True)
        return super().__call__(*args, **kwargs)

    def _check_call_inputs(self, inputs, training):
        """Shapes always (statically); ids when the call is eager.

        Ids given to `fit`, `evaluate`, `predict` and the evaluation helpers
        were checked there (`_validation.ids_checked`).
        """
        if isinstance(inputs, (list, tuple)):
            inputs = self.check_token_ids(inputs, "inputs")
        shape = getattr(inputs, "shape", None)
        if shape is None:
            return
        try:
            shape = tuple(shape)
        except ValueError:  # TensorFlow: unknown rank
            return
        if len(shape) != 2:
            raise ValueError(
                "Expected token ids of shape (batch, time). "
                f"Received: inputs.shape={shape}"
            )
        _input_checks.check_not_empty(shape, "inputs")
        rows = shape[0] if isinstance(shape[0], int) else None
        _input_checks.check_rows(self, rows, training, f"inputs.shape={shape}")
        if isinstance(inputs, keras.KerasTensor) or _validation.in_ids_checked():
            return
        if _input_checks.is_host_array(inputs) or get_backend_module().is_concrete(inputs):
            self.check_token_ids(inputs, "inputs")

    def check_token_ids(self, ids, name="ids", ndim=2):
        """Checks token ids for this model; returns them as a NumPy array.

        The one check every entry point uses: integer dtype, rank `ndim`
        and every id in `[0, vocabulary_size)`. Accepts NumPy arrays, lists
        and tensors of any backend (copied to the host).

        Args:
            ids: the token ids.
            name: str. Their name in the error message. Defaults to `"ids"`.
            ndim: int, tuple of int or None. Allowed ranks. Defaults to `2`
                (`(batch, time)`).

        Returns:
            The ids as a NumPy array.

        Raises:
            ValueError: saying what was expected and what was received.
        """
        return _validation.token_ids(name, ids, self.vocabulary_size, ndim=ndim)


class _ResetStatesEachEpoch(keras.callbacks.Callback):
    """Zeroes a stateful model's recurrent state at each epoch's start."""

    def on_epoch_begin(self, epoch, logs=None):
        self.model.reset_states()
