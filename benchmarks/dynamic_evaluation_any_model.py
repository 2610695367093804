"""Dynamic evaluation of a keras-hub GPT-2 and of our recurrent models on PTB (issue 41).

Word-level PTB models of comparable size, trained for the same budget of
training compute (`--train-minutes`, default 60, of the process's CPU time),
are scored on the test split statically and dynamically, with every
adaptation mode of `DynamicEvaluator`. The process runs on one core
(`_harness.run_on_one_core()`: XLA sizes its thread pool to the cores a
process may use; `OMP_NUM_THREADS=1`), so that its CPU time is the work
done, whatever else the machine runs: with a pool of threads, the time they
spend waiting for each other on a busy machine counts too (a first pass of
this benchmark, `dynamic_evaluation_any_model_first_pass.json`, ran so: the
same model got 11 epochs from its 60 CPU-minutes on a busy machine and 17 on
a quieter one). The recorded second pass (`dynamic_evaluation_any_model.json`,
2026-11-29) meant to run one thread with `XLA_FLAGS`
`--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`, its
`settings.threads`; on JAX 0.10.2 these leave XLA's pool of two threads as
it is (measured 2026-12-02), so its CPU-minutes count both pool threads, as
the first pass's did. Since then the process is pinned instead.

| unit | what |
| --- | --- |
| `train:gpt2` | a GPT-2-style keras-hub `GPT2CausalLM` (2 layers, 4 heads, d = 128, 512-wide MLP, context 128), AdamW, windows of 128 tokens |
| `train:mogrifier_rlstm` | our `LanguageModel(cell="mogrifier_rlstm")`, one layer, its units chosen so that its parameters are closest to GPT-2's, AdamW, state carried |
| `train:rlstm` | the same with `cell="rlstm"` |
| `eval:<model>:static` | test perplexity, no adaptation (GPT-2: sliding windows of 128 tokens, segments of `n`) |
| `eval:<model>:full` | every trainable variable adapted (eq. 8, Krause's RMS rule) |
| `eval:<model>:lora` | rank-4 LoRA factors on every Dense / EinsumDense / Embedding |
| `eval:<model>:bitfit` | every bias (every variable whose name ends in `bias`: the recurrent models' `output_bias` too) and normalisation parameter only (a sparse subset) |
| `eval:<model>:lora16` | the same with rank 16 (added 2026-11-29 after rank 4 kept 36–57 % of full's gain: is the rank what limits it?) |
| `eval:<model>:full_sentences` | `full`'s tuned setting with `reset="document"` at every `<eos>`: PTB has no document boundaries, so each sentence is a document — what persisting across the stream is worth |

Each adapting mode is tuned on the first `--tune-tokens` of the validation
split the same way: gradient statistics from 50 training batches, then η on
a log grid at λ = 0 and the segment length `--segment-length` (16), then λ
at the best η, then the segment length (8, 16, 32) at the best (η, λ): a
coordinate search, one axis at a time; a best value at an end of its grid
widens the grid that way (up to four times) and the JSON says whether the
best ended interior. Then the whole test split is scored as one stream with
the tuned setting, and statically with the same segment length (the same
windows: the gain is like for like); the JSON keeps the perplexities, the
seconds, and the wall and CPU ms per token. The `static` unit scores at
`--segment-length`.

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

Wall-clock timings depend on whatever else the machine is doing (the JSON
records the load average); the CPU times of the one core much less, and
the perplexities not at all. Each model is trained and then evaluated before
the next starts, so a finished model's results land early.
"""

import math
import os
import sys
import time
import types

import _harness

_harness.environment("jax")
# One core, so one thread (see above), before JAX and TensorFlow start.
CORES = _harness.run_on_one_core()
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["TF_NUM_INTRAOP_THREADS"] = "1"
sys.path.insert(0, os.path.join(_harness.REPOSITORY, "examples"))
import _quiet  # noqa: E402,F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mogrifier as km  # noqa: E402
from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402
from keras_mogrifier.evaluation import search_dynamic_evaluation  # noqa: E402

REPOSITORY = _harness.REPOSITORY
MODES = ("static", "full", "lora", "bitfit", "full_sentences", "lora16")
LEARNING_RATES = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3]
DECAY_RATES = [0.0, 1e-3, 1e-2, 1e-1]
SEGMENT_LENGTHS = [8, 16, 32]
WIDENINGS = 4
RECURRENT = ("mogrifier_rlstm", "rlstm")
GPT2 = dict(num_layers=2, num_heads=4, hidden_dim=128, intermediate_dim=512,
            max_sequence_length=128, dropout=0.1)


log = _harness.log


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
    parser.add_argument("--models", default="gpt2,mogrifier_rlstm,rlstm")
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


def recurrent_model(name, vocabulary_size, units, batch_size):
    return km.LanguageModel(
        vocabulary_size=vocabulary_size, units=units, num_layers=1, cell=name,
        input_dropout=0.3, state_dropout=0.2, output_dropout=0.3, batch_size=batch_size,
    )


def parameters(model):
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def recurrent_units(name, vocabulary_size, target, batch_size):
    """The units (a multiple of 32) whose parameter count is closest to `target`."""
    best = None
    for units in range(64, 513, 32):
        model = recurrent_model(name, vocabulary_size, units, batch_size)
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
    keras.utils.set_random_seed(len(entry["epochs"]))  # the model's initial weights
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
            target = parameters(gpt2_model(vocabulary_size))
            units = recurrent_units(name, vocabulary_size, target, args.batch_size)
            model = recurrent_model(name, vocabulary_size, units, args.batch_size)
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
        # Every epoch seeded by its number (dropout masks, shuffling): an epoch
        # run after a resume draws what it would have drawn without one.
        keras.utils.set_random_seed(1000 + epoch)
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
        units = record.data["units"][f"train:{name}"]["units"]
        model = recurrent_model(name, vocabulary_size, units, args.batch_size)
        model.build((args.batch_size, None))
    load_kept_weights(model, kept_path(args, name))
    if name in RECURRENT:
        model = model.with_options(batch_size=16)  # statistics batches of 16; scored at 1
    return model


# === Evaluation: tuned on validation, scored on test ===


def evaluator_for(model, name, mode, args, **settings):
    options = dict(segment_length=args.segment_length, **settings)
    if name == "gpt2":
        options["context_length"] = GPT2["max_sequence_length"]
    if mode == "lora":
        options["lora_rank"] = 4
    elif mode == "lora16":
        options["lora_rank"] = 16
    elif mode == "bitfit":
        # Every bias (a name ending in "bias": keras-hub's `bias`, the
        # LanguageModel's `output_bias` and Mogrifier `round_k_bias` too) and
        # every normalisation scale and offset. Until 2026-11-29 12:40 UTC
        # only names equal to "bias": the recurrent models' output and
        # Mogrifier biases were left out (GPT-2's set is the same either way).
        options["variables"] = lambda v: v.trainable and (
            v.name.endswith("bias") or v.name in ("gamma", "beta"))
    return DynamicEvaluator(model, **options)


def statistics(evaluator, corpus):
    """Gradient statistics from 50 training batches of 16, at the evaluator's segment length."""
    evaluator.collect_gradient_statistics(corpus.train, batch_size=16, steps=50)


def tuned(evaluator, corpus, valid, unit, entry, record, longest=None):
    """`(η, λ, n)`: a coordinate search, each axis widened at its grid's ends
    (the segment length up to `longest`, a windowed model's context)."""
    # (η, λ, n) -> validation perplexity; a resumed unit keeps the points it tried.
    tried = {(a, b, int(m)): p for a, b, m, p in entry.get("tried", [])}
    lengths_with_statistics = [evaluator.segment_length]

    def search(points):
        for n in sorted({p[2] for p in points}):
            fresh = [(a, b) for a, b, m in points if m == n and (a, b, n) not in tried]
            if not fresh:
                continue
            if evaluator.segment_length != n or lengths_with_statistics[-1] != n:
                evaluator.segment_length = n
                statistics(evaluator, corpus)
                lengths_with_statistics.append(n)
            try:
                found = search_dynamic_evaluation(evaluator, valid, settings=fresh)["results"]
            except km.DivergenceError:  # every one diverged
                found = [{"learning_rate": a, "decay_rate": b, "perplexity": math.inf}
                         for a, b in fresh]
            for r in found:
                tried[(r["learning_rate"], r["decay_rate"], n)] = r["perplexity"]
            entry["tried"] = [[a, b, m, p] for (a, b, m), p in sorted(tried.items())]
            record.save(unit, entry)
        return min((tried[p], p) for p in points)[1]

    def widen(grid, point, axis):
        """The best value along `axis` through `point`; whether it is interior."""
        grid = list(grid)
        for _ in range(WIDENINGS + 1):
            points = [tuple(v if i == axis else point[i] for i in range(3)) for v in grid]
            value = search(points)[axis]
            if value == grid[0] and grid[0] > 0:
                if axis == 2:
                    if grid[0] // 2 < 1:
                        return value, False
                    grid.insert(0, grid[0] // 2)
                else:
                    grid.insert(0, grid[0] / (grid[1] / grid[0]))
            elif value == grid[-1]:
                if axis == 2 and longest is not None and grid[-1] * 2 > longest:
                    return value, False
                grid.append(grid[-1] * 2 if axis == 2 else grid[-1] * (grid[-1] / grid[-2]))
            else:
                return value, True
        return value, False

    point = (None, 0.0, evaluator.segment_length)
    eta, eta_interior = widen(LEARNING_RATES, point, 0)
    decay, decay_interior = widen(DECAY_RATES, (eta, 0.0, point[2]), 1)
    n, n_interior = widen(SEGMENT_LENGTHS, (eta, decay, point[2]), 2)
    if evaluator.segment_length != n or lengths_with_statistics[-1] != n:
        evaluator.segment_length = n
        statistics(evaluator, corpus)
    entry.update(learning_rate=eta, decay_rate=decay, segment_length=n,
                 valid_perplexity=tried[(eta, decay, n)],
                 interior={"learning_rate": eta_interior, "decay_rate": decay_interior,
                           "segment_length": n_interior})
    return eta, decay, n


def test_with_fallback(evaluator, corpus, test, unit, entry, record, eta, decay):
    """The test pass at the tuned `(η, λ, n)`; if it diverges, the rule stated
    in docs/dynamic-evaluation-any-model.md: record the divergence, then take
    the best validation point with a smaller η, until one finishes.

    Returns `(result, wall seconds, CPU seconds)` of the pass that finished.
    """
    n = evaluator.segment_length
    while True:
        evaluator.learning_rate, evaluator.decay_rate = eta, decay
        try:
            return timed(lambda: evaluator.evaluate(test, verbose=0))
        except km.DivergenceError as error:
            entry.setdefault("diverged_on_test", []).append({
                "learning_rate": eta, "decay_rate": decay, "segment_length": n,
                "token": error.token, "tokens_scored": error.tokens_scored,
                "loss": error.loss})
            record.save(unit, entry)
            log(f"{unit}: test diverged at token {error.token} with eta {eta:g}, "
                f"lambda {decay:g}, n {n}")
        smaller = [(p, (a, b, m)) for a, b, m, p in entry["tried"]
                   if a < eta and math.isfinite(p)]
        if not smaller:
            raise ValueError(f"{unit}: every learning rate tried diverged on test")
        valid_perplexity, (eta, decay, m) = min(smaller)
        if m != n:
            evaluator.segment_length = n = m
            statistics(evaluator, corpus)
        entry.update(learning_rate=eta, decay_rate=decay, segment_length=n,
                     valid_perplexity=valid_perplexity,
                     test_setting="fallback: the best validation point with a smaller "
                                  "learning rate than the one that diverged on test")


def timed(function):
    """`(result, wall seconds, CPU seconds)` of `function()`."""
    start, cpu_start = time.time(), time.process_time()
    result = function()
    return result, time.time() - start, time.process_time() - cpu_start


def evaluate(record, name, mode, corpus, args, vocabulary_size):
    unit = f"eval:{name}:{mode}"
    if record.done(unit):
        return
    model = trained(record, name, corpus, args, vocabulary_size)
    test = corpus.test if args.test_tokens is None else corpus.test[: args.test_tokens + 1]
    valid = corpus.valid[: args.tune_tokens + 1]
    entry = {"environment": environment()}
    kept = record.data["units"].get(unit, {})
    if "tried" in kept:  # an unfinished search: resume it, not redo it
        entry["tried"] = kept["tried"]
    if mode == "static":
        evaluator = evaluator_for(model, name, "full", args)
        entry["segment_length"] = evaluator.segment_length
        entry["valid_perplexity"] = evaluator.evaluate(valid, adapt=False, verbose=0)["perplexity"]
        result, seconds, cpu_seconds = timed(
            lambda: evaluator.evaluate(test, adapt=False, verbose=0))
    elif mode == "full_sentences":
        full = record.data["units"][f"eval:{name}:full"]
        evaluator = evaluator_for(
            model, name, "full", args, learning_rate=full["learning_rate"],
            decay_rate=full["decay_rate"], reset="document", separator=corpus.eos_id,
        )
        evaluator.segment_length = full["segment_length"]
        statistics(evaluator, corpus)
        entry.update(learning_rate=full["learning_rate"], decay_rate=full["decay_rate"],
                     segment_length=full["segment_length"])
        result, seconds, cpu_seconds = timed(lambda: evaluator.evaluate(test, verbose=0))
        entry["static_sentences_perplexity"] = evaluator.evaluate(
            test, adapt=False, verbose=0)["perplexity"]
    else:
        evaluator = evaluator_for(model, name, mode, args)
        statistics(evaluator, corpus)
        entry["adapted_parameters"] = int(sum(np.prod(v.shape) for v in evaluator.adapted_variables()))
        entry["static_valid_perplexity"] = evaluator.evaluate(
            valid, adapt=False, verbose=0)["perplexity"]
        eta, decay, _ = tuned(evaluator, corpus, valid, unit, entry, record,
                              longest=GPT2["max_sequence_length"] if name == "gpt2" else None)
        result, seconds, cpu_seconds = test_with_fallback(
            evaluator, corpus, test, unit, entry, record, eta, decay)
        # The same windows without adaptation: the gain, like for like.
        static, static_seconds, static_cpu = timed(
            lambda: evaluator.evaluate(test, adapt=False, verbose=0))
        entry.update(static_test_perplexity=static["perplexity"],
                     static_ms_per_token=1000 * static_seconds / static["num_tokens"],
                     static_cpu_ms_per_token=1000 * static_cpu / static["num_tokens"])
    entry.update(test_perplexity=result["perplexity"], num_tokens=result["num_tokens"],
                 seconds=seconds, ms_per_token=1000 * seconds / result["num_tokens"],
                 cpu_ms_per_token=1000 * cpu_seconds / result["num_tokens"],
                 finished=True)
    record.save(unit, entry)
    log(f"{unit}: test perplexity {result['perplexity']:.2f}, "
        f"{entry['ms_per_token']:.2f} ms/token ({entry['cpu_ms_per_token']:.2f} CPU)")


def main(argv=None):
    args = parse(argv)
    settings = {k: getattr(args, k) for k in (
        "train_minutes", "tune_tokens", "test_tokens", "segment_length", "batch_size",
        "train_tokens")}
    settings["gpt2"] = GPT2
    settings["threads"] = ("one core" if CORES is not None and len(CORES) == 1
                           else f"cores {sorted(CORES) if CORES else 'all'}")
    settings["segment_lengths"] = SEGMENT_LENGTHS
    record = Record(args.json, settings, args.resume)
    full = load_corpus(args.data_dir)
    corpus = types.SimpleNamespace(
        train=full.train[: args.train_tokens], valid=full.valid, test=full.test,
        eos_id=full.vocabulary.eos_id)
    vocabulary_size = len(full.vocabulary)
    names = args.models.split(",")
    for name in names:  # each model trained, then evaluated, before the next
        train(record, name, corpus, args, vocabulary_size)
        for mode in MODES:
            evaluate(record, name, mode, corpus, args, vocabulary_size)
    log("done")


if __name__ == "__main__":
    main()
