"""The library on one CUDA GPU, JAX and PyTorch backends (issues 29 and 28).

One command, one JSON (`--json`), written again after every measured item
(so a run stopped early still holds what it measured), and a table at the
end. Every part runs in its own process per backend (`KERAS_BACKEND` set
before Keras is imported), one after the other.

Part a (issue 29's table on a GPU; `--backends`, jax and torch by default):
a `LanguageModel` over V = 10k ids, 2 × 256 units, batch 32, window 35,
dropout 0.3 (input, state, output), `IWAEDropoutLoss`, Adam (built by
`benchmarks/backends.py`'s `_build`), for the cells `lstm`, `rlstm` and
`mogrifier_rlstm` (5 rounds of rank 32):

- `train_ms`: one step of `fit` (median of `--repeats` fits of
  `--train-steps` steps, after `--warmup-steps` steps that include the
  compilation), and `tokens_per_s`;
- `static_ms_per_token` and `dynamic_ms_per_token`:
  `DynamicEvaluator.evaluate(..., adapt=False)` and `DynamicEvaluator.evaluate`
  (every weight adapted, after `collect_gradient_statistics`) on
  `--eval-tokens` tokens (1,500), batch 1, segments of 5, and
  `dynamic_over_static`;

and beside them, in the same process, references at the same shapes
(embedding 10k → 2 × LSTM(256) → Dense(10k), sparse cross-entropy, Adam,
no dropout, one forward + backward + update per step on (32, 35) ids):
`keras.layers.LSTM` (Keras's cuDNN path where the backend has one:
`cudnn_ok` is stored) trained with `train_on_batch`, and on the torch
backend `torch.nn.LSTM` (cuDNN) in a plain PyTorch loop.

Part b (issue 28's GPU rows, JAX): the `paper` preset's model (24M
parameters; `keras_mogrifier/pipeline/presets.py`) with cell `lstm` and with
cell `mogrifier_rlstm`, the preset otherwise unchanged and the same for
both (RAdam, Two-Tailed Averaging, divergence recovery, batch 128, BPTT 70,
D = 8), trained on Penn Treebank for a FIXED WALL-CLOCK BUDGET each
(`--train-seconds`, counted from the end of the first step, the
compilation; a callback stops `fit` after the first step that ends past
the budget; the epochs' validation passes count), then static validation and test
perplexity at τ = 1 (`evaluate_language_model`, 64 streams, window 70).
This is not the paper's schedule (~400 epochs): the perplexities are of
models trained for minutes, a comparison of the two cells at equal time.
With `--train-epochs N` each cell instead trains for exactly its first N
epochs (the preset's schedule, cut there: a comparison at equal data,
ending on an epoch boundary), the deadline's share only a safety stop; the
time at each epoch's end is stored either way (`epoch_end_seconds`, from
the end of the first step, validation included), so the curves can also be
read at equal time.

`--deadline` (seconds from the start) bounds the whole run: part a's
workers stop starting new items after `--a-seconds` (shared between the
backends) and part b's training budget is cut to what the deadline leaves
(the same for both cells); what was cut is stored. Defaults fit 7 minutes.

    python benchmarks/gpu.py --json gpu.json --data-dir ../shared/data/ptb
    python benchmarks/gpu.py --quick --json /tmp/g.json --data-dir ...  # CPU smoke test
"""

import argparse
import os
import subprocess
import time
import traceback

import _harness

HERE = os.path.dirname(os.path.abspath(__file__))

CELLS = ("lstm", "rlstm", "mogrifier_rlstm")
PAPER_CELLS = ("lstm", "mogrifier_rlstm")
BUDGET_NOTE = (
    "Part b trains each cell for a fixed wall-clock budget (train_seconds_budget, "
    "counted from the end of the first step, i.e. after the compilation; "
    "epoch-end validation inside it) on one GPU, not the paper's schedule (~400 "
    "epochs): its perplexities are of models trained for minutes, a "
    "comparison of the two cells at equal time, not converged results."
)
EPOCHS_NOTE = (
    "Part b trains each cell for exactly its first train_epochs epochs of the "
    "preset's schedule (~400 epochs) on one GPU: a comparison of the two cells "
    "at equal data, ending on an epoch boundary, not converged results; "
    "epoch_end_seconds (from the end of the first step, validation included) "
    "gives the curves' times for a reading at equal time."
)


# === The JSON, rewritten after every item ===


def _record(path, part, backend, key, value, append=False):
    """Sets (or appends to) `data[part][backend][key]` in the JSON at once."""
    _harness.merge_json(path, [part, backend, key], value, append=append)


# === Workers ===


def _sync():
    """Waits for the device (torch); JAX's fits and evaluations sync themselves."""
    import keras

    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


def _timed(fn, repeats):
    """Median seconds of `repeats` calls, and all of them, the device waited for."""
    timing = _harness.time_call(fn, repeats, sync=_sync)
    return timing.median, timing.wall


def _backends_args(args):
    """The settings `benchmarks/backends.py`'s `_build` reads."""
    return argparse.Namespace(
        vocabulary=args.vocabulary, units=args.units, batch=args.batch,
        window=args.window,
    )


def _measure_cell(args, name, train_ids, test_ids, path, backend, deadline):
    import keras
    import numpy as np

    import backends
    from keras_mogrifier.data import StreamDataset

    started = time.perf_counter()
    row = {"cell": name}
    model = backends._build(_backends_args(args), name, args.dropout)
    row["parameters"] = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    data = StreamDataset(train_ids, args.batch, args.window)
    steps = args.train_steps
    warm = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=args.warmup_steps, verbose=0)
    row["warmup_seconds"] = time.perf_counter() - warm
    median, times = _timed(
        lambda: model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0), args.repeats
    )
    row["train_ms"] = 1000 * median / steps
    row["train_ms_all"] = [1000 * t / steps for t in times]
    row["tokens_per_s"] = args.batch * args.window / (median / steps)
    row["seconds"] = time.perf_counter() - started
    _record(path, "part_a", backend, "rows", dict(row), append=True)
    if time.time() > deadline:
        row["evaluation_skipped"] = "part a's time budget spent"
        _replace_last_row(path, backend, row)
        return row

    stream = test_ids[: args.eval_tokens + 1]
    evaluator = backends.statistics_evaluator(model, train_ids, args)
    # The evaluator scores up to SEGMENTS_PER_CALL (64) segments per compiled
    # call, and each call length compiles once: the warm-up stream has one
    # full call and the timed stream's last, shorter one (1,500 tokens: 300
    # segments = 4 × 64 + 44; warm-up 64 + 44 segments).
    try:
        from keras_mogrifier.evaluation._stream_scoring import SEGMENTS_PER_CALL
    except ImportError:
        SEGMENTS_PER_CALL = 64
    segments = (len(stream) - 1) // args.segment_length
    last = segments % SEGMENTS_PER_CALL
    warm_segments = min(segments, SEGMENTS_PER_CALL + last)
    warm_ids = stream[: warm_segments * args.segment_length + 1]
    warm = time.perf_counter()
    evaluator.evaluate(warm_ids, adapt=False, verbose=0)
    evaluator.evaluate(warm_ids, verbose=0)
    row["evaluation_warmup_seconds"] = time.perf_counter() - warm
    tokens = len(stream) - 1
    row["eval_tokens"] = tokens
    median, times = _timed(
        lambda: evaluator.evaluate(stream, adapt=False, verbose=0), args.eval_repeats
    )
    row["static_ms_per_token"] = 1000 * median / tokens
    row["static_ms_per_token_all"] = [1000 * t / tokens for t in times]
    median, times = _timed(lambda: evaluator.evaluate(stream, verbose=0), args.eval_repeats)
    row["dynamic_ms_per_token"] = 1000 * median / tokens
    row["dynamic_ms_per_token_all"] = [1000 * t / tokens for t in times]
    row["dynamic_over_static"] = row["dynamic_ms_per_token"] / row["static_ms_per_token"]
    row["seconds"] = time.perf_counter() - started
    _replace_last_row(path, backend, row)
    keras.backend.clear_session()
    return row


def _replace_last_row(path, backend, row):
    data = _harness.read_json(path)
    data["part_a"][backend]["rows"][-1] = row
    _harness.write_json(path, data)


def _reference_batch(args):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.integers(0, args.vocabulary, size=(args.batch, args.window)).astype("int32")
    y = rng.integers(0, args.vocabulary, size=(args.batch, args.window)).astype("int32")
    return x, y


def _keras_lstm_reference(args):
    """`keras.layers.LSTM` × 2 between a 10k embedding and a 10k softmax."""
    import keras
    from keras import activations

    backend = keras.backend.backend()
    started = time.perf_counter()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input(batch_shape=(args.batch, args.window), dtype="int32"),
        keras.layers.Embedding(args.vocabulary, args.units),
        keras.layers.LSTM(args.units, return_sequences=True),
        keras.layers.LSTM(args.units, return_sequences=True),
        keras.layers.Dense(args.vocabulary),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = _reference_batch(args)
    for _ in range(args.warmup_steps):
        model.train_on_batch(x, y)
    steps = args.train_steps

    def run():
        for _ in range(steps):
            model.train_on_batch(x, y)

    median, times = _timed(run, args.repeats)
    try:
        rnn = __import__(f"keras.src.backend.{backend}.rnn", fromlist=["cudnn_ok"])
        cudnn = bool(rnn.cudnn_ok(activations.tanh, activations.sigmoid, False, True))
    except Exception as error:  # what the check says is data, not a failure
        cudnn = f"unknown ({type(error).__name__}: {error})"
    row = {
        "reference": "keras.layers.LSTM",
        "cudnn_ok": cudnn,
        "step_ms": 1000 * median / steps,
        "step_ms_all": [1000 * t / steps for t in times],
        "tokens_per_s": args.batch * args.window / (median / steps),
        "parameters": int(model.count_params()),
        "seconds": time.perf_counter() - started,
    }
    keras.backend.clear_session()
    return row


def _torch_lstm_reference(args):
    """`torch.nn.LSTM` (cuDNN on a GPU), 2 layers, a plain PyTorch loop."""
    import torch

    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(args.vocabulary, args.units)
            self.lstm = torch.nn.LSTM(args.units, args.units, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(args.units, args.vocabulary)

        def forward(self, x):
            return self.head(self.lstm(self.embedding(x))[0])

    net = Net().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = _reference_batch(args)
    x = torch.as_tensor(x, dtype=torch.long, device=device)
    y = torch.as_tensor(y, dtype=torch.long, device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(x).reshape(-1, args.vocabulary), y.reshape(-1))
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup_steps):
        step()
    steps = args.train_steps

    def run():
        for _ in range(steps):
            step()

    median, times = _timed(run, args.repeats)
    return {
        "reference": "torch.nn.LSTM",
        "device": device,
        "cudnn": bool(device == "cuda" and torch.backends.cudnn.enabled),
        "step_ms": 1000 * median / steps,
        "step_ms_all": [1000 * t / steps for t in times],
        "tokens_per_s": args.batch * args.window / (median / steps),
        "parameters": int(sum(p.numel() for p in net.parameters())),
        "seconds": time.perf_counter() - started,
    }


def _tokens(args):
    import numpy as np

    if args.data_dir:
        from keras_mogrifier.data import load_ptb

        corpus = load_ptb(args.data_dir, download=False, fallback=False)
        train = np.asarray(corpus.train, "int32")
        test = np.asarray(corpus.test, "int32")
        return train[train < args.vocabulary], test[test < args.vocabulary], "ptb"
    rng = np.random.default_rng(0)
    ranks = rng.zipf(1.2, size=400_000) % args.vocabulary
    return ranks[:300_000].astype("int32"), ranks[300_000:].astype("int32"), "zipf"


def _skip(path, backend, item, deadline):
    if time.time() <= deadline:
        return False
    _record(path, "part_a", backend, "skipped", item, append=True)
    print(f"[{backend}] {item}: skipped (part a's time budget spent)", flush=True)
    return True


def worker_a(args, path):
    import keras

    import keras_mogrifier  # noqa: F401  (the backend's settings)

    backend = keras.backend.backend()
    deadline = args.worker_deadline
    _record(path, "part_a", backend, "versions", _harness.versions())
    _record(path, "part_a", backend, "rows", [])
    _record(path, "part_a", backend, "references", [])
    _record(path, "part_a", backend, "skipped", [])
    _record(path, "part_a", backend, "errors", [])
    train_ids, test_ids, source = _tokens(args)
    _record(path, "part_a", backend, "tokens", source)
    # lstm first, then the references (cheap), then the other cells.
    items = [CELLS[0], "keras.layers.LSTM"]
    if backend == "torch":
        items.append("torch.nn.LSTM")
    items += list(CELLS[1:])
    for item in items:
        if _skip(path, backend, item, deadline):
            continue
        try:
            if item == "keras.layers.LSTM":
                row = _keras_lstm_reference(args)
                _record(path, "part_a", backend, "references", row, append=True)
            elif item == "torch.nn.LSTM":
                row = _torch_lstm_reference(args)
                _record(path, "part_a", backend, "references", row, append=True)
            else:
                row = _measure_cell(args, item, train_ids, test_ids, path, backend, deadline)
        except Exception:  # recorded; the next item still runs
            _record(path, "part_a", backend, "errors",
                    {"item": item, "traceback": traceback.format_exc()}, append=True)
            traceback.print_exc()
            keras.backend.clear_session()
            continue
        print(f"[{backend}] {item}: " + ", ".join(
            f"{k}={v:.4g}" for k, v in row.items() if isinstance(v, float)
        ), flush=True)


def time_budget_callback(seconds, steps=None):
    """A Keras callback that stops `fit` once `seconds` have passed since step 1.

    The clock starts when the first step (the compilation on JAX) ends, so
    a cell that compiles longer does not train less; it then counts
    everything `fit` does (steps, the epochs' validation passes, the
    averaging's evaluations), and `fit` stops after the first step that
    ends past the budget (or after step `steps`, when given). It counts
    the steps, the first step's time and the time inside the later steps
    (validation left out), so throughput is taken from the steps after the
    first; it also keeps each epoch's end time and its first batch's loss.
    """
    import keras

    class TimeBudget(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = seconds
            self.steps = 0
            self.epochs_begun = 0
            self.first_step_seconds = None
            self.later_steps_seconds = 0.0
            self.stopped_by_budget = False
            self.elapsed = None
            self.epoch_end_seconds = []
            # Each epoch's first batch's loss (its streams start from a zero state).
            self.first_batch_loss = []

        def on_train_begin(self, logs=None):
            self.start = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs_begun += 1

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_end_seconds.append(time.perf_counter() - self.first_step_end)

        def on_train_batch_begin(self, batch, logs=None):
            self.step_start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            self.steps += 1
            if batch == 0 and logs and "loss" in logs:
                self.first_batch_loss.append(float(logs["loss"]))
            if steps is not None and self.steps >= steps:
                self.model.stop_training = True
            if self.steps == 1:
                self.first_step_seconds = now - self.start
                self.first_step_end = now
                return
            self.later_steps_seconds += now - self.step_start
            if now - self.first_step_end >= self.seconds:
                self.stopped_by_budget = True
                self.model.stop_training = True

        def on_train_end(self, logs=None):
            self.elapsed = time.perf_counter() - self.start

    return TimeBudget()


def worker_b(args, path):
    import keras

    import keras_mogrifier  # noqa: F401
    from keras_mogrifier.data import load_ptb

    backend = keras.backend.backend()
    _record(path, "part_b", backend, "versions", _harness.versions())
    _record(path, "part_b", backend, "rows", [])
    _record(path, "part_b", backend, "errors", [])
    corpus = load_ptb(args.data_dir, download=False, fallback=False)
    cells = list(args.paper_cells)
    if args.train_epochs:
        _record(path, "part_b", backend, "train_epochs", args.train_epochs)
    else:
        # The same budget for every cell: what the deadline leaves, less a
        # reserve per cell (its first step's compilation, its evaluation),
        # shared equally (never over --train-seconds).
        left = args.worker_deadline - time.time()
        budget = max(1.0, min(args.train_seconds,
                              (left - len(cells) * args.cell_reserve) / len(cells)))
        _record(path, "part_b", backend, "train_seconds_budget", budget)
        _record(path, "part_b", backend, "train_seconds_requested", args.train_seconds)
    for i, cell in enumerate(cells):
        if args.train_epochs:
            # Epochs are the budget; time only stops a cell that would run
            # past the deadline (each cell may use what the earlier ones left).
            cell_budget = max(1.0, args.worker_deadline - time.time()
                              - (len(cells) - i) * args.cell_reserve)
        else:
            cell_budget = budget
        try:
            _paper_row(args, path, backend, corpus, cell, cell_budget)
        except Exception:  # recorded; the other cell still runs
            _record(path, "part_b", backend, "errors",
                    {"cell": cell, "traceback": traceback.format_exc()}, append=True)
            traceback.print_exc()
        keras.backend.clear_session()


def _paper_row(args, path, backend, corpus, cell, budget):
    import numpy as np

    from keras_mogrifier.pipeline.language_modeling import build_language_model
    from keras_mogrifier.pipeline.language_modeling import compile_language_model
    from keras_mogrifier.pipeline.language_modeling import evaluate_language_model
    from keras_mogrifier.pipeline.language_modeling import stream_dataset
    from keras_mogrifier.pipeline.language_modeling import training_callbacks
    from keras_mogrifier.pipeline.presets import get_preset
    import keras

    started = time.perf_counter()
    model_overrides = {"cell": cell}
    training_overrides = {}
    if args.quick:
        model_overrides.update(units=32, embedding_dim=32, samples=2, mogrifier_rank=8)
        training_overrides.update(batch_size=8, sequence_length=20, eval_batch_size=8)
    config = get_preset("paper", model_overrides, training_overrides)
    training = config["training"]
    keras.utils.set_random_seed(0)
    model = build_language_model(
        len(corpus.vocabulary), config["model"], training["batch_size"],
        vocabulary=corpus.vocabulary,
    )
    compile_language_model(model, training)
    parameters = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    train_data = stream_dataset(
        corpus.train, training, line_end_id=corpus.vocabulary.eos_id
    )
    valid_data = stream_dataset(
        corpus.valid, training, training["eval_batch_size"], evaluation=True
    )
    timer = time_budget_callback(budget, args.train_steps_total)
    # The preset's callbacks (divergence recovery, Two-Tailed Averaging,
    # which evaluates on validation every 1000 steps), then the budget; the
    # validation data of `fit` as `run_experiment` passes it.
    callbacks = training_callbacks(training, None, valid_data) + [timer]
    history = model.fit(
        train_data, validation_data=valid_data,
        epochs=args.train_epochs or training["epochs"],
        shuffle=False, callbacks=callbacks, verbose=0,
        reset_state_each_epoch=training["reset_state_each_epoch"],
    )
    steps = timer.steps
    tokens_per_step = training["batch_size"] * training["sequence_length"]
    averaging = next((c for c in callbacks if type(c).__name__ == "TwoTailedAveraging"), None)
    row = {
        "cell": cell,
        "model": {k: v for k, v in config["model"].items() if not isinstance(v, dict)},
        "training": training,
        "parameters": parameters,
        "train_seconds_budget": budget,
        "train_seconds": timer.elapsed,
        "train_epochs": args.train_epochs,
        "stopped_by_budget": timer.stopped_by_budget,
        "epoch_end_seconds": timer.epoch_end_seconds,
        "first_batch_loss": timer.first_batch_loss,
        "train_steps_total": args.train_steps_total,
        "first_step_seconds": timer.first_step_seconds,
        "later_steps_seconds": timer.later_steps_seconds,
        "steps": steps,
        "steps_per_epoch": len(train_data),
        "epochs_begun": timer.epochs_begun,
        "epochs_done": steps / len(train_data),
        "train_tokens": steps * tokens_per_step,
        # Steps after the first (the compilation), validation passes left out.
        "tokens_per_s": (
            (steps - 1) * tokens_per_step / timer.later_steps_seconds
            if steps > 1 and timer.later_steps_seconds > 0 else None
        ),
        "step_ms": (
            1000 * timer.later_steps_seconds / (steps - 1) if steps > 1 else None
        ),
        "history": {
            k: [float(x) for x in v] for k, v in history.history.items()
        },
        "two_tailed_averaging_evaluations": (
            len(averaging.evaluations) if averaging is not None else None
        ),
    }
    _record(path, "part_b", backend, "rows", dict(row), append=True)
    evaluated = time.perf_counter()
    valid = evaluate_language_model(model, corpus.valid, training)
    test = evaluate_language_model(model, corpus.test, training)
    row["valid_perplexity_tau1"] = valid["perplexity"]
    row["test_perplexity_tau1"] = test["perplexity"]
    row["evaluation"] = (
        f"static, τ = 1, {training['eval_batch_size']} streams, window "
        f"{training['sequence_length']}, every token once "
        "(evaluate_language_model), with the weights fit left in the model "
        "(the long average where Two-Tailed Averaging chose it)"
    )
    row["evaluation_seconds"] = time.perf_counter() - evaluated
    row["seconds"] = time.perf_counter() - started
    data = _harness.read_json(path)
    data["part_b"][backend]["rows"][-1] = row
    _harness.write_json(path, data)
    print(
        f"[{backend}] paper/{cell}: {steps} steps ({row['epochs_done']:.2f} epochs) in "
        f"{timer.elapsed:.0f} s, {row['tokens_per_s'] or 0:,.0f} tokens/s, valid "
        f"{valid['perplexity']:.1f}, test {test['perplexity']:.1f}", flush=True,
    )


# === Driver ===


def _nvidia_smi():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"nvidia-smi unavailable: {error}"


def _run_worker(part, backend, args, path, deadline, grace):
    """Part `part`'s worker in a fresh process on `backend`, stopped `grace`
    seconds past `deadline`; its exit status and seconds go to the JSON."""
    worker = {"a": worker_a, "b": worker_b}[part]
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "XLA_PYTHON_CLIENT_PREALLOCATE":
           os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")}
    started = time.perf_counter()
    try:
        _harness.run_in_backend(
            worker, argparse.Namespace(**dict(vars(args), worker_deadline=deadline)), path,
            backend=backend, env=env, timeout=max(1.0, deadline + grace - time.time()),
        )
        rc = 0
    except _harness.WorkerError as error:
        rc = error.returncode
    except subprocess.TimeoutExpired:
        rc = "killed: past the deadline"
    _record(path, "worker_runs", f"{part}/{backend}", "returncode", rc)
    _record(path, "worker_runs", f"{part}/{backend}", "seconds", time.perf_counter() - started)
    return rc


def print_table(data):
    print("\nPart a: " + data.get("part_a_setting", ""))
    print("| backend | cell | train step (ms) | tokens/s | static (ms/token) "
          "| dynamic (ms/token) | dynamic / static |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")

    def fmt(value, spec):
        return "—" if value is None else format(value, spec)

    for backend, result in data.get("part_a", {}).items():
        for row in result.get("rows", []):
            g = row.get
            print(f"| {backend} | {row['cell']} | {fmt(g('train_ms'), '.2f')} | "
                  f"{fmt(g('tokens_per_s'), ',.0f')} | {fmt(g('static_ms_per_token'), '.3f')} | "
                  f"{fmt(g('dynamic_ms_per_token'), '.3f')} | "
                  f"{fmt(g('dynamic_over_static'), '.2f')} |")
        for row in result.get("references", []):
            print(f"| {backend} | {row['reference']} (no dropout) | {row['step_ms']:.2f} | "
                  f"{row['tokens_per_s']:,.0f} | — | — | — |")
        if result.get("skipped"):
            print(f"| {backend} | skipped: {', '.join(result['skipped'])} | | | | | |")
    for backend, result in data.get("part_b", {}).items():
        if result.get("train_epochs"):
            print(f"\nPart b: the paper preset on PTB, {backend}, the first "
                  f"{result['train_epochs']} epochs of its schedule per cell")
        else:
            print(f"\nPart b: the paper preset on PTB, {backend}, a fixed budget of "
                  f"{result.get('train_seconds_budget', 0):.0f} s of training per cell")
        print("| cell | parameters | steps | epochs | tokens/s | valid ppl (τ 1) "
              "| test ppl (τ 1) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row in result.get("rows", []):
            g = row.get
            print(f"| {row['cell']} | {row['parameters']:,} | {row['steps']} | "
                  f"{row['epochs_done']:.2f} | {fmt(g('tokens_per_s'), ',.0f')} | "
                  f"{fmt(g('valid_perplexity_tau1'), '.1f')} | "
                  f"{fmt(g('test_perplexity_tau1'), '.1f')} |")


SIZES = {  # name -> (full, quick)
    "train_seconds": (150.0, 10.0),
    "deadline": (405.0, 3600.0),
    "a_seconds": (150.0, 1800.0),
    "warmup_steps": (3, 1),
    "train_steps": (10, 2),
    "repeats": (3, 1),
    "eval_tokens": (1500, 30),
    "eval_repeats": (1, 1),
    "statistics_steps": (10, 2),
}


def main():
    parser = _harness.argument_parser(__doc__, json_required=True, quiet=True)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and budgets: a CPU check that everything runs")
    parser.add_argument("--parts", nargs="+", default=["a", "b"], choices=["a", "b"])
    parser.add_argument("--backends", nargs="+", default=["jax", "torch"],
                        choices=["jax", "torch", "tensorflow"], help="part a's backends")
    parser.add_argument("--paper-backend", default="jax", choices=["jax", "torch", "tensorflow"])
    parser.add_argument("--paper-cells", nargs="+", default=list(PAPER_CELLS))
    parser.add_argument("--data-dir", default=None,
                        help="Penn Treebank folder (ptb.{train,valid,test}.txt[.gz]); "
                             "default: ptb/ beside this script if there")
    parser.add_argument("--train-seconds", type=float,
                        help="part b: training budget per cell, from the end of its "
                             "first step (default 150; 10 with --quick)")
    parser.add_argument("--train-epochs", type=int, default=None,
                        help="part b: train each cell for exactly this many epochs "
                             "instead of --train-seconds (the deadline still stops it)")
    parser.add_argument("--train-steps-total", type=int, default=None,
                        help="part b: also stop each cell after this many steps "
                             "(e.g. one step into an epoch: 5 × 103 + 1)")
    parser.add_argument("--deadline", type=float,
                        help="seconds from the start by which everything ends "
                             "(default 405; 3600 with --quick)")
    parser.add_argument("--a-seconds", type=float,
                        help="part a: seconds after which no new item starts, shared "
                             "by the backends (default 150; 1800 with --quick)")
    parser.add_argument("--cell-reserve", type=float, default=60.0,
                        help="part b: seconds kept per cell besides its training budget "
                             "(building, the first step's compilation, evaluation)")
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=35)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--segment-length", type=int, default=5)
    parser.add_argument("--statistics-batch", type=int, default=20)
    for name, (full, quick) in SIZES.items():
        if not isinstance(full, float):
            parser.add_argument("--" + name.replace("_", "-"), type=int,
                                help=f"default {full} ({quick} with --quick)")
    args = parser.parse_args()
    for name, (full, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.data_dir is None and os.path.isdir(os.path.join(HERE, "ptb")):
        args.data_dir = os.path.join(HERE, "ptb")
    if args.quick:
        args.vocabulary, args.units = min(args.vocabulary, 2000), min(args.units, 32)
    path = os.path.abspath(args.json)
    if args.train_epochs is not None and args.train_epochs < 1:
        parser.error(f"--train-epochs must be a positive integer; received {args.train_epochs}")
    if args.train_steps_total is not None and args.train_steps_total < 1:
        parser.error("--train-steps-total must be a positive integer; received "
                     f"{args.train_steps_total}")
    if "b" in args.parts and not args.data_dir:
        parser.error("part b needs --data-dir (Penn Treebank), or ptb/ beside the script")
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    start = time.time()
    deadline = start + args.deadline
    _harness.write_json(path, {
        "command": _harness.command_line(__file__),
        "quick": args.quick,
        "gpu": _nvidia_smi(),
        "machine": _harness.machine(),
        "quiet_machine": quiet,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "settings": vars(args),
        "part_a_setting": (
            f"LanguageModel V={args.vocabulary}, 2 × {args.units}, batch {args.batch}, "
            f"window {args.window}, dropout {args.dropout}, IWAEDropoutLoss, Adam; train "
            f"step = median of {args.repeats} fits of {args.train_steps} steps after "
            f"{args.warmup_steps} warm-up steps; evaluation on {args.eval_tokens} tokens, "
            f"batch 1, segments of {args.segment_length} (median of {args.eval_repeats}); "
            "references: Embedding -> LSTM × 2 -> Dense(V), no dropout, Adam, same shapes"
        ),
        "part_b_note": EPOCHS_NOTE if args.train_epochs else BUDGET_NOTE,
    })
    if "a" in args.parts:
        # Absolute deadlines: JAX (compiles) gets the larger first share, and a
        # later backend also gets what an earlier one left.
        weights = [1.5 if b == "jax" else 1.0 for b in args.backends]
        for i, backend in enumerate(args.backends):
            share = args.a_seconds * sum(weights[: i + 1]) / sum(weights)
            worker_deadline = min(start + share, deadline)
            _run_worker("a", backend, args, path, worker_deadline, grace=60.0)
    if "b" in args.parts:
        _run_worker("b", args.paper_backend, args, path, deadline, grace=15.0)
    data = _harness.merge_json(path, "seconds", time.time() - start)
    print_table(data)
    if args.quick:
        print("\n--quick: a check that everything runs; these timings are not to be reported")
    print(f"wrote {path} ({data['seconds'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
