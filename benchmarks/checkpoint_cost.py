"""What a TrainingCheckpoint costs (issue 39): time per checkpoint, its
size, and its share of training time at several intervals.

The model is the equal-parameter study's Mogrifier RLSTM (2 × 200, 2.65M
parameters with the tied 10k-word embedding, batch 32, window 35, Adam),
on random ids. A checkpoint within an epoch writes the state file and
progress.json; one at an epoch's end also writes the whole model
(`last.keras`). Each is timed several times (the median kept) against the
median training step measured in the same process. Time it on a quiet
machine (the load average is recorded).

    KERAS_BACKEND=jax python benchmarks/checkpoint_cost.py \\
        --json benchmarks/results/checkpoint_cost.json
"""

import os
import platform
import statistics
import tempfile
import time

import _harness

_harness.environment("jax", log_level="3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.callbacks import TrainingCheckpoint  # noqa: E402
from keras_mogrifier.data import StreamDataset  # noqa: E402
from keras_mogrifier.pipeline.language_modeling import build_language_model  # noqa: E402
from keras_mogrifier.pipeline.language_modeling import compile_language_model  # noqa: E402
from keras_mogrifier.pipeline.presets import get_preset  # noqa: E402

MODEL = dict(cell="mogrifier_rlstm", units=200, embedding_dim=200, num_layers=2,
             mogrifier_rounds=5, mogrifier_rank=19, input_dropout=0.3,
             cell_output_dropout=0.2, state_dropout=0.1, output_dropout=0.3)


class StepTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


def main(argv=None):
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--intervals", type=int, nargs="+", default=[50, 100, 200, 500])
    args = parser.parse_args(argv)
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    keras.utils.set_random_seed(0)
    vocabulary, batch, window = 10_000, 32, 35
    ids = np.random.default_rng(0).integers(0, vocabulary, size=batch * window * (args.steps + 2))
    config = get_preset("tiny", MODEL, dict(batch_size=batch, sequence_length=window))
    model = build_language_model(vocabulary, config["model"], batch)
    compile_language_model(model, config["training"])
    data = StreamDataset(ids, batch, window, seed=0)
    steps = StepTimes()
    model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=[steps])
    step_seconds = statistics.median(steps.times[5:])
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = TrainingCheckpoint(directory)
        checkpoint.set_model(model)
        checkpoint.bind(model, data, len(data), [])
        timings = {}
        for kind, within in (("within_epoch", True), ("epoch_end", False)):
            timings[kind] = _harness.time_call(
                lambda: checkpoint._save(0, 1 if within else 0, within_epoch=within,
                                         logs={"loss": 1.0}),
                args.repeats,
            ).median
        sizes = {name: os.path.getsize(os.path.join(directory, name))
                 for name in os.listdir(directory)}
    record = {
        "command": _harness.command_line(__file__, argv, backend=keras.backend.backend()),
        "backend": keras.backend.backend(),
        "host": platform.node(),
        "load_average_1min": _harness.load_average()[0],
        "quiet_machine": quiet,
        "parameters": int(sum(np.prod(w.shape) for w in model.trainable_weights)),
        "step_seconds": step_seconds,
        "checkpoint_seconds": timings,
        "file_bytes": sizes,
        "overhead_within_epoch": {
            str(n): timings["within_epoch"] / (n * step_seconds) for n in args.intervals
        },
    }
    print(f"{record['backend']}: step {1000 * step_seconds:.0f} ms; checkpoint within "
          f"an epoch {1000 * timings['within_epoch']:.0f} ms, at an epoch's end "
          f"{1000 * timings['epoch_end']:.0f} ms; state file "
          f"{max(v for k, v in sizes.items() if k.startswith('state')) / 1e6:.1f} MB")
    for n, share in record["overhead_within_epoch"].items():
        print(f"  every {n} steps: +{100 * share:.2f} % of training time")
    if args.json:
        _harness.write_json(args.json, record, indent=1)


if __name__ == "__main__":
    main()
