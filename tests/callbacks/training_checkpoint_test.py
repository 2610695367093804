"""A training run killed anywhere and resumed ends as the uninterrupted one.

Real processes (`resume_worker.py`) are killed with SIGKILL, five times in
one run: after a step within an epoch, twice, and half-way through writing
each kind of checkpoint file. The resumed run must end with the final
variables (weights, optimizer-free model state, random-number generators)
and the per-epoch history of the run that was never interrupted — bitwise, which holds on all
three backends on CPU. The model has every kind of dropout, the data wraps
around its text (with jittered starts), and Two-Tailed Averaging and
DivergenceRecovery run, so their states are resumed too.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_mogrifier.callbacks import TrainingCheckpoint
from keras_mogrifier.data import StreamDataset
from keras_mogrifier.models import LanguageModel

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "resume_worker.py")
KILLED = -9


def _run(out, checkpoint, *args, expect=0):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, WORKER, str(out), str(checkpoint), *args],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == expect, (
        f"worker {args}: exit {done.returncode}, expected {expect}\n{done.stderr[-3000:]}"
    )


def _result(out):
    arrays = np.load(out)
    with open(str(out) + ".json") as f:
        record = json.load(f)
    return [arrays[f"v{i}"] for i in range(len(arrays.files))], record


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    _run(directory / "out.npz", directory / "checkpoint")
    return _result(directory / "out.npz")


def _assert_same_run(out, uninterrupted):
    variables, record = _result(out)
    want_variables, want_record = uninterrupted
    assert len(record["history"]) == 4
    assert record["history"] == want_record["history"]
    assert len(variables) == len(want_variables)
    for got, want in zip(variables, want_variables):
        np.testing.assert_array_equal(got, want)


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_killed_five_times_in_one_run_and_resumed(tmp_path, uninterrupted):
    """One run killed five times, each resumed process killed at a new place:
    after a step within an epoch, half way through writing each kind of
    checkpoint file (the model, a state file, the progress file), and after
    a step of a later epoch; the run then ends as the uninterrupted one."""
    out, checkpoint = tmp_path / "out.npz", tmp_path / "checkpoint"
    steps = uninterrupted[1]["steps"]  # per epoch

    def progress():
        with open(checkpoint / "progress.json") as f:
            record = json.load(f)
        return record["epoch"], record["step"]

    def killed_in_write(kind, name):
        _run(out, checkpoint, "--resume", "--kill-in-write", kind, expect=KILLED)
        partial = [f for f in os.listdir(checkpoint) if ".partial" in f]
        assert len(partial) == 1 and partial[0].startswith(name), partial

    # Epoch 1 step 7: the last checkpoint is at step 4.
    _run(out, checkpoint, "--kill-step", "7", expect=KILLED)
    assert progress() == (0, 4)
    # The 2nd model file this process writes (the end of epoch 2), half written.
    killed_in_write("keras:2", "last.keras")
    # Epoch 3 step 3: the checkpoint at the end of epoch 2 is the last.
    _run(out, checkpoint, "--resume", "--kill-step", str(2 * steps + 3), expect=KILLED)
    assert progress() == (2, 0)
    # The 3rd state file, then the 4th progress file, half written.
    killed_in_write("npz:3", "state-")
    killed_in_write("json:4", "progress.json")
    _run(out, checkpoint, "--resume")
    _assert_same_run(out, uninterrupted)
    leftovers = [f for f in os.listdir(checkpoint) if ".partial" in f]
    assert leftovers == []


# === Refusals, in process ===


def _model(units=6, batch_size=2):
    keras.utils.set_random_seed(1)
    model = LanguageModel(
        13, units=units, embedding_dim=units, num_layers=1, cell="lstm",
        batch_size=batch_size, input_dropout=0.1, seed=2,
    )
    model.build((batch_size, None))
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _data(seed=0, batch_size=2):
    ids = np.random.default_rng(seed).integers(0, 13, size=90)
    return StreamDataset(ids, batch_size=batch_size, sequence_length=5, seed=4)


def _files(directory):
    return {
        name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
    }


@pytest.mark.parametrize(
    "change, named",
    [
        ({"units": 8}, "model.units"),
        ({"data_seed": 1}, "data.ids_sha256"),
        ({"batch_size": 3}, "batch_size"),
        ({"config": {"learning_rate": 0.1}}, "config.learning_rate"),
    ],
)
def test_a_checkpoint_of_another_run_is_refused_before_anything_changes(
    tmp_path, change, named
):
    directory = tmp_path / "checkpoint"
    config = {"learning_rate": 0.01}
    first = _model()
    first.fit(_data(), epochs=1, verbose=0,
              callbacks=[TrainingCheckpoint(directory, config=config)])
    before = _files(directory)
    batch_size = change.get("batch_size", 2)
    other = _model(units=change.get("units", 6), batch_size=batch_size)
    weights = [keras.ops.convert_to_numpy(v) for v in other.variables]
    resume = TrainingCheckpoint(directory, resume=True, config=change.get("config", config))
    with pytest.raises(ValueError, match=rf"differs in .*{named}"):
        other.fit(_data(change.get("data_seed", 0), batch_size), epochs=2, verbose=0,
                  callbacks=[resume])
    assert _files(directory) == before
    for variable, value in zip(other.variables, weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), value)


def test_resume_needs_continued_streams_and_a_new_format_checkpoint(tmp_path):
    directory = tmp_path / "checkpoint"
    model = _model()
    model.fit(_data(), epochs=1, verbose=0, callbacks=[TrainingCheckpoint(directory)])
    with pytest.raises(ValueError, match="StreamDataset"):
        model.fit(_data(), epochs=2, verbose=0, reset_state_each_epoch=True,
                  callbacks=[TrainingCheckpoint(directory, resume=True)])
    old = tmp_path / "old"
    old.mkdir()
    (old / "progress.json").write_text(json.dumps({"epochs_done": 1, "history": []}))
    with pytest.raises(ValueError, match="older format"):
        model.fit(_data(), epochs=2, verbose=0,
                  callbacks=[TrainingCheckpoint(old, resume=True)])
    with pytest.raises(ValueError, match="at most one TrainingCheckpoint"):
        model.fit(_data(), epochs=1, verbose=0,
                  callbacks=[TrainingCheckpoint(directory), TrainingCheckpoint(old)])


def test_bad_arguments():
    for kwargs, match in (
        ({"directory": ""}, "directory"),
        ({"directory": "d", "save_every_steps": 0}, "save_every_steps"),
        ({"directory": "d", "resume": "yes"}, "resume"),
        ({"directory": "d", "config": [1]}, "config"),
        ({"directory": "d", "config": {"f": object()}}, "JSON"),
    ):
        with pytest.raises(ValueError, match=match):
            TrainingCheckpoint(**kwargs)
