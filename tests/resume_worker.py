"""Trains a tiny language model with a TrainingCheckpoint; can kill itself.

Run by `callbacks/training_checkpoint_test.py`, one process per run (a real
SIGKILL ends the process as a user's `kill -9` or a lost machine would):

    python resume_worker.py OUT CHECKPOINT [--resume] [--kill-step N]
        [--kill-in-write KIND:K]

`--kill-step N` sends SIGKILL to the process after its N-th training step
(counted over the whole run, epochs included); `--kill-in-write npz:3`
sends it in the middle of writing the 3rd state file (`json`: the 3rd
progress.json, `keras`: the 3rd last.keras), with the temporary file half
written. A run that ends writes its final variables and per-epoch history
to OUT.
"""

import argparse
import json
import os
import signal
import sys

import keras
import numpy as np

from keras_mogrifier.callbacks import training_checkpoint
from keras_mogrifier.data import StreamDataset
from keras_mogrifier.pipeline.language_modeling import build_language_model
from keras_mogrifier.pipeline.language_modeling import compile_language_model
from keras_mogrifier.pipeline.language_modeling import training_callbacks
from keras_mogrifier.pipeline.presets import get_preset

VOCABULARY = 23
BATCH, WINDOW, EPOCHS, EVERY = 3, 7, 4, 4
MODEL = dict(
    units=8, embedding_dim=8, num_layers=2, cell="rlstm", input_dropout=0.2,
    state_dropout=0.1, output_dropout=0.2, drop_state_probability=0.1, seed=7,
)
TRAINING = dict(
    optimizer="radam", learning_rate=1e-2, beta_1=0.0, batch_size=BATCH,
    sequence_length=WINDOW, eval_batch_size=BATCH, two_tailed_averaging=True,
    averaging_frequency=5, divergence_recovery=True,
)


def kill():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillAfter(keras.callbacks.Callback):
    """SIGKILL after the run's `step`-th training step (resumed runs count
    the steps before them)."""

    def __init__(self, step, steps_per_epoch):
        super().__init__()
        self.step = step
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch * self.steps_per_epoch + batch + 1 == self.step:
            kill()


def kill_in_write(kind, count):
    """Makes the `count`-th write of `kind` stop half way with a SIGKILL."""
    name = {"npz": "_save_npz", "json": "_write_json"}.get(kind)
    calls = {"n": 0}
    if kind == "keras":
        original_save = keras.Model.save

        def save(model, path, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == count:
                with open(path, "wb") as f:
                    f.write(b"PK\x03\x04 half a zip")
                kill()
            return original_save(model, path, *args, **kwargs)

        keras.Model.save = save
        return
    original = getattr(training_checkpoint, name)

    def write(path, value):
        calls["n"] += 1
        if calls["n"] == count:
            original(path, value)
            with open(path, "r+b") as f:  # half of it on disk, then killed
                f.truncate(max(1, os.path.getsize(path) // 2))
            kill()
        return original(path, value)

    setattr(training_checkpoint, name, write)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("checkpoint")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-step", type=int)
    parser.add_argument("--kill-in-write")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)  # the same initial weights in every process
    rng = np.random.default_rng(0)
    # Text with some structure (a noisy cycle), lines ended by id 0.
    ids = (np.arange(700) * 5 + rng.integers(0, 3, 700)) % VOCABULARY
    ids[rng.random(700) < 0.08] = 0
    train = StreamDataset(ids[:300], BATCH, WINDOW, line_end_id=0, seed=3)
    assert train.start_jitter > 0
    valid = StreamDataset(ids[300:420], BATCH, WINDOW, drop_remainder=False)
    config = get_preset("tiny", MODEL, TRAINING)
    training = config["training"]
    model = build_language_model(VOCABULARY, config["model"], BATCH)
    compile_language_model(model, training)
    callbacks = training_callbacks(
        training, args.checkpoint, valid, resume=args.resume,
        checkpoint_every_steps=EVERY,
    )
    if args.kill_step:
        callbacks.append(KillAfter(args.kill_step, len(train)))
    if args.kill_in_write:
        kind, count = args.kill_in_write.split(":")
        kill_in_write(kind, int(count))
    model.fit(train, validation_data=valid, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    checkpoint = next(c for c in callbacks if type(c).__name__ == "TrainingCheckpoint")
    np.savez(
        args.out,
        **{f"v{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.variables)},
    )
    with open(args.out + ".json", "w") as f:
        json.dump({"history": checkpoint.history, "steps": len(train)}, f)


if __name__ == "__main__":
    main()
