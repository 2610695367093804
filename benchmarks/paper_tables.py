"""The papers' comparison at CPU scale: do the better cells beat an LSTM at equal parameters?

Penn Treebank, word level. Every row is a 2-layer residual language model
(Circling Back §3: tied embeddings, cell-output dropout, capped input gate,
forget bias 1) with the same number of parameters (within 3 %: the runner
picks each cell's `units`), the same optimizer (Adam with β₁ = 0, the
Mogrifier paper's, §3.3; the global gradient norm clipped at lamb's 10 on its
loss summed over a window, i.e. 10/T here), the same cosine learning-rate
schedule, batch, window and epoch
budget, and the same tuning effort: a KerasTuner random search (the same
seed, so the same candidate settings for every row) of the learning rate and
the input, cell-output, state and output dropout rates, with the same number
of trials and the same per-trial budget, selected on validation perplexity.
The best trial's setting is then trained for the full budget with each seed
and scored: static test perplexity (temperature tuned on validation, and at
τ = 1 on one stream, like for like with the papers' untuned figures) and
dynamic evaluation (Krause's RMS rule with the RMS-scaled prior, tuned on a
slice of validation).

Rows: `lstm`, `mogrifier_lstm`, `rlstm`, `mogrifier_rlstm`; then, on the
best of these by mean validation perplexity, `BEST+dual` (the Dual head)
and `BEST+samples2` (two dropout samples, the IWAE objective): the Circling
Back ablation.

Everything is written to the JSON at once (every finished trial, every
finished seed); KerasTuner's trials and per-epoch model checkpoints live in
`--work-dir` (git-ignored); `--resume` continues where a run stopped (an
interrupted trial is re-run, an interrupted final training continues from
its last finished epoch).

    # the study (hours: run it in the background)
    KERAS_BACKEND=jax nohup python benchmarks/paper_tables.py \\
        --data-dir ../shared/data/ptb --resume > runs/paper_tables.log 2>&1 &
    # check one row: its first seed, the first epoch of its own schedule
    KERAS_BACKEND=jax python benchmarks/paper_tables.py \\
        --data-dir ../shared/data/ptb --row lstm --epochs 1 --output runs/check
    # the table and the chart from the JSON
    python benchmarks/paper_tables.py --table --figure docs/paper_tables_ptb.png
    # the `paper` preset's rows run on a GPU by benchmarks/gpu.py (part b)
    python benchmarks/paper_tables.py --add-gpu-rows benchmarks/results/gpu/h200_paper_8epochs.json

Without `--data-dir` the package's embedded synthetic corpus is used (for a
smoke run; its perplexities mean nothing for Penn Treebank).
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

_harness.environment("jax", log_level="3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.data import synthetic_corpus  # noqa: E402
from keras_mogrifier.models import LanguageModel  # noqa: E402
from keras_mogrifier.pipeline import run_experiment  # noqa: E402
from keras_mogrifier.pipeline import units as lamb_units  # noqa: E402
from keras_mogrifier.tuning import LanguageModelHyperModel  # noqa: E402
from keras_mogrifier.tuning import build_tuner  # noqa: E402
from keras_mogrifier.tuning import trial_rows  # noqa: E402

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_JSON = os.path.join(
    REPOSITORY, "benchmarks", "results", "paper_tables", "ptb_word.json"
)
DEFAULT_WORK_DIR = os.path.join(REPOSITORY, "runs", "paper_tables")

BASE_ROWS = ("lstm", "mogrifier_lstm", "rlstm", "mogrifier_rlstm")
# The Circling Back ablation, each on the best base row.
ABLATIONS = {"dual": {"dual": True}, "samples2": {"samples": 2}}

# Press & Wolf (2017): a tied 2-layer 200-unit LSTM has 2.65M parameters on
# the 10k-word Penn Treebank vocabulary (the small model of docs/results/equal-parameters.md).
PARAMETERS = 2_650_000
PARAMETER_TOLERANCE = 0.03
# The released 24M PTB Mogrifier: 5 rounds of rank 84 at ~900 units
# (SPEC §7); the rank is scaled with the width here.
MOGRIFIER_ROUNDS = 5
MOGRIFIER_RANK_PER_UNIT = 84 / 900
# The regularisation searched for every row. Table 4 of the Mogrifier paper
# (learning rate 1e-3–4e-3, dropouts up to 0.8–0.95) is for 24M models
# trained for hundreds of epochs; the dropout ranges are cut to where a
# 2.65M model trained for a few epochs can still learn, the same for every
# row (widen a range if a best value sits on its edge).
RANGES = {
    "learning_rate": (1e-3, 4e-3),
    "input_dropout": (0.0, 0.6),
    "cell_output_dropout": (0.0, 0.5),
    "state_dropout": (0.0, 0.5),
    "output_dropout": (0.0, 0.6),
}
# Left out of the search: fixed below or at the LanguageModel default.
NOT_SEARCHED = ("embedding_ratio", "chrono_t_max", "mixture_of_softmaxes",
                "dual_units", "dual_dropout")
# Not Circling Back's RAdam: its rectification is a warm-up of about
# 2/(1 − β₂) = 2000 steps (the step is scaled by r_t ≈ 0.2 at step 100, 0.48
# at 500, 0.65 at 1000, 0.75 at 1660), while a trial here is 1660 steps and a
# final training 4150: it would hold every row's learning rate far below the
# searched one for most of the run.
OPTIMIZER = "adam"
# Adam's ε: Keras's default 1e-7, which every row of the recorded study ran
# with (the hypermodel's default became lamb's 1e-8/T afterwards, see
# docs/units.md); fixed here so that resumed and re-trained rows keep it.
ADAM_EPSILON = 1e-7
LAMB_L2 = 2.5e-4  # lamb's PTB l2_penalty (SPEC §7), on its summed loss
LAMB_CLIP = 10.0  # lamb's max_grad_norm, on its summed loss
DROP_STATE_PROBABILITY = 0.01  # every released lamb config (SPEC §6)
DYNAMIC = {  # the pipeline's dynamic evaluation (RMS + RMS prior, eq. 8)
    "segment_length": 5,
    "learning_rates": (1e-5, 3e-5, 1e-4, 3e-4, 1e-3),
    "decay_rates": (1e-3, 2e-3, 1e-2),
    "tuning_tokens": 10_000,  # --dynamic-tuning-tokens
    "statistics_batches": 300,  # --statistics-batches: 150k training tokens
}


# === Configuration ===


def study_settings(args):
    """The settings every row shares (recorded in the JSON)."""
    return {
        "parameters": args.parameters,
        "parameter_tolerance": PARAMETER_TOLERANCE,
        "num_layers": 2,
        "batch_size": args.batch_size,
        "sequence_length": args.bptt,
        "epochs": args.final_epochs,
        "trial_epochs": args.trial_epochs,
        "trials": args.trials,
        "seeds": args.seeds,
        "tuner": "random",
        "tuner_seed": args.tuner_seed,
        "ranges": {k: list(v) for k, v in RANGES.items()},
        "optimizer": OPTIMIZER,
        "beta_1": 0.0,
        "global_clipnorm": lamb_units.summed_loss_clipnorm(LAMB_CLIP, args.bptt),
        "l2": lamb_units.summed_loss_l2(LAMB_L2, args.bptt),
        "drop_state_probability": DROP_STATE_PROBABILITY,
        "mogrifier_rounds": MOGRIFIER_ROUNDS,
        "mogrifier_rank_per_unit": MOGRIFIER_RANK_PER_UNIT,
        "schedule": "cosine decay to 0 over the run's steps, per step",
        "dynamic_evaluation": dict(
            DYNAMIC, tuning_tokens=args.dynamic_tuning_tokens,
            statistics_batches=args.statistics_batches,
        ),
        "max_tokens": args.max_tokens,
        "backend": keras.backend.backend(),
    }


def mogrifier_rank(units):
    return max(1, int(round(units * MOGRIFIER_RANK_PER_UNIT)))


def model_config(row, units, settings):
    """The fixed `LanguageModel` arguments of `row` at `units`."""
    cell = row["cell"]
    config = {
        "cell": cell,
        "units": units,
        "embedding_dim": units,
        "num_layers": settings["num_layers"],
        "residual": True,
        "tie_embeddings": True,
        "capped_input_gate": True,
        "unit_forget_bias": True,
        "l2": settings["l2"],
        "drop_state_probability": settings["drop_state_probability"],
        "dual": bool(row.get("dual", False)),
        "samples": int(row.get("samples", 1)),
    }
    if cell.startswith("mogrifier"):
        config["mogrifier_rounds"] = settings["mogrifier_rounds"]
        config["mogrifier_rank"] = mogrifier_rank(units)
    return config


def count_parameters(vocabulary_size, config):
    model = LanguageModel(vocabulary_size, batch_size=1, **config)
    model.build((1, None))
    return int(sum(int(np.prod(w.shape)) for w in model.trainable_weights))


def units_for_budget(vocabulary_size, row, settings):
    """The `units` whose model is closest to the parameter budget."""
    target = settings["parameters"]

    def count(units):
        return count_parameters(vocabulary_size, model_config(row, units, settings))

    low, high = 1, 16
    while count(high) < target:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if count(middle) < target:
            low = middle
        else:
            high = middle
    units = min((low, high), key=lambda u: abs(count(u) - target))
    params = count(units)
    if abs(params - target) > settings["parameter_tolerance"] * target:
        raise ValueError(
            f"Expected a model of {target:,} parameters within "
            f"{settings['parameter_tolerance']:.0%} for row {row['name']!r}. "
            f"Received: the closest has {params:,} (units={units})"
        )
    return units, params


def fixed_training(settings, epochs, steps_per_epoch):
    return {
        "optimizer": settings["optimizer"],
        "beta_1": settings["beta_1"],
        "epsilon": ADAM_EPSILON,
        "global_clipnorm": settings["global_clipnorm"],
        "cosine_decay_steps": epochs * steps_per_epoch,
        "jit_compile": "auto",
    }


def hypermodel_for(row, settings, vocabulary_size, epochs, steps_per_epoch):
    fixed = model_config(row, row["units"], settings)
    fixed.update(fixed_training(settings, epochs, steps_per_epoch))
    ranges = {name: None for name in NOT_SEARCHED}
    ranges.update({name: tuple(bounds) for name, bounds in settings["ranges"].items()})
    return LanguageModelHyperModel(
        vocabulary_size,
        batch_size=settings["batch_size"],
        sequence_length=settings["sequence_length"],
        fixed=fixed,
        ranges=ranges,
        max_tokens=settings["max_tokens"],
    )


def steps_per_epoch(corpus, settings):
    tokens = len(corpus.train) - 1
    if settings["max_tokens"]:
        tokens = min(tokens, settings["max_tokens"])
    return tokens // (settings["batch_size"] * settings["sequence_length"])


# === Results file ===


class Study(_harness.Record):
    """The JSON of the study, written after every finished unit (a resumed
    study may run on another backend)."""

    def __init__(self, path, settings, command, resume):
        super().__init__(path, settings, resume, ignore=("backend",), command=command,
                         rows=[])

    def row(self, name):
        for row in self.data["rows"]:
            if row["name"] == name:
                return row
        return None

    def add_row(self, row):
        self.data["rows"].append(row)
        self.save()
        return row


def commit(paths=("keras_mogrifier", "benchmarks/paper_tables.py")):
    """HEAD's commit, with "-dirty" where any of `paths` differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPOSITORY, capture_output=True,
            text=True, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            cwd=REPOSITORY, capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


log = _harness.log


# === Tuning ===


def run_trials(study, row, corpus, args):
    """The row's KerasTuner search, one trial per call, each written at once."""
    settings = study.data["settings"]
    steps = steps_per_epoch(corpus, settings)
    hypermodel = hypermodel_for(
        row, settings, len(corpus.vocabulary), settings["trial_epochs"], steps
    )
    row["searched"] = sorted(hypermodel.search_space)
    directory = os.path.join(args.work_dir, "tuner")
    while len(row["trials"]) < settings["trials"]:
        number = len(row["trials"]) + 1
        tuner = build_tuner(
            hypermodel, "random", max_trials=number, directory=directory,
            project_name=row["name"], seed=settings["tuner_seed"],
        )
        # Each trial's initial weights and dropout masks from its own seed.
        keras.utils.set_random_seed(1000 + number)
        start = time.time()
        epochs = _EpochLine(f"{row['name']} trial {number}")
        tuner.search(
            corpus.train, validation_data=corpus.valid,
            epochs=settings["trial_epochs"], verbose=0, callbacks=[epochs],
        )
        seconds = time.time() - start
        done = {t["trial_id"] for t in row["trials"]}
        for trial in trial_rows(tuner):
            if trial["trial_id"] in done or trial["status"] == "RUNNING":
                continue
            # KerasTuner keeps only the best epoch's objective; the
            # callback saw every epoch (one trial runs per search call).
            curve = epochs.curve or _objective_curve(tuner, trial["trial_id"])
            row["trials"].append(
                {
                    "trial_id": trial["trial_id"],
                    "status": trial["status"],
                    "hyperparameters": trial["values"],
                    "valid_perplexity": trial["score"],
                    "valid_perplexity_by_epoch": curve,
                    "message": trial["message"],
                    "seconds": seconds,
                    "load_average": _harness.load_average()[0],
                }
            )
            row["seconds"]["trials"] += seconds
            log(f"{row['name']} trial {number}: {trial['status']}, valid "
                f"perplexity {trial['score']}, {seconds / 60:.1f} min")
        study.save()
    completed = [t for t in row["trials"] if t["status"] == "COMPLETED"]
    if not completed:
        raise RuntimeError(f"Every trial of row {row['name']!r} failed: {row['trials']}")
    best = min(completed, key=lambda t: t["valid_perplexity"])
    config = hypermodel.configuration(best["hyperparameters"])
    row["best_trial"] = best["trial_id"]
    row["hyperparameters"] = {
        "model": config["model"],
        "training": {k: v for k, v in config["training"].items()
                     if k != "cosine_decay_steps"},
    }
    study.save()


def _objective_curve(tuner, trial_id):
    trial = tuner.oracle.trials[trial_id]
    metrics = trial.metrics
    if not metrics.exists("val_perplexity"):
        return []
    history = metrics.get_history("val_perplexity")
    return [float(o.value[0]) for o in sorted(history, key=lambda o: o.step)]


# Each trial's validation perplexity per epoch, by the `_EpochLine` name:
# KerasTuner runs a deep copy of the callbacks it is given, so the curve
# cannot live in the instance the runner holds.
_CURVES = {}


class _EpochLine(keras.callbacks.Callback):
    def __init__(self, what):
        super().__init__()
        self.what = what
        self.start = None

    @property
    def curve(self):
        return list(_CURVES.get(self.what, []))

    def on_train_begin(self, logs=None):
        _CURVES[self.what] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if "val_perplexity" in logs:
            _CURVES.setdefault(self.what, []).append(float(logs["val_perplexity"]))
        log(f"{self.what} epoch {epoch + 1}: train perplexity "
            f"{float(logs.get('perplexity', math.nan)):.2f}, valid perplexity "
            f"{float(logs.get('val_perplexity', math.nan)):.2f} "
            f"({time.time() - self.start:.0f} s)")


# === Final training ===


class _EpochRecord(keras.callbacks.Callback):
    """Writes each epoch's validation perplexity and time to a JSON file."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.start = None
        self.first_batch_loss = None

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.time()
        self.first_batch_loss = None

    def on_train_batch_end(self, batch, logs=None):
        # Batch 0 of an epoch (a resumed epoch's batches are numbered from
        # the step it resumed at): the loss of the epoch's first update,
        # the epoch boundary's cost (issue 39).
        if batch == 0 and logs and "loss" in logs:
            self.first_batch_loss = float(logs["loss"])

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        records = read_epoch_records(self.path)
        records[str(epoch)] = {
            "valid_perplexity": float(logs.get("val_perplexity", math.nan)),
            "train_perplexity": float(logs.get("perplexity", math.nan)),
            "train_loss": float(logs.get("loss", math.nan)),
            "first_batch_loss": self.first_batch_loss,
            "seconds": time.time() - self.start,
        }
        _harness.write_json(self.path, records, indent=None)


def read_epoch_records(path):
    return _harness.read_json(path, default={})


def train_final(row, corpus, settings, seed, epochs, checkpoint_dir, dynamic,
                reset_state_each_epoch=None):
    """Trains the row's chosen setting with `seed` for `epochs` of its schedule.

    The learning-rate schedule is the row's own (cosine over the full
    budget), so `epochs` below the budget trains its first epochs.
    """
    steps = steps_per_epoch(corpus, settings)
    training = dict(row["hyperparameters"]["training"])
    training.update(
        epochs=epochs,
        cosine_decay_steps=settings["epochs"] * steps,
        eval_batch_size=settings["batch_size"],
    )
    if reset_state_each_epoch is not None:
        training["reset_state_each_epoch"] = reset_state_each_epoch
    os.makedirs(checkpoint_dir, exist_ok=True)
    record = os.path.join(checkpoint_dir, "epochs.json")
    resume = os.path.exists(os.path.join(checkpoint_dir, "progress.json"))
    if not resume:
        for stale in ("epochs.json", "last.keras"):
            if os.path.exists(os.path.join(checkpoint_dir, stale)):
                os.remove(os.path.join(checkpoint_dir, stale))
    # The plain cells have no mogrifier (the preset's values do not apply).
    model = {"mogrifier_rounds": 0, "mogrifier_rank": None}
    model.update(row["hyperparameters"]["model"])
    keras.utils.set_random_seed(seed)
    start = time.time()
    results = run_experiment(
        corpus,
        "tiny",
        model_overrides=model,
        training_overrides=training,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        dynamic=dynamic,
        # The evaluator's own ε (2e-5), as the recorded study ran, and the
        # tuned setting on the whole validation stream too.
        dynamic_options=dict(
            settings["dynamic_evaluation"], epsilon=None, evaluate_valid=True
        ),
        verbose=2,
        log=lambda line: log(f"{row['name']} seed {seed}: {line}") if line else None,
        callbacks=[_EpochRecord(record)],
    )
    records = read_epoch_records(record)
    curve = [records.get(str(e), {}).get("valid_perplexity") for e in range(epochs)]
    boundary = [
        {k: records.get(str(e), {}).get(k) for k in ("first_batch_loss", "train_loss")}
        for e in range(epochs)
    ]
    train_seconds = sum(r["seconds"] for r in records.values())
    tokens = results["train_tokens_per_epoch"] * len(records)
    figures = {
        "seed": seed,
        "epochs_trained": epochs,
        "valid_perplexity_by_epoch": curve,
        "epoch_losses": boundary,
        "reset_state_each_epoch": training.get("reset_state_each_epoch", False),
        "static": {
            "valid": results["valid_perplexity"],
            "test": results["test_perplexity"],
            "temperature": results["temperature"],
            "valid_tau1": results["valid_perplexity_tau1"],
            "test_tau1_one_stream": results["test_perplexity_tau1_one_stream"],
        },
        "dynamic": None,
        "tokens_per_second": tokens / train_seconds if train_seconds else None,
        "train_seconds": train_seconds,
        "seconds": time.time() - start,
        "evaluation_seconds": results["seconds"],
        "load_average": _harness.load_average()[0],
    }
    if "test_dynamic_perplexity" in results:
        figures["dynamic"] = {
            "valid": results.get("valid_dynamic_perplexity"),
            "test": results["test_dynamic_perplexity"],
            "learning_rate": results["dynamic_learning_rate"],
            "decay_rate": results["dynamic_decay_rate"],
        }
    return figures


def summarise(row):
    """The row's figures: means over its seeds, and their spread (max − min)."""
    seeds = row["seeds"]

    def mean_spread(get):
        values = [get(s) for s in seeds]
        values = [v for v in values if v is not None]
        if not values:
            return None, None
        return float(np.mean(values)), float(max(values) - min(values))

    static, dynamic, spread = {}, {}, {}
    for key in ("valid", "test", "valid_tau1", "test_tau1_one_stream"):
        static[key], spread[f"static_{key}"] = mean_spread(lambda s: s["static"][key])
    for key in ("valid", "test"):
        dynamic[key], spread[f"dynamic_{key}"] = mean_spread(
            lambda s: (s["dynamic"] or {}).get(key)
        )
    row["static"] = static
    row["dynamic"] = dynamic if dynamic["test"] is not None else None
    row["spread"] = spread
    row["valid_perplexity_by_epoch"] = seeds[0]["valid_perplexity_by_epoch"]
    row["epochs_trained"] = seeds[0]["epochs_trained"]
    row["tokens_per_second"] = mean_spread(lambda s: s["tokens_per_second"])[0]
    total = row["seconds"]["trials"] + sum(s["seconds"] for s in seeds)
    row["hours"] = total / 3600


# === Rows ===


def new_row(name, base, extra, corpus, settings):
    row = {"name": name, "cell": base, **extra}
    units, params = units_for_budget(len(corpus.vocabulary), row, settings)
    row.update(
        params=params,
        units=units,
        hyperparameters=None,
        trials=[],
        seeds=[],
        seed=settings["seeds"][0],
        seconds={"trials": 0.0},
        complete=False,
        commit=commit(),
    )
    return row


def planned_rows(study):
    """(name, base cell, extra settings) of every row, as far as known."""
    plan = [(name, name, {}) for name in BASE_ROWS]
    base = [study.row(name) for name in BASE_ROWS]
    if all(row is not None and row["complete"] for row in base):
        best = min(base, key=lambda row: row["static"]["valid"])
        for suffix, extra in ABLATIONS.items():
            plan.append((f"{best['name']}+{suffix}", best["cell"], dict(extra)))
    return plan


def run_study(args, corpus):
    settings = study_settings(args)
    study = Study(args.json, settings, args.command, args.resume)
    while True:
        pending = [p for p in planned_rows(study)
                   if study.row(p[0]) is None or not study.row(p[0])["complete"]]
        if args.rows:
            pending = [p for p in pending if p[0] in args.rows]
        if not pending:
            break
        name, base, extra = pending[0]
        row = study.row(name) or study.add_row(
            new_row(name, base, extra, corpus, settings)
        )
        row["command"] = args.command
        log(f"row {name}: {row['params']:,} parameters, units {row['units']}")
        run_trials(study, row, corpus, args)
        for seed in settings["seeds"]:
            if any(s["seed"] == seed for s in row["seeds"]):
                continue
            figures = train_final(
                row, corpus, settings, seed, settings["epochs"],
                os.path.join(args.work_dir, "checkpoints", name, f"seed{seed}"),
                dynamic=True,
            )
            row["seeds"].append(figures)
            row["commit"] = commit()
            summarise(row)
            study.save()
            log(f"row {name} seed {seed}: {json.dumps(figures['static'])} "
                f"dynamic {json.dumps(figures['dynamic'])}")
        row["complete"] = True
        study.save()
        log(f"row {name} complete")
    print_table(study_rows(study.data["rows"]))
    print_gpu_table(study.data["rows"])


def check_row(args, corpus):
    """Re-trains one row's first seed for `--epochs` of its own schedule."""
    data = _harness.read_json(args.json)
    settings = data["settings"]
    rows = {row["name"]: row for row in data["rows"]}
    if rows.get(args.row, {}).get("study") == GPU_STUDY:
        raise ValueError(
            f"Expected a row of the CPU study. Received: --row {args.row!r}, a "
            "GPU row of the `paper` preset: re-run it with benchmarks/gpu.py "
            f"({rows[args.row]['command']!r})"
        )
    if args.row not in rows or rows[args.row].get("hyperparameters") is None:
        raise ValueError(
            f"Expected a row of {args.json} whose tuning is done. Received: "
            f"--row {args.row!r} (rows: {sorted(rows)})"
        )
    recorded = rows[args.row]
    epochs = args.epochs or settings["epochs"]
    if not 1 <= epochs <= settings["epochs"]:
        raise ValueError(
            f"Expected --epochs between 1 and the row's budget "
            f"{settings['epochs']}. Received: --epochs {args.epochs}"
        )
    row = {k: recorded[k] for k in
           ("name", "cell", "params", "units", "hyperparameters", "trials",
            "seed", "commit")}
    row.update(seconds={"trials": 0.0}, command=args.command)
    seed = recorded["seed"] if args.row_seed is None else args.row_seed
    name = f"{args.row}_seed{seed}" + ("_reset" if args.reset_state_each_epoch else "")
    figures = train_final(
        row, corpus, settings, seed, epochs,
        os.path.join(args.work_dir, "checks", name),
        dynamic=not args.no_dynamic,
        reset_state_each_epoch=args.reset_state_each_epoch,
    )
    row["seeds"] = [figures]
    summarise(row)
    row["commit"] = commit()
    row["complete"] = epochs == settings["epochs"]
    # This seed's recorded curve, else the row's (its first seed's).
    curve = next(
        (s.get("valid_perplexity_by_epoch") for s in recorded.get("seeds", [])
         if s.get("seed") == seed), None
    ) or recorded.get("valid_perplexity_by_epoch")
    first = (curve or [None])[0]
    row["recorded_first_epoch_valid_perplexity"] = first
    os.makedirs(args.output, exist_ok=True)
    row["seed"] = seed
    recorded_seed = next(
        (s for s in recorded.get("seeds", []) if s.get("seed") == seed), None
    )
    if recorded_seed is not None:
        row["recorded"] = {
            k: recorded_seed.get(k)
            for k in ("valid_perplexity_by_epoch", "static", "dynamic")
        }
    path = os.path.join(
        args.output,
        f"{args.row}.json" if args.row_seed is None and not args.reset_state_each_epoch
        else f"{name}.json",
    )
    _harness.write_json(path, row, indent=1)
    again = row["valid_perplexity_by_epoch"][0]
    if first:
        log(f"first-epoch validation perplexity: recorded {first:.2f}, "
            f"re-run {again:.2f} ({100 * (again / first - 1):+.2f} %)")
    log(f"wrote {path}")


# === The GPU rows (benchmarks/gpu.py part b) ===

GPU_STUDY = "gpu_paper_preset"


def gpu_rows(path):
    """Rows of the study's schema from one `benchmarks/gpu.py` part-b JSON.

    Each is the `paper` preset's 24M model with one cell, trained on one GPU
    for a fixed budget (minutes or a few epochs, the preset's own schedule
    cut there), untuned and far from converged, scored static at τ = 1:
    `study` marks them so the table and the chart of the CPU rows leave
    them out. Named `paper24m_<cell>_<budget>`.
    """
    data = _harness.read_json(path)
    rows = []
    for backend, result in data.get("part_b", {}).items():
        for run in result.get("rows", []):
            if run.get("test_perplexity_tau1") is None:
                continue  # cut before its evaluation
            if run.get("train_epochs"):
                budget = f"{run['train_epochs']}epochs"
            else:
                budget = f"{round(run['train_seconds_budget'])}s"
            if run.get("train_steps_total"):
                budget = f"{run['train_steps_total']}steps"
            history = run.get("history", {})
            rows.append({
                "name": f"paper24m_{run['cell']}_{budget}",
                "study": GPU_STUDY,
                "cell": run["cell"],
                "params": run["parameters"],
                "units": run["model"]["units"],
                "hyperparameters": None,
                "preset": {"name": "paper", "model": run["model"],
                           "training": run["training"]},
                "trials": [],
                "valid_perplexity_by_epoch": history.get("val_perplexity"),
                "epochs_trained": run["epochs_done"],
                "static": {"valid_tau1": run["valid_perplexity_tau1"],
                           "test_tau1": run["test_perplexity_tau1"]},
                "dynamic": None,
                "tokens_per_second": run["tokens_per_s"],
                "hours": run["train_seconds"] / 3600,
                "epoch_end_seconds": run.get("epoch_end_seconds"),
                "seed": 0,
                "seeds": [],
                "backend": backend,
                "device": data.get("gpu"),
                "complete": True,
                "command": data["command"],
                "source": os.path.relpath(path, os.path.dirname(DEFAULT_JSON)),
                "note": data.get("part_b_note"),
            })
    return rows


def add_gpu_rows(json_path, paths):
    """Adds (or replaces, by name) the GPU rows of `paths` in the study's JSON."""
    data = _harness.read_json(json_path)
    names = {row["name"] for row in data["rows"] if row.get("study") != GPU_STUDY}
    for path in paths:
        for row in gpu_rows(path):
            if row["name"] in names:
                raise ValueError(
                    f"Expected a GPU row name unused by the study's rows. "
                    f"Received: {row['name']!r} from {path}"
                )
            data["rows"] = [r for r in data["rows"] if r["name"] != row["name"]]
            data["rows"].append(row)
            log(f"GPU row {row['name']}: valid {row['static']['valid_tau1']:.1f}, "
                f"test {row['static']['test_tau1']:.1f} (τ = 1)")
    _harness.write_json(json_path, data, indent=1)


def study_rows(rows):
    return [row for row in rows if row.get("study") != GPU_STUDY]


def print_gpu_table(rows):
    rows = [row for row in rows if row.get("study") == GPU_STUDY]
    if not rows:
        return
    print("\nThe `paper` preset (24M) on one GPU, untuned, not converged (τ = 1):")
    print("| row | params | epochs | tokens/s | valid | test |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['name']} | {row['params']:,} | {row['epochs_trained']:.2f} | "
              f"{_f(row['tokens_per_second'], 0)} | {_f(row['static']['valid_tau1'])} | "
              f"{_f(row['static']['test_tau1'])} |")


# === Table and figure ===


def _f(value, digits=1):
    return "—" if value is None else f"{value:.{digits}f}"


def print_table(rows):
    print("| row | params | units | trials | static valid | static test | "
          "test τ=1, 1 stream | dynamic valid | dynamic test | spread (static test) | "
          "tokens/s | hours | complete |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
          "---: | ---: | --- |")
    for row in rows:
        static = row.get("static") or {}
        dynamic = row.get("dynamic") or {}
        spread = (row.get("spread") or {}).get("static_test")
        print(
            f"| {row['name']} | {row['params']:,} | {row['units']} | "
            f"{len(row['trials'])} | {_f(static.get('valid'))} | "
            f"{_f(static.get('test'))} | {_f(static.get('test_tau1_one_stream'))} | "
            f"{_f(dynamic.get('valid'))} | {_f(dynamic.get('test'))} | "
            f"{_f(spread, 2)} | {_f(row.get('tokens_per_second'), 0)} | "
            f"{_f(row.get('hours'), 2)} | {'yes' if row['complete'] else 'no'} |"
        )


def draw_figure(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("static")]
    names = [r["name"] for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
    width = 0.38
    for offset, kind, colour in ((-width / 2, "static", "#4c72b0"),
                                 (width / 2, "dynamic", "#dd8452")):
        means = [((r.get(kind) or {}).get("test") or np.nan) for r in rows]
        lows, highs = [], []
        for r, m in zip(rows, means):
            values = [(s.get(kind) or {}).get("test") for s in r["seeds"]]
            values = [v for v in values if v is not None] or [m]
            lows.append(m - min(values))
            highs.append(max(values) - m)
        bars = ax.bar(x + offset, means, width, yerr=[lows, highs], capsize=3,
                      color=colour, label=f"{kind} test")
        for bar, m, high in zip(bars, means, highs):
            if np.isfinite(m):  # above the seeds' bar
                ax.annotate(f"{m:.1f}", (bar.get_x() + bar.get_width() / 2, m + high),
                            xytext=(0, 3), textcoords="offset points",
                            ha="center", fontsize=8)
    finite = [v for r in rows for k in ("static", "dynamic")
              for v in [((r.get(k) or {}).get("test"))] if v]
    if finite:
        ax.set_ylim(min(finite) * 0.9, max(finite) * 1.05)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("test perplexity\n(mean over seeds; bars: min–max)")
    ax.set_title("Penn Treebank, equal parameters and equal tuning")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"figure drawn to {path}")


# === Command line ===


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data-dir", help="directory of ptb.{train,valid,test}.txt[.gz]; "
                        "without it, the embedded synthetic corpus (smoke runs)")
    parser.add_argument("--json", default=DEFAULT_JSON, help="the study's results")
    parser.add_argument("--work-dir", default=DEFAULT_WORK_DIR,
                        help="KerasTuner trials and checkpoints (git-ignored)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the study recorded in --json")
    parser.add_argument("--rows", nargs="+", help="run only these rows")
    parser.add_argument("--row", help="re-train this recorded row (first seed) into --output")
    parser.add_argument("--epochs", type=int,
                        help="with --row: epochs of the row's own schedule to train")
    parser.add_argument("--output", help="with --row: directory for ROW.json")
    parser.add_argument("--no-dynamic", action="store_true",
                        help="with --row: skip dynamic evaluation")
    parser.add_argument("--row-seed", type=int,
                        help="with --row: train this seed (default: the row's first)")
    parser.add_argument("--reset-state-each-epoch", action="store_true", default=None,
                        help="with --row: restart the streams and zero the state at "
                        "each epoch, as the recorded study trained (default: carried)")
    parser.add_argument("--table", action="store_true", help="print the table of --json")
    parser.add_argument("--figure", help="draw the test-perplexity chart of --json here")
    parser.add_argument("--add-gpu-rows", nargs="+", metavar="GPU_JSON",
                        help="add the rows of benchmarks/gpu.py part-b JSONs to --json "
                        "(named paper24m_<cell>_<budget>; left out of the table's "
                        "CPU rows and the chart)")
    study = parser.add_argument_group("study settings (recorded; --resume checks them)")
    study.add_argument("--parameters", type=int, default=PARAMETERS)
    study.add_argument("--batch-size", type=int, default=32)
    study.add_argument("--bptt", type=int, default=35)
    study.add_argument("--final-epochs", type=int, default=5)
    study.add_argument("--trial-epochs", type=int, default=2)
    study.add_argument("--trials", type=int, default=4)
    study.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    study.add_argument("--tuner-seed", type=int, default=1)
    study.add_argument("--max-tokens", type=int,
                       help="training tokens per epoch (smoke runs)")
    study.add_argument("--dynamic-tuning-tokens", type=int,
                       default=DYNAMIC["tuning_tokens"],
                       help="validation tokens that tune dynamic evaluation")
    study.add_argument("--statistics-batches", type=int,
                       default=DYNAMIC["statistics_batches"],
                       help="training batches (100 streams x 5 tokens) of the "
                       "gradient statistics")
    args = parser.parse_args(argv)
    for name in ("parameters", "batch_size", "bptt", "final_epochs", "trial_epochs",
                 "trials", "dynamic_tuning_tokens", "statistics_batches"):
        value = getattr(args, name)
        if value < 1:
            parser.error(f"Expected --{name.replace('_', '-')} to be a positive "
                         f"integer. Received: {value}")
    if args.row and not args.output:
        parser.error("Expected --output with --row. Received: no --output")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"Expected distinct --seeds. Received: {args.seeds}")
    args.command = "KERAS_BACKEND={} python benchmarks/paper_tables.py {}".format(
        keras.backend.backend(), " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    )
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.table or args.figure:
        rows = _harness.read_json(args.json)["rows"]
        if args.table:
            print_table(study_rows(rows))
            print_gpu_table(rows)
        if args.figure:
            draw_figure(study_rows(rows), args.figure)
        return
    if args.add_gpu_rows:
        add_gpu_rows(args.json, args.add_gpu_rows)
        return
    if args.data_dir:
        corpus = load_corpus(args.data_dir)
    else:
        corpus = synthetic_corpus(train_tokens=20_000, valid_tokens=1_500,
                                  test_tokens=1_500)
    if args.row:
        check_row(args, corpus)
    else:
        run_study(args, corpus)


if __name__ == "__main__":
    main()
