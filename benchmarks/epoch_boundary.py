"""What an epoch boundary costs: zeroed state and restarted streams vs lamb's
carried state (issue 39).

Trains the same model on Penn Treebank twice per batch size — with
`reset_state_each_epoch=True` (every epoch restarts the streams from their
starts, from zero state: how this package trained before 0.2) and with the
state carried across epochs (the default now) — and records, for every
epoch after the first, the training loss of its first batch against the
previous epoch's mean training loss, and every epoch's validation
perplexity. Both runs of a batch size start from the same weights, draw the
same dropout masks and read the same first epoch.

    KERAS_BACKEND=jax python benchmarks/epoch_boundary.py \\
        --data-dir ../shared/data/ptb --json benchmarks/results/epoch_boundary.json

Without `--data-dir` the embedded synthetic corpus is used (a smoke run).
"""

import platform
import time

import _harness

_harness.environment("jax", log_level="3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.data import load_ptb  # noqa: E402
from keras_mogrifier.data import synthetic_corpus  # noqa: E402
from keras_mogrifier.pipeline.language_modeling import build_language_model  # noqa: E402
from keras_mogrifier.pipeline.language_modeling import compile_language_model  # noqa: E402
from keras_mogrifier.pipeline.language_modeling import stream_dataset  # noqa: E402
from keras_mogrifier.pipeline.presets import get_preset  # noqa: E402


class Boundary(keras.callbacks.Callback):
    """Each epoch's first-batch loss, mean loss and validation perplexity."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append({"epoch": epoch, "start": time.time()})

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.epochs[-1]["first_batch_loss"] = float(logs["loss"])

    def on_epoch_end(self, epoch, logs=None):
        record = self.epochs[-1]
        record["mean_loss"] = float(logs["loss"])
        record["valid_perplexity"] = float(logs.get("val_perplexity", float("nan")))
        record["seconds"] = time.time() - record.pop("start")


def run(corpus, args, batch_size, reset):
    config = get_preset(
        "tiny",
        dict(cell=args.cell, units=args.units, embedding_dim=args.units,
             mogrifier_rounds=0, mogrifier_rank=None),
        dict(batch_size=batch_size, eval_batch_size=batch_size, epochs=args.epochs,
             learning_rate=args.learning_rate, reset_state_each_epoch=reset),
    )
    training = config["training"]
    keras.utils.set_random_seed(args.seed)  # the same weights for both runs
    model = build_language_model(
        len(corpus.vocabulary), config["model"], batch_size, vocabulary=corpus.vocabulary
    )
    compile_language_model(model, training)
    train = stream_dataset(corpus.train, training, line_end_id=corpus.vocabulary.eos_id)
    valid = stream_dataset(corpus.valid, training, batch_size, evaluation=True)
    boundary = Boundary()
    model.fit(
        train, validation_data=valid, epochs=args.epochs, verbose=0,
        reset_state_each_epoch=reset, callbacks=[boundary],
    )
    epochs = boundary.epochs
    for before, after in zip(epochs, epochs[1:]):
        after["first_batch_over_previous_mean"] = (
            after["first_batch_loss"] / before["mean_loss"]
        )
    return {
        "batch_size": batch_size,
        "reset_state_each_epoch": reset,
        "steps_per_epoch": len(train),
        "parameters": int(model.count_params()),
        "epochs": epochs,
    }


def main(argv=None):
    parser = _harness.argument_parser(__doc__, data_dir="optional")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cell", default="lstm")
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    corpus = (
        load_ptb(args.data_dir, download=False) if args.data_dir
        else synthetic_corpus(train_tokens=20_000, valid_tokens=4_000, test_tokens=4_000)
    )
    record = {
        "command": _harness.command_line(__file__, argv, backend=keras.backend.backend()),
        "corpus": corpus.source,
        "model": {"cell": args.cell, "units": args.units, "layers": 2, "preset": "tiny"},
        "host": platform.node(),
        "runs": [],
    }
    for batch_size in args.batch_sizes:
        for reset in (True, False):
            result = run(corpus, args, batch_size, reset)
            record["runs"].append(result)
            ratios = [
                e.get("first_batch_over_previous_mean") for e in result["epochs"][1:]
            ]
            print(
                f"batch {batch_size}, {'reset' if reset else 'carried'}: first batch "
                "/ previous epoch's mean loss "
                + ", ".join(f"{r:.3f}" for r in ratios)
                + "; valid perplexity "
                + ", ".join(f"{e['valid_perplexity']:.1f}" for e in result["epochs"]),
                flush=True,
            )
            if args.json:  # each finished run at once
                _harness.write_json(args.json, record, indent=1)


if __name__ == "__main__":
    main()
