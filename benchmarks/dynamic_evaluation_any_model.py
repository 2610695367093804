"""Dynamic evaluation of a keras-hub GPT-2 and of our RLSTM on PTB (issue 41).

Two word-level PTB models of comparable size, trained for the same budget of
training compute (`--train-minutes`, default 60, of the process's CPU time:
an hour of one core, whatever else the machine runs), are scored on the test split statically and dynamically, with
every adaptation mode of `DynamicEvaluator`:

| unit | what |
| --- | --- |
| `train:gpt2` | a GPT-2-style keras-hub `GPT2CausalLM` (2 layers, 4 heads, d = 128, 512-wide MLP, context 128), AdamW, windows of 128 tokens |
| `train:rlstm` | our `LanguageModel(cell="rlstm")`, one layer, its units chosen so that its parameters are closest to GPT-2's, AdamW, state carried |
| `eval:<model>:static` | test perplexity, no adaptation (GPT-2: sliding windows of 128 tokens, segments of `n`) |
| `eval:<model>:full` | every trainable variable adapted (eq. 8, Krause's RMS rule) |
| `eval:<model>:lora` | rank-4 LoRA factors on every Dense / EinsumDense / Embedding |
| `eval:<model>:bitfit` | the biases and normalisation parameters only (a sparse subset) |
| `eval:<model>:full_sentences` | `full`'s tuned setting with `reset="document"` at every `<eos>`: PTB has no document boundaries, so each sentence is a document — what persisting across the stream is worth |

Each adapting mode is tuned on the first `--tune-tokens` of the validation
split the same way: gradient statistics from 50 training batches, then η on
a log grid at λ = 0, then λ at the best η (`search_dynamic_evaluation`'s
"sequential" strategy); a best value at an end of its grid widens the grid
that way (up to twice) and the JSON says whether the best ended interior.
The segment length is `--segment-length` for every mode (16: Krause et al.
2019 used 128 with a cached memory; ours recomputes the window, see
docs/dynamic-evaluation-any-model.md). Then the whole test split is scored
as one stream with the tuned setting; the JSON keeps the perplexity, the
seconds and ms per token.

Every unit is written to `--json` as it finishes; `--resume` skips finished
units, and training resumes at its last finished epoch (model and optimizer
saved in `--work-dir`, git-ignored, after every epoch). A finished model's
best weights are kept in the repository, in float16
(`benchmarks/results/dynamic_evaluation_any_model/<model>.weights.npz`, about
3 MB each), and every evaluation loads them from there, so the evaluations
can resume on another machine; a training unit marked finished whose kept
weights are missing is trained again.

    KERAS_BACKEND=jax nohup python benchmarks/dynamic_evaluation_any_model.py \\
        --data-dir ../shared/data/ptb --resume >> runs/any_model.log 2>&1 &

Timings are wall-clock on whatever else the machine is doing (the JSON
records the load average): the perplexities do not depend on it.
"""

import math
import os
import sys
import time
import types

import _harness

_harness.environment("jax")
sys.path.insert(0, os.path.join(_harness.REPOSITORY, "examples"))
import _quiet  # noqa: E402,F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mogrifier as km  # noqa: E402
from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402
from keras_mogrifier.evaluation import search_dynamic_evaluation  # noqa: E402

REPOSITORY = _harness.REPOSITORY
MODES = ("static", "full", "lora", "bitfit", "full_sentences")
LEARNING_RATES = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3]
DECAY_RATES = [0.0, 1e-3, 1e-2, 1e-1]
GPT2 = dict(num_layers=2, num_heads=4, hidden_dim=128, intermediate_dim=512,
            max_sequence_length=128, dropout=0.1)


def log(message):
    print(time.strftime("%H:%M:%S"), message, flush=True)


def parse(argv):
    parser = _harness.argument_parser(
        __doc__, data_dir="required",
        json_default=os.path.join(_harness.RESULTS, "dynamic_evaluation_any_model.json"))
    parser.add_argument("--work-dir", default=os.path.join(REPOSITORY, "runs", "any_model"))
    parser.add_argument("--kept-dir", default=os.path.join(
        REPOSITORY, "benchmarks", "results", "dynamic_evaluation_any_model"),
        help="where a finished model's best weights are kept (float16)")
    parser.add_argument("--train-minutes", type=float, default=60.0)
    parser.add_argument("--tune-tokens", type=int, default=8000)
    parser.add_argument("--test-tokens", type=int, default=None,
                        help="score only this many test tokens (default: all)")
    parser.add_argument("--segment-length", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-tokens", type=int, default=None,
                        help="train on only this many tokens (a smoke test; default: all)")
    parser.add_argument("--models", default="gpt2,rlstm")
    parser.add_argument("--resume", action="store_true")
    return parser.parse_args(argv)


class Record(_harness.Record):
    """The JSON: settings and one entry per finished unit, written atomically."""

    def __init__(self, path, settings, resume):
        super().__init__(path, settings, resume, what="benchmark", units={})

    def done(self, unit):
        return unit in self.data["units"] and self.data["units"][unit].get("finished")

    def save(self, unit, entry):
        self.data["units"][unit] = entry
        super().save()


def environment():
    return {"backend": keras.backend.backend(), "load_average": _harness.load_average(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


# === The models ===


def gpt2_model(vocabulary_size):
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=vocabulary_size, **GPT2)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    return model


def rlstm_model(vocabulary_size, units, batch_size):
    return km.LanguageModel(
        vocabulary_size=vocabulary_size, units=units, num_layers=1, cell="rlstm",
        input_dropout=0.3, state_dropout=0.2, output_dropout=0.3, batch_size=batch_size,
    )


def parameters(model):
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def rlstm_units(vocabulary_size, target, batch_size):
    """The units (a multiple of 32) whose RLSTM parameter count is closest to `target`."""
    best = None
    for units in range(64, 513, 32):
        model = rlstm_model(vocabulary_size, units, batch_size)
        model.build((batch_size, None))
        gap = abs(parameters(model) - target)
        if best is None or gap < best[0]:
            best = (gap, units)
    return best[1]


def windows(ids, length, offset):
    """Non-overlapping `(x, y)` windows of `length` tokens from `offset`."""
    count = (len(ids) - 1 - offset) // length
    x = ids[offset : offset + count * length].reshape(count, length)
    y = ids[offset + 1 : offset + 1 + count * length].reshape(count, length)
    return x.astype("int32"), y.astype("int32")


# === Training: a budget of training time, epoch by epoch, resumable ===


def kept_path(args, name):
    return os.path.join(args.kept_dir, f"{name}.weights.npz")


def keep_weights(model, path):
    """Writes `model`'s weights in float16, in `model.weights` order (atomically)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arrays = {f"{i:04d}": keras.ops.convert_to_numpy(v).astype("float16")
              for i, v in enumerate(model.weights)}
    temporary = path + ".tmp.npz"
    np.savez_compressed(temporary, **arrays)
    os.replace(temporary, path)


def load_kept_weights(model, path):
    with np.load(path) as arrays:
        shapes = [tuple(arrays[f"{i:04d}"].shape) for i in range(len(arrays.files))]
        expected = [tuple(v.shape) for v in model.weights]
        if shapes != expected:
            raise ValueError(
                f"Expected {path} to hold weights of the shapes {expected}. Received: {shapes}"
            )
        for i, variable in enumerate(model.weights):
            variable.assign(arrays[f"{i:04d}"].astype(variable.dtype))


def train(record, name, corpus, args, vocabulary_size):
    unit = f"train:{name}"
    if record.done(unit) and os.path.exists(kept_path(args, name)):
        return
    if record.done(unit):
        log(f"{name}: finished before, but its kept weights {kept_path(args, name)} are "
            "missing: training it again")
        record.data["units"].pop(unit)
    directory = os.path.join(args.work_dir, name)
    os.makedirs(directory, exist_ok=True)
    last, best = os.path.join(directory, "last.keras"), os.path.join(directory, "best.weights.h5")
    entry = record.data["units"].get(unit) or {"epochs": [], "train_cpu_seconds": 0.0}
    budget = args.train_minutes * 60
    keras.utils.set_random_seed(len(entry["epochs"]))
    if entry["epochs"] and os.path.exists(last):
        model = keras.saving.load_model(last)
        log(f"{name}: resumed after epoch {len(entry['epochs'])}, {entry['train_cpu_seconds']:.0f} CPU s trained")
    else:
        entry = {"epochs": [], "train_cpu_seconds": 0.0}
        if name == "gpt2":
            model = gpt2_model(vocabulary_size)
            model.compile(
                optimizer=keras.optimizers.AdamW(1e-3, weight_decay=0.01, global_clipnorm=1.0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        else:
            target = record.data["units"]["train:gpt2"]["parameters"]
            units = rlstm_units(vocabulary_size, target, args.batch_size)
            model = rlstm_model(vocabulary_size, units, args.batch_size)
            model.compile(
                optimizer=keras.optimizers.AdamW(2e-3, weight_decay=0.01, global_clipnorm=1.0),
                loss=km.IWAEDropoutLoss(), weighted_metrics=[km.Perplexity()],
            )
            model.build((args.batch_size, None))
            entry["units"] = units
    entry["parameters"] = parameters(model)
    entry.setdefault("environment", []).append(environment())
    record.save(unit, entry)
    valid_x, valid_y = windows(corpus.valid, 128, 0)
    while entry["train_cpu_seconds"] < budget:
        epoch = len(entry["epochs"])
        start, cpu_start = time.time(), time.process_time()
        if name == "gpt2":
            x, y = windows(corpus.train, 128, (epoch * 37) % 128)
            order = np.random.default_rng(epoch).permutation(len(x))
            x, y = x[order], y[order]
            history = model.fit(
                {"token_ids": x, "padding_mask": np.ones_like(x)}, y,
                batch_size=args.batch_size, epochs=1, verbose=0,
            )
            seconds, cpu_seconds = time.time() - start, time.process_time() - cpu_start
            valid = model.evaluate(
                {"token_ids": valid_x, "padding_mask": np.ones_like(valid_x)}, valid_y,
                batch_size=64, verbose=0,
            )
            valid_perplexity = math.exp(valid if np.isscalar(valid) else valid[0])
            train_perplexity = math.exp(history.history["loss"][-1])
        else:
            data = km.data.StreamDataset(corpus.train, batch_size=args.batch_size,
                                         sequence_length=35)
            history = model.fit(data, epochs=epoch + 1, initial_epoch=epoch, verbose=0)
            seconds, cpu_seconds = time.time() - start, time.process_time() - cpu_start
            evaluator = DynamicEvaluator(model.with_options(batch_size=1))
            valid_perplexity = evaluator.evaluate(
                corpus.valid, adapt=False, verbose=0)["perplexity"]
            train_perplexity = float(history.history["perplexity"][-1])
        entry["train_cpu_seconds"] += cpu_seconds
        improved = not entry["epochs"] or valid_perplexity < min(
            e["valid_perplexity"] for e in entry["epochs"])
        if improved:
            model.save_weights(best)
        entry["epochs"].append({"valid_perplexity": valid_perplexity,
                                "train_perplexity": train_perplexity, "seconds": seconds,
                                "cpu_seconds": cpu_seconds})
        model.save(last)
        record.save(unit, entry)
        log(f"{name} epoch {epoch + 1}: valid {valid_perplexity:.2f}"
            f"{' (best)' if improved else ''}, train {train_perplexity:.2f}, {seconds:.0f} s "
            f"({entry['train_cpu_seconds'] / 60:.1f} of {args.train_minutes:.0f} min)")
    entry["best_valid_perplexity"] = min(e["valid_perplexity"] for e in entry["epochs"])
    model.load_weights(best)
    keep_weights(model, kept_path(args, name))
    entry["kept_weights"] = os.path.relpath(kept_path(args, name), REPOSITORY)
    entry["finished"] = True
    record.save(unit, entry)


def trained(record, name, corpus, args, vocabulary_size):
    """The model with its kept (float16) best weights, ready to evaluate."""
    if name == "gpt2":
        model = gpt2_model(vocabulary_size)
    else:
        units = record.data["units"]["train:rlstm"]["units"]
        model = rlstm_model(vocabulary_size, units, args.batch_size)
        model.build((args.batch_size, None))
    load_kept_weights(model, kept_path(args, name))
    if name == "rlstm":
        model = model.with_options(batch_size=16)  # statistics batches of 16; scored at 1
    return model


# === Evaluation: tuned on validation, scored on test ===


def evaluator_for(model, name, mode, args, **settings):
    options = dict(segment_length=args.segment_length, **settings)
    if name == "gpt2":
        options["context_length"] = GPT2["max_sequence_length"]
    if mode == "lora":
        options["lora_rank"] = 4
    elif mode == "bitfit":
        options["variables"] = lambda v: v.trainable and (
            v.name in ("bias", "gamma", "beta") or v.path.endswith(("/bias", "/gamma", "/beta")))
    return DynamicEvaluator(model, **options)


def tuned(evaluator, valid, unit, entry, record):
    """`(η, λ)` from a sequential search with widening at the grid's ends."""
    tried = {}

    def search(learning_rates, decay_rates):
        fresh = [(a, b) for a in learning_rates for b in decay_rates if (a, b) not in tried]
        if fresh:
            found = search_dynamic_evaluation(evaluator, valid, settings=fresh)
            for r in found["results"]:
                tried[(r["learning_rate"], r["decay_rate"])] = r["perplexity"]
            entry["tried"] = [[a, b, p] for (a, b), p in sorted(tried.items())]
            record.save(unit, entry)
        return min((tried[(a, b)], a, b) for a in learning_rates for b in decay_rates)

    def widen(grid, best, other_fixed, axis):
        grid = list(grid)
        for _ in range(2):
            if axis == 0:
                _, a, b = search(grid, [other_fixed])
                value = a
            else:
                _, a, b = search([other_fixed], grid)
                value = b
            if value == grid[0] and grid[0] > 0:
                grid.insert(0, grid[0] / (grid[1] / grid[0]))
            elif value == grid[-1]:
                grid.append(grid[-1] * (grid[-1] / grid[-2]))
            else:
                return value, True
        return value, False

    eta, eta_interior = widen(LEARNING_RATES, None, 0.0, 0)
    decay, decay_interior = widen(DECAY_RATES, None, eta, 1)
    entry.update(learning_rate=eta, decay_rate=decay,
                 interior={"learning_rate": eta_interior, "decay_rate": decay_interior})
    return eta, decay


def evaluate(record, name, mode, corpus, args, vocabulary_size):
    unit = f"eval:{name}:{mode}"
    if record.done(unit):
        return
    model = trained(record, name, corpus, args, vocabulary_size)
    test = corpus.test if args.test_tokens is None else corpus.test[: args.test_tokens + 1]
    entry = {"environment": environment()}
    if mode == "static":
        evaluator = evaluator_for(model, name, "full", args)
        start = time.time()
        result = evaluator.evaluate(test, adapt=False, verbose=0)
    elif mode == "full_sentences":
        full = record.data["units"][f"eval:{name}:full"]
        evaluator = evaluator_for(
            model, name, "full", args, learning_rate=full["learning_rate"],
            decay_rate=full["decay_rate"], reset="document", separator=corpus.eos_id,
        )
        evaluator.collect_gradient_statistics(corpus.train, batch_size=16, steps=50)
        entry.update(learning_rate=full["learning_rate"], decay_rate=full["decay_rate"])
        start = time.time()
        result = evaluator.evaluate(test, verbose=0)
    else:
        evaluator = evaluator_for(model, name, mode, args)
        evaluator.collect_gradient_statistics(corpus.train, batch_size=16, steps=50)
        entry["adapted_parameters"] = int(sum(np.prod(v.shape) for v in evaluator.adapted_variables()))
        eta, decay = tuned(evaluator, corpus.valid[: args.tune_tokens + 1], unit, entry, record)
        evaluator.learning_rate, evaluator.decay_rate = eta, decay
        start = time.time()
        result = evaluator.evaluate(test, verbose=0)
    seconds = time.time() - start
    entry.update(test_perplexity=result["perplexity"], num_tokens=result["num_tokens"],
                 seconds=seconds, ms_per_token=1000 * seconds / result["num_tokens"],
                 finished=True)
    record.save(unit, entry)
    log(f"{unit}: test perplexity {result['perplexity']:.2f}, "
        f"{entry['ms_per_token']:.2f} ms/token")


def main(argv=None):
    args = parse(argv)
    settings = {k: getattr(args, k) for k in (
        "train_minutes", "tune_tokens", "test_tokens", "segment_length", "batch_size",
        "train_tokens")}
    settings["gpt2"] = GPT2
    record = Record(args.json, settings, args.resume)
    full = load_corpus(args.data_dir)
    corpus = types.SimpleNamespace(
        train=full.train[: args.train_tokens], valid=full.valid, test=full.test,
        eos_id=full.vocabulary.eos_id)
    vocabulary_size = len(full.vocabulary)
    names = args.models.split(",")
    for name in names:
        train(record, name, corpus, args, vocabulary_size)
    for name in names:
        for mode in MODES:
            evaluate(record, name, mode, corpus, args, vocabulary_size)
    log("done")


if __name__ == "__main__":
    main()
