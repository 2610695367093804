"""Checkpoints that resume a training run exactly, from any step."""

import json
import os
import re

import keras
import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module

FORMAT = 2
PROGRESS = "progress.json"
LAST_MODEL = "last.keras"
_STATE = re.compile(r"^state-(\d{9})\.npz$")


class TrainingCheckpoint(keras.callbacks.Callback):
    """Saves all that training needs to resume exactly: any step, any kill.

    A checkpoint holds every variable of the model (the weights, the
    carried recurrent state, the dropout layers' random-number generators),
    every optimizer variable (the moments, the step count, so a learning
    rate schedule's position, a `TwoTailedAveragingOptimizer`'s averages),
    the epoch's metric accumulators (for a checkpoint within an epoch), the
    state of the callbacks that keep one (`DivergenceRecovery`'s own
    checkpoint and counters, `TwoTailedAveraging`'s evaluations), the epoch
    and step reached (so the position in a `StreamDataset`, whose windows
    are a function of it), every finished epoch's logs and a fingerprint of
    the run (the model's config and variables, the optimizer, the data, the
    batch size, and `config`). It is written at every epoch's end and, with
    `save_every_steps=N`, every N steps within an epoch. At an epoch's end
    the whole model is also saved as `last.keras` (loadable with
    `keras.saving.load_model`).

    Writes are atomic: each file is written under a temporary name and then
    renamed, and `progress.json`, which names the state file, is renamed
    last, so a process killed at any moment (also during a write) leaves the
    previous checkpoint whole.

    To resume, run the same script again with `resume=True`:
    `LanguageModel.fit` then loads the checkpoint into the model (built and
    compiled as before) and continues at the saved epoch and step. With a
    `StreamDataset` the run ends with the weights and history of the run
    that was never interrupted (see docs/training-recipe.md for the
    tolerance per backend). A checkpoint of another run (another model,
    data, batch size or `config`) is refused with a `ValueError` naming the
    differences, before anything changes. Without a checkpoint in
    `directory`, `resume=True` starts from the beginning.

    Args:
        directory: str. Where the checkpoint lives (created if missing).
        save_every_steps: int or None. Also save every this many steps
            within an epoch. Defaults to `None` (epoch ends only).
        resume: bool. Make `fit` resume from the checkpoint in `directory`.
            Defaults to `False` (a new run, which overwrites it).
        config: dict or None. More settings the run depends on (e.g. the
            training settings), JSON-serializable; a resumed run must have
            the same. Defaults to `None`.

    Example:

    ```python
    checkpoint = TrainingCheckpoint("ckpt", save_every_steps=200, resume=True)
    model.fit(StreamDataset(ids, 32, 35), epochs=10, callbacks=[checkpoint])
    ```
    """

    def __init__(self, directory, save_every_steps=None, resume=False, config=None):
        super().__init__()
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise ValueError(
                "Expected `directory` to be a path. Received: "
                f"directory={directory!r}"
            )
        if not isinstance(resume, bool):
            raise ValueError(
                f"Expected `resume` to be a bool. Received: resume={resume!r}"
            )
        if config is not None:
            if not isinstance(config, dict):
                raise ValueError(
                    "Expected `config` to be a dict or None. Received: "
                    f"config={config!r}"
                )
            try:
                config = json.loads(json.dumps(config))
            except (TypeError, ValueError) as error:
                raise ValueError(
                    "Expected `config` to be JSON-serializable. Received: "
                    f"config={config!r} ({error})"
                ) from None
        self.directory = os.fspath(directory)
        self.save_every_steps = _validation.optional_positive_int(
            "save_every_steps", save_every_steps
        )
        self.resume = resume
        self.config = config
        self.history = []
        self.saves = 0
        self._fingerprint = None
        self._callbacks = []
        self._epoch = 0
        self._step = 0
        self._counter = 0
        self._pending_callbacks = ({}, {})

    # === What fit tells it ===

    def bind(self, model, data, steps_per_epoch, callbacks):
        """Called by `LanguageModel.fit` before training: the run's fingerprint
        and the callbacks whose state the checkpoint carries."""
        self._fingerprint = fingerprint(model, data, steps_per_epoch, self.config)
        self._callbacks = [c for c in callbacks if hasattr(c, "get_resume_state")]

    def has_checkpoint(self):
        return os.path.exists(os.path.join(self.directory, PROGRESS))

    def read(self):
        """The saved `progress.json` (a dict), or `None`."""
        return read_progress(self.directory)

    # === Saving ===

    def on_epoch_begin(self, epoch, logs=None):
        if epoch != self._epoch:
            self._step = 0
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._step = batch + 1
        if self.save_every_steps and self._step % self.save_every_steps == 0:
            self._save(self._epoch, self._step, within_epoch=True)

    def on_epoch_end(self, epoch, logs=None):
        self.history = self.history[:epoch] + [_floats(logs)]
        self._save(epoch + 1, 0, within_epoch=False, logs=logs)
        self._epoch, self._step = epoch + 1, 0

    def _save(self, epoch, step, within_epoch, logs=None):
        model = self.model  # on JAX, reading it syncs the training state
        get_backend_module().sync_training_state(model)
        os.makedirs(self.directory, exist_ok=True)
        arrays = {}
        for i, v in enumerate(model.variables):
            arrays[f"model/{i}"] = keras.ops.convert_to_numpy(v)
        optimizer = model.optimizer
        if optimizer is not None and optimizer.built:
            for i, v in enumerate(optimizer.variables):
                arrays[f"optimizer/{i}"] = keras.ops.convert_to_numpy(v)
        if within_epoch:
            for i, v in enumerate(_metric_variables(model)):
                arrays[f"metrics/{i}"] = keras.ops.convert_to_numpy(v)
        callbacks = {}
        for index, callback in enumerate(self._callbacks):
            key = f"{index}:{type(callback).__name__}"
            state, values = callback.get_resume_state()
            callbacks[key] = state
            for i, value in enumerate(values):
                arrays[f"callback/{index}/{i}"] = np.asarray(value)
        self._counter = max(self._counter, _latest_counter(self.directory)) + 1
        name = f"state-{self._counter:09d}.npz"
        _write_atomically(
            os.path.join(self.directory, name),
            lambda path: _save_npz(path, arrays),
        )
        if not within_epoch:
            _write_atomically(
                os.path.join(self.directory, LAST_MODEL),
                lambda path: model.save(path),
                suffix=".keras",
            )
        progress = {
            "format": FORMAT,
            "epoch": epoch,
            "step": step,
            "epochs_done": epoch,
            "history": self.history,
            "logs": _floats(logs) if logs is not None else None,
            "state_file": name,
            "fingerprint": self._fingerprint,
            "callbacks": callbacks,
            "backend": keras.backend.backend(),
        }
        _write_atomically(
            os.path.join(self.directory, PROGRESS),
            lambda path: _write_json(path, progress),
        )
        for old in os.listdir(self.directory):
            # Earlier states, and what a killed writer left half written.
            if (_STATE.match(old) and old != name) or ".partial-" in old:
                os.remove(os.path.join(self.directory, old))
        self.saves += 1

    # === Resuming ===

    def check(self, saved):
        """Raises a `ValueError` if the saved run is not this one."""
        differences = _differences(saved.get("fingerprint"), self._fingerprint)
        if differences:
            raise ValueError(
                f"Expected the checkpoint in {self.directory!r} to be of this "
                "training run (the same model, optimizer, data, batch size and "
                "config). Received: a checkpoint that differs in "
                + "; ".join(differences)
                + ". Resume with the settings it was saved with, or start a "
                "new run (resume=False, or another directory)"
            )

    def restore(self, model, saved):
        """Loads the saved variables into `model`; returns the metric values
        of a checkpoint within an epoch (else `None`)."""
        path = os.path.join(self.directory, saved["state_file"])
        with np.load(path) as data:
            arrays = {key: data[key] for key in data.files}
        optimizer = model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)
        for i, v in enumerate(model.variables):
            v.assign(arrays[f"model/{i}"])
        if optimizer is not None:
            for i, v in enumerate(optimizer.variables):
                v.assign(arrays[f"optimizer/{i}"])
        self.history = list(saved.get("history") or [])
        self._epoch, self._step = saved["epoch"], saved["step"]
        self._counter = _latest_counter(self.directory)
        self._pending_callbacks = (saved.get("callbacks") or {}, arrays)
        metrics = sorted(
            (int(k.split("/")[1]), v) for k, v in arrays.items() if k.startswith("metrics/")
        )
        return [v for _, v in metrics] if saved["step"] else None

    def restore_callbacks(self):
        """Gives the callbacks their saved state (after their
        `on_train_begin`, which starts them afresh)."""
        states, arrays = self._pending_callbacks
        for index, callback in enumerate(self._callbacks):
            key = f"{index}:{type(callback).__name__}"
            if key not in states:
                continue
            values = []
            while f"callback/{index}/{len(values)}" in arrays:
                values.append(arrays[f"callback/{index}/{len(values)}"])
            callback.set_resume_state(states[key], values)
        self._pending_callbacks = ({}, {})


def read_progress(directory):
    """`progress.json` of a checkpoint directory as a dict, or `None`."""
    path = os.path.join(directory, PROGRESS)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def restore_metrics(model, values):
    """Puts an epoch's metric accumulators back (a resumed epoch)."""
    variables = _metric_variables(model)
    if len(variables) != len(values):
        raise ValueError(
            f"Expected {len(values)} metric variables to restore the epoch's "
            f"metrics into (as saved). Received: a model with {len(variables)}; "
            "compile it with the same loss and metrics"
        )
    for variable, value in zip(variables, values):
        variable.assign(value)


def fingerprint(model, data, steps_per_epoch, config):
    """What must match for a checkpoint to resume this run."""
    optimizer = model.optimizer
    # Names (of the model, of its variables) differ from process to
    # process; the shapes and the order are what a restore relies on.
    model_config = {k: v for k, v in model.get_config().items() if k != "name"}
    return _jsonable({
        "model": model_config,
        "variables": [[list(v.shape), str(v.dtype)] for v in model.variables],
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "optimizer_variables": (
            [list(v.shape) for v in optimizer.variables]
            if optimizer is not None and optimizer.built else None
        ),
        "data": data.fingerprint() if hasattr(data, "fingerprint") else None,
        "batch_size": getattr(model, "batch_size", None),
        "steps_per_epoch": steps_per_epoch,
        "config": config,
    })


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def _differences(saved, current, prefix="", limit=6):
    """Where two fingerprints differ, as readable `key: saved → current`."""
    out = []

    def walk(a, b, path):
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            if path.startswith(("variables", "optimizer_variables")):
                a, b = f"{len(a or [])} variables", f"{len(b or [])} variables"
                if a == b:
                    a, b = "other names or shapes", "these"
            out.append(f"{path}: {_short(a)} in the checkpoint, {_short(b)} here")

    # A checkpoint saved before the optimizer was built matches any.
    if saved and current and saved.get("optimizer_variables") is None:
        current = dict(current, optimizer_variables=None)
    walk(saved or {}, current or {}, prefix)
    return out


def _short(value):
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _metric_variables(model):
    return [v for metric in model.metrics for v in metric.variables]


def _latest_counter(directory):
    if not os.path.isdir(directory):
        return 0
    counters = [int(m.group(1)) for m in map(_STATE.match, os.listdir(directory)) if m]
    return max(counters, default=0)


def _write_atomically(path, write, suffix=""):
    """`write(temporary)`, flushed to disk, then renamed to `path`."""
    temporary = f"{path}.partial-{os.getpid()}{suffix}"
    try:
        write(temporary)
        with open(temporary, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _save_npz(path, arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


def _floats(logs):
    return {k: float(v) for k, v in (logs or {}).items()}
