"""The cells at convergence on Penn Treebank: each tuned for itself, trained to its plateau.

The second study of the cells at 2.65M parameters (issue 40), after the
5-epoch one of `paper_tables.py`: the same model (2 residual layers, tied
embeddings, cell-output dropout, capped input gate, forget bias 1, the
`units` of each cell picked for 2.65M parameters ± 3 %), trained the way the
authors train — the state carried across epochs (lamb), Rectified Adam with
β₁ = 0, divergence recovery and Two-Tailed Averaging at a constant learning
rate (Circling Back §5) — until validation stops improving.

**Tuning, the same for every cell.** `CANDIDATES` settings of the learning
rate and the four dropout rates, drawn once by Latin hypercube sampling from
`RANGES` (the same settings for every cell: the same search). Successive
halving on validation perplexity (of the weights the averaging uses): all
candidates train `RUNGS[0]` epochs, the better half goes on to
`RUNGS[1]`, the better half of those trains to its plateau or
`MAX_EPOCHS`, and the better of those two there wins — the last ranking is
at half the seeds' budget. The first cut is the cheap one; a candidate
the first cut drops is reported with its curve.

**Convergence.** An epoch is a pass over the training text (the streams go
on reading it, the state carried). Training stops when validation perplexity
has not improved by `MIN_DELTA` for `PATIENCE` epochs, or at the run's cap,
which the JSON then says (`stopped_at_max_epochs`): `MAX_EPOCHS` for the
final ranking, `SEED_CAP_FACTOR` times that for the winner's seeds, so that
the final ranking is at half the seeds' budget and the plateau rule, not
the cap, ends them; the weights of the epoch with the lowest
validation perplexity — those validation scored: Two-Tailed Averaging's
long average once it uses it, the raw weights before — are kept
(`best.weights.npz` in the run's folder).

**Seeds.** Every candidate trains with seed 1 (the same initial weights and
dropout draws); the winner's seed-1 run is its first seed (it goes on from
its last ranked epoch to its plateau or the seeds' cap), seeds 2 and 3
are trained from scratch. The first seed was selected on its own validation
curve (test never is), which the docs say beside the spread. A seed is
tested as soon as its training ends (static, then dynamic evaluation), and
its best weights are copied in float16 to `<output>/<row>/weights/` — kept
with the results, so that a finished seed outlives the ignored `--work-dir`
(a seed whose weights went with it before its test trains again; its
record stays under `earlier_attempts`). The best seed on validation is
saved as `<output>/<row>/best_model.keras` (float16 weights, loaded with
`keras.saving.load_model` into float32 variables on every backend).

Every finished epoch goes into the row's JSON at once
(`benchmarks/results/convergence/<row>.json`); every run keeps a
`TrainingCheckpoint` in `--work-dir` every epoch end and every
`--checkpoint-every` steps, and `--resume` continues each run at the step
it stopped, exactly as the uninterrupted run would have gone. The work
folder is outside the checkout by default (`~/.cache/keras-mogrifier/
convergence`, under `$XDG_CACHE_HOME` when set), so that a checkout
cloned again on the same machine resumes its runs. A run whose
checkpoint is gone (resumed on another machine) trains again from epoch 1;
the epochs it had recorded stay in its JSON under `earlier_attempts`. One row per
process, and one row finished before the next starts (issue 40), in `ROWS`'
order; `--jobs N` trains N runs of the row at once, each worker on a CPU
core of its own while one is free (two side by side on 2 cores: 1.10× the
steps of two sharing both, `convergence_cost.py`).

    # a row, in the background, resumable (hours to days on a CPU)
    KERAS_BACKEND=jax nohup python benchmarks/convergence.py \\
        --data-dir ../shared/data/ptb --row lstm --resume \\
        > runs/convergence_lstm.log 2>&1 &
    # (with --resume a finished row is passed over, so a loop over ROWS
    # continues the study wherever it stands)
    # the tables (finished rows over their seeds, every candidate's ranks,
    # every run), and every run's validation curve
    python benchmarks/convergence.py --table
    python benchmarks/convergence.py --plot docs/convergence_curves.png

Without `--data-dir` the package's embedded synthetic corpus is used (a
smoke run; its perplexities mean nothing for Penn Treebank).
"""

import hashlib
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

_harness.environment("jax", log_level="3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import paper_tables  # noqa: E402

from keras_mogrifier.backend import get_backend_module  # noqa: E402
from keras_mogrifier.callbacks import TwoTailedAveraging  # noqa: E402
from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.data import synthetic_corpus  # noqa: E402
from keras_mogrifier.evaluation import DivergenceError  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402
from keras_mogrifier.pipeline import language_modeling as lm  # noqa: E402
from keras_mogrifier.pipeline import units as lamb_units  # noqa: E402
from keras_mogrifier.pipeline.presets import TRAINING_DEFAULTS  # noqa: E402

REPOSITORY = paper_tables.REPOSITORY
DEFAULT_OUTPUT = os.path.join(REPOSITORY, "benchmarks", "results", "convergence")
# The runs' checkpoints live outside the checkout, in the user's cache
# folder: a checkout is re-cloned or replaced more often than the machine
# it is on (on 2026-12-03 this project's checkout was recreated while the
# machine and its home folder stayed, and the seeds' checkpoints in the
# checkout's ignored `runs/` went with it, at epoch 48).
def default_work_dir():
    """`$XDG_CACHE_HOME/keras-mogrifier/convergence`, or under `~/.cache`."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "keras-mogrifier", "convergence")


DEFAULT_WORK_DIR = default_work_dir()


def stored_path(path):
    """`path` as a run's JSON records it: relative to the repository when
    inside it, else absolute with the home folder written `~`."""
    path = os.path.abspath(path)
    if os.path.commonpath([path, REPOSITORY]) == REPOSITORY:
        return os.path.relpath(path, REPOSITORY)
    home = os.path.expanduser("~")
    if os.path.commonpath([path, home]) == home and home != os.sep:
        return os.path.join("~", os.path.relpath(path, home))
    return path


def recorded_path(stored):
    """The file a path written by `stored_path` names on this machine."""
    return os.path.join(REPOSITORY, os.path.expanduser(stored))

ROWS = ("lstm", "mogrifier_rlstm", "mogrifier_lstm", "rlstm")
CANDIDATES = 8
CANDIDATE_SEED = 40  # the Latin hypercube's seed: the same draw for every row
RUNGS = (6, 12)  # successive halving: epochs at the first and second cut
PATIENCE = 3  # epochs without an improvement of MIN_DELTA: the plateau
MIN_DELTA = 0.1  # validation perplexity
MAX_EPOCHS = 80  # the final ranking's budget
# The seeds' cap: twice the final ranking's budget. Raised from 80 (the
# same cap for both) on 2026-11-30, before any seed had finished: both LSTM
# finalists were still improving by 0.05 an epoch at 80 (candidate 6's last
# ten epochs 0.049 an epoch, candidate 5's 0.054), so the cap, not the
# plateau rule, would have ended every seed. Extrapolated from their epochs
# 30–80, the rate falls below the rule's 0.1 in 3 epochs at about epoch
# 95–105.
SEED_CAP_FACTOR = 2
SEEDS = (1, 2, 3)
# The searched ranges contain the published settings: the Mogrifier paper's
# released PTB configuration (lr 2.3e-3; dropout input/inter-layer/state/
# output .73/.29/.39/.72, SPEC §7) and its Table 4 learning rates
# 1e-3–4e-3; Circling Back's RAdam "allows slightly higher learning rates"
# (§5). Learning rate log-uniform, dropout rates uniform.
RANGES = {
    "learning_rate": (7e-4, 5e-3),
    "input_dropout": (0.0, 0.75),
    "cell_output_dropout": (0.0, 0.5),
    "state_dropout": (0.0, 0.5),
    "output_dropout": (0.0, 0.75),
}
LOG_SCALE = ("learning_rate",)
# Dynamic evaluation (Krause's RMS rule with the RMS-scaled prior, eq. 8, the
# pipeline's): η × λ searched jointly, η over more than two decades, λ down
# to 1e-4; a best value on the grid's edge widens the grid that way (by the
# grid's own step, up to DYNAMIC_WIDEN times).
DYNAMIC_LEARNING_RATES = (3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
DYNAMIC_DECAY_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
DYNAMIC_WIDEN = 2
DYNAMIC_SEGMENT = 5
DYNAMIC_STATISTICS_BATCHES = 300  # of 100 streams × 5 tokens: 150k training tokens
# The validation slice the search ranks on: doubled (up to all of
# validation) until the best setting beats each grid neighbour by at least
# DYNAMIC_SEPARATION standard errors of the mean per-token difference
# (batch means over DYNAMIC_BLOCK tokens, for the losses' autocorrelation).
DYNAMIC_SLICE_TOKENS = 20_000
DYNAMIC_SEPARATION = 2.0
DYNAMIC_BLOCK = 500
BATCH_SIZE = 32  # as the 5-epoch study (issue 28)
# Settings added to the study after rows had started: a row recorded
# without one takes on the command's value.
ADDED_SETTINGS = ("dynamic_evaluation", "seed_max_epochs")
SEQUENCE_LENGTH = 35
AVERAGING_FREQUENCY = 1000  # Two-Tailed Averaging's E (Circling Back §5)


# === Configuration ===


def study_settings(args):
    """What every row shares (recorded in each row's JSON)."""
    return {
        "parameters": args.parameters,
        "parameter_tolerance": paper_tables.PARAMETER_TOLERANCE,
        "num_layers": 2,
        "batch_size": args.batch_size,
        "sequence_length": args.bptt,
        "optimizer": "radam",
        "beta_1": 0.0,
        "epsilon": paper_tables.ADAM_EPSILON,
        "global_clipnorm": lamb_units.summed_loss_clipnorm(paper_tables.LAMB_CLIP, args.bptt),
        "l2": lamb_units.summed_loss_l2(paper_tables.LAMB_L2, args.bptt),
        "drop_state_probability": paper_tables.DROP_STATE_PROBABILITY,
        "mogrifier_rounds": paper_tables.MOGRIFIER_ROUNDS,
        "mogrifier_rank_per_unit": paper_tables.MOGRIFIER_RANK_PER_UNIT,
        "schedule": "constant learning rate; divergence recovery (×0.9); "
        f"Two-Tailed Averaging every {AVERAGING_FREQUENCY} steps",
        "state": "carried across epochs (lamb), streams jittered ±100 lines",
        "candidates": args.candidates,
        "candidate_seed": CANDIDATE_SEED,
        "ranges": {k: list(v) for k, v in RANGES.items()},
        "log_scale": list(LOG_SCALE),
        "rungs": list(args.rungs),
        "patience": PATIENCE,
        "min_delta": MIN_DELTA,
        "max_epochs": args.max_epochs,
        "seed_max_epochs": args.seed_max_epochs,
        "seeds": list(args.seeds),
        "max_tokens": args.max_tokens,
        "dynamic_evaluation": {
            "rule": "RMS with the RMS-scaled prior (Krause eq. 8), the evaluator's ε",
            "learning_rates": list(args.dynamic_learning_rates),
            "decay_rates": list(args.dynamic_decay_rates),
            "widen": DYNAMIC_WIDEN,
            "segment_length": DYNAMIC_SEGMENT,
            "statistics_batches": args.dynamic_statistics_batches,
            "statistics_batch": args.dynamic_statistics_batch,
            "slice_tokens": args.dynamic_slice_tokens,
            "separation": DYNAMIC_SEPARATION,
            "block": args.dynamic_block,
        },
    }


def latin_hypercube(ranges, count, seed, log_scale=()):
    """`count` settings, each range cut in `count` equal strata and every
    stratum used once per dimension (log-uniform for `log_scale`)."""
    rng = np.random.default_rng(seed)
    settings = [{} for _ in range(count)]
    for name in sorted(ranges):
        low, high = ranges[name]
        strata = (rng.permutation(count) + rng.uniform(size=count)) / count
        for setting, u in zip(settings, strata):
            if name in log_scale:
                value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
            else:
                value = low + u * (high - low)
            setting[name] = float(value)
    return settings


def row_spec(name):
    cell = name.split("+")[0]
    if cell not in paper_tables.BASE_ROWS:
        raise ValueError(
            f"Expected a row among {list(ROWS)}. Received: row={name!r}"
        )
    return {"name": name, "cell": cell}


def run_config(row, candidate, settings):
    """The `LanguageModel` arguments and the training settings of a run."""
    model = paper_tables.model_config(row, row["units"], settings)
    if not row["cell"].startswith("mogrifier"):
        model.update(mogrifier_rounds=0, mogrifier_rank=None)
    for name in ("input_dropout", "cell_output_dropout", "state_dropout",
                 "output_dropout"):
        model[name] = candidate[name]
    training = dict(TRAINING_DEFAULTS)
    training.update(
        batch_size=settings["batch_size"],
        sequence_length=settings["sequence_length"],
        eval_batch_size=settings["batch_size"],
        optimizer=settings["optimizer"],
        learning_rate=candidate["learning_rate"],
        beta_1=settings["beta_1"],
        epsilon=settings["epsilon"],
        global_clipnorm=settings["global_clipnorm"],
        two_tailed_averaging=True,
        averaging_frequency=AVERAGING_FREQUENCY,
        divergence_recovery=True,
        max_tokens=settings["max_tokens"],
    )
    return model, training


# === Records ===


def data_hash(data_dir):
    """SHA-256 of the corpus files (name and bytes, sorted by name)."""
    if data_dir is None:
        return "synthetic"
    digest = hashlib.sha256()
    for name in sorted(os.listdir(data_dir)):
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            digest.update(name.encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


# What a run's code is: the commit is marked "-dirty" when any of these
# differs from it.
COMMIT_PATHS = ("keras_mogrifier", "benchmarks/convergence.py",
                "benchmarks/paper_tables.py", "benchmarks/_harness.py")


def environment():
    """Where a unit ran: commit, versions, device."""
    versions = _harness.versions()
    devices = versions.pop("devices", None)
    backend = keras.backend.backend()
    if devices:
        device = devices[0]
    else:  # TensorFlow: `_harness.versions` lists no devices
        import tensorflow as tf
        device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    versions["numpy"] = np.__version__
    if backend == "jax":
        import jaxlib

        versions["jaxlib"] = jaxlib.__version__
    found = _harness.machine()
    return {
        "commit": paper_tables.commit(paths=COMMIT_PATHS),
        "backend": backend,
        "versions": versions,
        "device": device,
        "host": found["host"],
        "processor": found["processor"],
        "platform": found["platform"],
        "cpu_count": found["cpus"],
        "cpus_usable": found["cpus_usable"],
        # How the process's allocator maps memory (`_harness.HUGE_PAGE_TUNABLE`).
        "glibc_tunables": os.environ.get(_harness.TUNABLES_VARIABLE, ""),
    }


class RowRecord:
    """A row's JSON (`<output>/<row>.json`: settings, candidates, cuts,
    winner, seeds, summary) and one JSON per run (`<output>/<row>/<run>.json`:
    its epochs, best, test), each written with a temporary name and a rename.

    Only the process that runs the row writes the row's JSON; a worker
    (`--run`, started by `--jobs`) writes its run's JSON only.
    """

    def __init__(self, path, settings, resume, worker=False):
        self.path = path
        self.run_dir = path[: -len(".json")]
        self.worker = worker
        self.trained_epochs = 0
        self._runs = {}
        if (resume or worker) and os.path.exists(path):
            self.data = _harness.read_json(path)
            recorded = self.data["settings"]
            current = json.loads(json.dumps(settings))
            # Settings of a stage after training, added to the study later:
            # a row trained before takes them on.
            for key in ADDED_SETTINGS:
                if key not in recorded and key in current:
                    recorded[key] = current[key]
            changed = _harness.changed_settings(recorded, current)
            if changed:
                raise ValueError(
                    f"Expected the settings recorded in {path} to resume that "
                    f"row. Received different values for: {changed}"
                )
            # Written before the runs had files of their own.
            for name, entry in self.data.pop("runs", {}).items():
                if not os.path.exists(self._run_path(name)):
                    self._runs[name] = entry
                    self.save_run(name)
        elif worker:
            raise ValueError(
                f"Expected the row's JSON {path} (written by the process that "
                "runs the row) for a worker run. Received: no such file"
            )
        elif os.path.exists(path):
            raise ValueError(
                f"Expected --resume to continue the row recorded in {path} (or "
                "another --output for a new study). Received: no --resume; "
                "nothing was changed"
            )
        else:
            self.data = {"settings": settings, "commands": []}

    def _run_path(self, name):
        return os.path.join(self.run_dir, f"{name}.json")

    def run(self, name):
        if name not in self._runs:
            path = self._run_path(name)
            self._runs[name] = _harness.read_json(path, default={"epochs": []})
        return self._runs[name]

    def reload_runs(self):
        """Reads the runs' files again (after workers wrote them)."""
        self._runs = {}

    def save_run(self, name):
        _write_json(self._run_path(name), self.run(name))

    def save(self):
        if not self.worker:
            _write_json(self.path, self.data)


def load_row(path):
    """A row's JSON with its runs under `runs` (for tables and tests)."""
    data = _harness.read_json(path)
    runs = dict(data.get("runs", {}))
    directory = path[: -len(".json")]
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json"):
                runs[name[: -len(".json")]] = _harness.read_json(
                    os.path.join(directory, name))
    data["runs"] = runs
    return data


def _write_json(path, data):
    _harness.write_json(path, data, indent=1)


log = paper_tables.log


# === One run, to a number of epochs or its plateau ===


class Plateau(keras.callbacks.Callback):
    """Keeps the best-validated weights and stops at the plateau.

    Put it before `TwoTailedAveraging` in the callbacks: at the end of each
    epoch's validation it copies the weights validation scored (the average
    that callback loaded, if it uses one) and, if the epoch's validation
    perplexity is the lowest so far, writes them to `path` (atomically):
    the kept weights are always those of the best epoch, the one a ranking
    by the lowest validation perplexity reads. The patience counts epochs
    since the last improvement of at least `min_delta` (`reference`: the
    validation perplexity that improvement reached), as Keras's
    `EarlyStopping` counts them. Its counters are saved and restored by a
    `TrainingCheckpoint`.
    """

    def __init__(self, path, patience, min_delta, on_epoch=None):
        super().__init__()
        self.path = path
        self.patience = patience
        self.min_delta = min_delta
        self.on_epoch = on_epoch
        self.best = math.inf
        self.best_epoch = None
        self.reference = math.inf
        self.wait = 0
        self._validated = None

    def get_resume_state(self):
        def finite(value):
            return None if math.isinf(value) else value

        return {"best": finite(self.best), "best_epoch": self.best_epoch,
                "reference": finite(self.reference), "wait": self.wait}, []

    def set_resume_state(self, state, arrays):
        self.best = math.inf if state["best"] is None else state["best"]
        self.best_epoch = state["best_epoch"]
        # A checkpoint written before `reference` existed: the best was
        # updated only by improvements of `min_delta`, so it is the reference.
        reference = state.get("reference", state["best"])
        self.reference = math.inf if reference is None else reference
        self.wait = state["wait"]

    @property
    def converged(self):
        return self.wait >= self.patience

    def on_test_end(self, logs=None):
        get_backend_module().sync_training_state(self.model)
        self._validated = [keras.ops.convert_to_numpy(w) for w in self.model.weights]

    def on_epoch_end(self, epoch, logs=None):
        value = float((logs or {}).get("val_perplexity", math.nan))
        improved = value < self.best
        if improved:
            save_weights(self.path, self._validated)
            self.best, self.best_epoch = value, epoch
        if value < self.reference - self.min_delta:
            self.reference, self.wait = value, 0
        elif math.isfinite(value):
            self.wait += 1
        if self.on_epoch is not None:
            self.on_epoch(epoch, logs or {}, improved)
        if self.converged:
            self.model.stop_training = True


def save_weights(path, arrays):
    """`arrays` (every weight of a model, in `model.weights` order) to an
    `.npz` file, atomically (a temporary name, then a rename)."""
    temporary = path + ".partial.npz"
    np.savez(temporary, **{f"w{i}": a for i, a in enumerate(arrays)})
    os.replace(temporary, path)


def read_weights(path):
    """The arrays `save_weights` wrote to `path`, in order."""
    with np.load(path) as data:
        return [data[f"w{i}"] for i in range(len(data.files))]


def load_weights(model, path):
    arrays = read_weights(path)
    if len(arrays) != len(model.weights):
        raise ValueError(
            f"Expected {len(model.weights)} weights in {path}. Received: {len(arrays)}"
        )
    for variable, value in zip(model.weights, arrays):
        if value.dtype == np.float16:  # a kept copy
            value = value.astype(keras.backend.standardize_dtype(variable.dtype))
        variable.assign(value)


def start_again(entry, why):
    """Moves what a run recorded under `earlier_attempts` (with `why`), so
    that it trains again from epoch 1."""
    attempt = {key: entry.pop(key) for key in (
        "epochs", "best_valid_perplexity", "best_epoch", "converged",
        "stopped_at_max_epochs", "epoch_cap", "kept_weights_epoch", "static",
        "dynamic_search") if key in entry}
    attempt["why"] = why
    attempt["environment"] = entry.pop("environment", [])
    entry.setdefault("earlier_attempts", []).append(attempt)
    entry["epochs"] = []


def kept_weights_path(record, name):
    """Where a seed's best weights are kept in float16 (committed with the
    results, so that a finished seed survives the loss of `--work-dir`)."""
    return os.path.join(record.run_dir, "weights", f"{name}.float16.npz")


def keep_weights(record, name):
    """Writes the float16 copy of a run's best weights, again whenever its
    best epoch has changed since the last copy (the winner goes on training
    as a seed after the copy made when it won; a run trains again)."""
    entry = record.run(name)
    path = kept_weights_path(record, name)
    epoch = entry.get("best_epoch")
    if not os.path.exists(path) or entry.get("kept_weights_epoch") != epoch:
        arrays = read_weights(recorded_path(entry["weights"]))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_weights(path, [a.astype("float16") if a.dtype == np.float32 else a
                            for a in arrays])
    entry["kept_weights"] = os.path.relpath(path, REPOSITORY)
    entry["kept_weights_epoch"] = epoch
    record.save_run(name)


def save_float16_model(model, path):
    """Saves `model` as a `.keras` file with its float32 weights stored in
    float16 (half the size; the saved model of a row's best seed).

    `keras.saving.load_model(path)` reads it back on every backend into the
    model's own float32 variables (Keras casts each stored array to its
    variable's dtype), the values rounded to float16: what the float16
    copy of the weights holds. Written with a temporary name, then renamed.
    """
    import tempfile
    import zipfile

    import h5py

    def copy(source, target):
        for key, value in source.attrs.items():
            target.attrs[key] = value
        for key, item in source.items():
            if isinstance(item, h5py.Group):
                copy(item, target.create_group(key))
            else:
                data = item[()]
                if getattr(data, "dtype", None) == np.float32:
                    data = data.astype(np.float16)
                target.create_dataset(key, data=data)
                for name, value in item.attrs.items():
                    target[key].attrs[name] = value

    with tempfile.TemporaryDirectory() as scratch:
        full = os.path.join(scratch, "model.keras")
        model.save(full)
        with zipfile.ZipFile(full) as archive:
            members = {n: archive.read(n) for n in archive.namelist()}
        weights = os.path.join(scratch, "float32.h5")
        with open(weights, "wb") as f:
            f.write(members["model.weights.h5"])
        halved = os.path.join(scratch, "float16.h5")
        with h5py.File(weights, "r") as source, h5py.File(halved, "w") as target:
            copy(source, target)
        with open(halved, "rb") as f:
            members["model.weights.h5"] = f.read()
        temporary = path + ".partial"
        with zipfile.ZipFile(temporary, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)
        os.replace(temporary, path)


def weights_file(record, name):
    """A seed's best weights: the float32 file of its run if this machine
    has it, else the committed float16 copy if it is of the run's best
    epoch (not of an epoch before the run went on), else None."""
    entry = record.run(name)
    full = recorded_path(entry.get("weights") or "")
    if os.path.isfile(full):
        return full
    kept = kept_weights_path(record, name)
    if os.path.isfile(kept) and entry.get("kept_weights_epoch") == entry.get("best_epoch"):
        return kept
    return None


def train_run(record, name, row, candidate, seed, until, corpus, args):
    """Trains run `name` up to `until` epochs in all (or its plateau),
    resuming from its checkpoint; every epoch goes into the row's JSON."""
    settings = record.data["settings"]
    entry = record.run(name)
    if entry.get("converged") or len(entry["epochs"]) >= until:
        return entry
    model_config, training = run_config(row, candidate, settings)
    directory = os.path.join(args.work_dir, row["name"], name)
    os.makedirs(directory, exist_ok=True)
    checkpoint = os.path.join(directory, "checkpoint")
    resume = os.path.exists(os.path.join(checkpoint, "progress.json"))
    if not resume and entry["epochs"]:
        # Its checkpoint is gone (another machine; a deleted --work-dir): the
        # run trains again from epoch 1, and what it had recorded is kept.
        start_again(entry, "no checkpoint to resume from: trained again from epoch 1")
        log(f"{row['name']} {name}: its checkpoint is gone; its "
            f"{len(entry['earlier_attempts'][-1]['epochs'])} epochs are kept under "
            "earlier_attempts, and it starts again")
    entry.update(
        hyperparameters=dict(candidate), seed=seed,
        weights=stored_path(os.path.join(directory, "best.weights.npz")),
    )
    entry.setdefault("environment", []).append(dict(environment(), command=args.command))
    record.save_run(name)
    keras.utils.set_random_seed(seed)
    model = lm.build_language_model(
        len(corpus.vocabulary), model_config, training["batch_size"],
        vocabulary=corpus.vocabulary,
    )
    lm.compile_language_model(model, training)
    clock = {"start": time.time()}

    def on_epoch(epoch, logs, improved):
        epochs = entry["epochs"][:epoch]
        epochs.append({
            "valid_perplexity": float(logs.get("val_perplexity", math.nan)),
            "train_perplexity": float(logs.get("perplexity", math.nan)),
            "seconds": time.time() - clock["start"],
            "learning_rate": float(keras.ops.convert_to_numpy(
                model.optimizer.learning_rate)),
            # Two-Tailed Averaging's state as validation saw it (its own
            # logs keys are written after this callback's epoch end).
            "tta_long_length": averaging._counts()[1] if averaging else None,
            "tta_weights_validated": (
                ("long" if averaging._use_long() else "raw") if averaging else None),
        })
        entry["epochs"] = epochs
        entry.update(
            best_valid_perplexity=None if math.isinf(plateau.best) else plateau.best,
            best_epoch=None if plateau.best_epoch is None else plateau.best_epoch + 1,
            converged=plateau.converged,
        )
        record.save_run(name)
        record.trained_epochs += 1
        log(f"{row['name']} {name} epoch {epoch + 1}: valid {epochs[-1]['valid_perplexity']:.2f}"
            f"{' (best)' if improved else ''}, train {epochs[-1]['train_perplexity']:.2f}, "
            f"{epochs[-1]['seconds']:.0f} s")
        clock["start"] = time.time()

    plateau = Plateau(
        os.path.join(directory, "best.weights.npz"), settings["patience"],
        settings["min_delta"], on_epoch=on_epoch,
    )
    train_data = lm.stream_dataset(
        corpus.train, training, line_end_id=lm._line_end_id(corpus)
    )
    valid_data = lm.stream_dataset(
        corpus.valid, training, training["eval_batch_size"], evaluation=True
    )
    callbacks = [plateau] + lm.training_callbacks(
        training, checkpoint, valid_data, resume=resume,
        checkpoint_every_steps=args.checkpoint_every,
    )
    averaging = next((c for c in callbacks if isinstance(c, TwoTailedAveraging)), None)
    log(f"{row['name']} {name}: {'resumed' if resume else 'started'}, "
        f"to epoch {until} or its plateau")
    model.fit(
        train_data, validation_data=valid_data, epochs=until, shuffle=False,
        callbacks=callbacks, verbose=0,
    )
    # Stopped by its cap (the final ranking's or a seed's), not the plateau
    # rule; a finalist that goes on as a seed is read again after that.
    entry["epoch_cap"] = until
    entry["stopped_at_max_epochs"] = (
        until >= settings["max_epochs"] and len(entry["epochs"]) >= until
        and not entry.get("converged"))
    record.save_run(name)
    return entry


def best_at(entry, epochs):
    """A run's best validation perplexity in its first `epochs` epochs."""
    values = [e["valid_perplexity"] for e in entry["epochs"][:epochs]]
    values = [v for v in values if math.isfinite(v)]
    return min(values) if values else math.inf


def best_of(names, record, epochs):
    return sorted(names, key=lambda name: best_at(record.run(name), epochs))


def _done(entry, until):
    return bool(entry.get("converged")) or len(entry["epochs"]) >= until


def _trained_seed(record, name, until):
    """Whether run `name`, trained to `until`, is one of the winner's seeds
    trained to its end (and so is to be tested)."""
    cap = seed_cap(record.data["settings"])
    is_seed = name == record.data.get("winner") or name.startswith("seed")
    return is_seed and until >= cap and _done(record.run(name), cap)


def _untested(record, name, until):
    """A trained seed not tested yet (its session ended during its tests):
    a worker tests it, beside the seeds still training."""
    return _trained_seed(record, name, until) and "dynamic" not in record.run(name)


def worker_count(jobs, pending, cores):
    """How many of `--jobs` workers a cut of `pending` runs starts: no more
    than the runs; and beyond `cores` only when every run then has a worker
    from the start (three seeds on two cores, which leaves no core idle when
    the shortest ends). Otherwise as many as the cores: a worker beyond them
    shares every core and makes the pinned ones share theirs (two pinned
    make 1.10x the steps of two sharing, `convergence_cost.py`), and a run
    pinned to its core computes with one thread on every machine."""
    workers = max(1, min(jobs, pending))
    if cores and workers > cores and pending > workers:
        workers = cores
    return workers


def train_all(record, units, row, corpus, args):
    """Trains each `(name, candidate, seed, until)` not done yet: in this
    process one after another, or with `--jobs N` in N worker processes at
    once. Returns False if `--stop-after-units` stopped it. With workers, a
    seed trained but not tested is given one too, to be tested."""
    pending = [u for u in units if not _done(record.run(u[0]), u[3])]
    if args.jobs > 1:
        pending += [u for u in units if u not in pending and _untested(record, u[0], u[3])]
    if args.jobs <= 1 or len(pending) <= 1:
        for name, candidate, seed, until in pending:
            train_run(record, name, row, candidate, seed, until, corpus, args)
            if args.stop_after_units and record.trained_epochs >= args.stop_after_units:
                return False
        return True
    record.save()
    env = dict(os.environ)
    # One thread each is meant. These flags alone do not make it so on JAX:
    # XLA sizes its pool to the cores a process may use (two threads on 2
    # cores, with or without them; `_harness.one_core_environment`), so a
    # worker runs one thread when it has a core of its own (below). They stay
    # so that every worker of the study starts as its first ones did.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + _harness.XLA_ONE_THREAD_FLAGS).strip()
    # On a GPU, JAX would give the first worker 75 % of its memory.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # Each step's largest temporaries on huge pages, not faulted in 4 KB at
    # a time (`_harness.HUGE_PAGE_TUNABLE`; its measure: convergence_cost.py).
    env.update(_harness.allocator_environment(environ=env))
    env.pop(_harness.CORES_VARIABLE, None)  # each worker's core is its own (below)
    queue, running, failed = list(pending), [], []
    workers = worker_count(args.jobs, len(pending), len(_harness.own_cores()))
    if workers < args.jobs:
        log(f"{row['name']}: {len(pending)} runs on {workers} workers at a time "
            f"(--jobs {args.jobs}; {len(_harness.own_cores())} cores)")
    while queue or running:
        while queue and len(running) < workers:
            name, _, _, until = queue.pop(0)
            command = [sys.executable, os.path.abspath(__file__)] + worker_argv(args) + [
                "--run", name, "--until", str(until)]
            # A core of its own while one is free: workers that share every
            # core preempt each other's threads (two Mogrifier RLSTM workers
            # on 2 cores: `convergence_cost.py`'s pinned rows).
            core = _harness.free_core([item[2] for item in running])
            worker_env = env if core is None else dict(env, **{_harness.CORES_VARIABLE: str(core)})
            log(f"{row['name']} {name}: worker started, " + (
                "to test it" if _done(record.run(name), until) else f"to epoch {until}")
                + ("" if core is None else f", on core {core}"))
            running.append((name, subprocess.Popen(command, env=worker_env), core))
        time.sleep(1)
        for item in list(running):
            if item[1].poll() is not None:
                running.remove(item)
                if item[1].returncode != 0:
                    failed.append(f"{item[0]} (exit {item[1].returncode})")
    record.reload_runs()
    if failed:
        raise RuntimeError(
            f"Expected every worker of row {row['name']!r} to finish. Received: "
            f"{', '.join(failed)} failed (their output is above; --resume "
            "continues them)"
        )
    return True


def worker_argv(args):
    """The arguments a worker needs to share this process's settings."""
    argv = ["--row", args.row, "--output", args.output, "--work-dir", args.work_dir,
            "--checkpoint-every", str(args.checkpoint_every),
            "--parameters", str(args.parameters), "--max-epochs", str(args.max_epochs),
            "--seed-max-epochs", str(args.seed_max_epochs),
            "--candidates", str(args.candidates), "--batch-size", str(args.batch_size),
            "--bptt", str(args.bptt), "--seeds"] + [str(s) for s in args.seeds]
    argv += ["--rungs"] + [str(r) for r in args.rungs]
    argv += ["--dynamic-learning-rates"] + [repr(v) for v in args.dynamic_learning_rates]
    argv += ["--dynamic-decay-rates"] + [repr(v) for v in args.dynamic_decay_rates]
    argv += ["--dynamic-slice-tokens", str(args.dynamic_slice_tokens),
             "--dynamic-statistics-batches", str(args.dynamic_statistics_batches),
             "--dynamic-statistics-batch", str(args.dynamic_statistics_batch),
             "--dynamic-block", str(args.dynamic_block)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    if args.max_tokens:
        argv += ["--max-tokens", str(args.max_tokens)]
    return argv


# === The row ===


def candidate_names(count):
    return [f"candidate{i + 1}" for i in range(count)]


def row_candidates(record):
    """The row's candidates, drawn again; those it recorded, if any, must be
    the same (a row is never continued with other candidates)."""
    candidates = latin_hypercube(
        RANGES, record.data["settings"]["candidates"], CANDIDATE_SEED, LOG_SCALE
    )
    recorded = record.data.get("candidates")
    if recorded is not None and recorded != json.loads(json.dumps(candidates)):
        raise ValueError(
            f"Expected the candidates recorded in {record.path} to be drawn again "
            f"the same. Received: {candidates} against the recorded {recorded}"
        )
    return candidates


def run_row(record, row, corpus, args):
    settings = record.data["settings"]
    candidates = row_candidates(record)
    record.data["candidates"] = candidates
    record.save()  # a row stopped before its first cut still names its candidates
    names = candidate_names(len(candidates))
    first = min(settings["seeds"])
    rungs = [min(r, settings["max_epochs"]) for r in settings["rungs"]]
    stages = record.data.setdefault("rungs", [])
    # Rung by rung: the better half goes on, ranked on the best validation
    # up to the rung (a cut once made is read back, never made again).
    alive = list(names)
    for index, epochs in enumerate(rungs + [settings["max_epochs"]]):
        if index < len(stages):
            alive = stages[index]["kept"]
            continue
        if index == len(rungs) and "winner" in record.data:
            # Decided once; the winner's run, if it trains again (its
            # weights lost), trains with the other seeds below.
            break
        units = [(n, candidates[names.index(n)], first, epochs) for n in alive]
        if not train_all(record, units, row, corpus, args):
            return False
        ranked = best_of(alive, record, epochs)
        # The values the cut was made on (a run that trains again later
        # changes its own record, not these).
        values = {n: best_at(record.run(n), epochs) for n in ranked}
        if index < len(rungs):
            kept = ranked[: max(1, len(ranked) // 2)]
            stages.append({"epochs": epochs, "ranked": ranked, "kept": kept,
                           "best_valid_perplexity": values})
            alive = kept
        else:
            record.data["winner"] = ranked[0]
            record.data["final_ranking"] = ranked
            record.data["final_best_valid_perplexity"] = values
            if os.path.isfile(recorded_path(record.run(ranked[0])["weights"])):
                # Its best weights kept at once (float16, with the results):
                # the seeds that follow take days, and --work-dir may go before.
                keep_weights(record, ranked[0])
        record.save()
    winner = record.data["winner"]
    candidate = candidates[names.index(winner)]
    seeds = {first: winner}
    seeds.update({s: f"seed{s}" for s in settings["seeds"] if s != first})
    record.data["seeds"] = {str(s): n for s, n in seeds.items()}
    record.save()
    for name in seeds.values():
        entry = record.run(name)
        if (_done(entry, seed_cap(settings)) and "dynamic" not in entry
                and weights_file(record, name) is None):
            # Its best weights were in the ignored --work-dir only, and went
            # with it before the seed was tested: it trains again.
            start_again(entry, "its best weights were lost with --work-dir before "
                        "its test evaluation: trained again from epoch 1")
            record.save_run(name)
            log(f"{row['name']} {name}: its best weights are gone; it trains again")
    units = [(n, candidate, s, seed_cap(settings)) for s, n in seeds.items()]
    # In this process, each seed is tested as soon as it ends; workers test
    # their own (`worker`).
    for batch in ([[u] for u in units] if args.jobs <= 1 else [units]):
        if not train_all(record, batch, row, corpus, args):
            return False
        for name, *_ in batch:
            finish_seed(record, name, row, candidate, corpus, args)
    save_best_seed(record, row, candidate, corpus)
    summarise(record)
    record.data["complete"] = True
    record.save()
    return True


def row_finished(record):
    """Whether the row is complete and still holds all it was completed
    with: every seed tested, the best seed's saved model in place."""
    data = record.data
    model = recorded_path(data.get("model", {}).get("path", ""))
    return bool(data.get("complete")) and os.path.isfile(model) and all(
        "dynamic" in record.run(name) for name in data["seeds"].values())


def seed_cap(settings):
    """The seeds' epoch cap (`max_epochs` in a row recorded before there
    was a separate one)."""
    return settings.get("seed_max_epochs", settings["max_epochs"])


def finish_seed(record, name, row, candidate, corpus, args):
    """What follows a seed's training, as soon as it ends: the float16 copy
    of its best weights, then its static and dynamic test."""
    if "dynamic" in record.run(name):
        return
    keep_weights(record, name)
    evaluate_run(record, name, row, candidate, corpus, args)
    dynamic_run(record, name, row, candidate, corpus, args)


def save_best_seed(record, row, candidate, corpus):
    """The row's best seed (on validation) as `<output>/<row>/best_model.keras`:
    the model as trained (its training batch size, the vocabulary it
    carries), float16 weights (`save_float16_model`), uncompiled."""
    seeds = record.data["seeds"]
    best = min(seeds.values(), key=lambda n: record.run(n)["static"]["valid_perplexity"])
    path = os.path.join(record.run_dir, "best_model.keras")
    if record.data.get("model", {}).get("run") == best and os.path.exists(path):
        return
    model, _, _ = best_model(record, best, row, candidate, corpus, compiled=False)
    save_float16_model(model, path)
    record.data["model"] = {
        "path": stored_path(path), "run": best,
        "seed": int(next(s for s, n in seeds.items() if n == best)),
        "valid_perplexity": record.run(best)["static"]["valid_perplexity"],
        "bytes": os.path.getsize(path),
        "load": "keras.saving.load_model(path)",
    }
    record.save()
    log(f"{row['name']}: the best seed ({best}) saved as {record.data['model']['path']}")


def worker(record, row, corpus, args):
    """`--run NAME --until E`: trains one run of the row and, if it is one of
    the winner's seeds trained to its end, tests it."""
    candidates = record.data["candidates"]
    names = candidate_names(len(candidates))
    first = min(record.data["settings"]["seeds"])
    if args.run in names:
        candidate, seed = candidates[names.index(args.run)], first
    elif args.run.startswith("seed") and "winner" in record.data:
        candidate = candidates[names.index(record.data["winner"])]
        seed = int(args.run[len("seed"):])
    else:
        raise ValueError(
            f"Expected --run among {names} or seedN once the row has a winner. "
            f"Received: {args.run!r}"
        )
    train_run(record, args.run, row, candidate, seed, args.until, corpus, args)
    if _trained_seed(record, args.run, args.until):
        finish_seed(record, args.run, row, candidate, corpus, args)


def best_model(record, name, row, candidate, corpus, compiled=True):
    """A model holding a run's best-validated weights (compiled unless
    `compiled=False`), its training settings, and the file it was read from."""
    entry = record.run(name)
    model_config, training = run_config(row, candidate, record.data["settings"])
    model = lm.build_language_model(
        len(corpus.vocabulary), model_config, training["batch_size"],
        vocabulary=corpus.vocabulary,
    )
    if compiled:
        lm.compile_language_model(model, training)
    path = weights_file(record, name)
    if path is None:
        raise FileNotFoundError(
            f"Expected the best weights of run {name!r} ({entry.get('weights')} or "
            f"{kept_weights_path(record, name)}). Received: neither file exists")
    load_weights(model, path)
    return model, training, stored_path(path)


def evaluate_run(record, name, row, candidate, corpus, args):
    """Static test of a run's best weights (temperature tuned on validation)."""
    entry = record.run(name)
    if "static" in entry:
        return
    model, training, weights = best_model(record, name, row, candidate, corpus)
    tau = lm.search_temperature(
        model, corpus.valid, batch_size=training["eval_batch_size"],
        sequence_length=training["sequence_length"],
    )
    static = {"temperature": tau["temperature"], "weights": weights}
    for split in ("valid", "test"):
        static[f"{split}_perplexity"] = lm.evaluate_language_model(
            model, corpus[split], training)["perplexity"]
    for split in ("valid", "test"):
        losses = lm.static_stream_losses(model, corpus[split])
        static[f"{split}_perplexity_one_stream"] = float(math.exp(losses.mean()))
    static.update(lm.like_for_like_evaluation(model, corpus, training["eval_batch_size"]))
    entry["static"] = static
    record.save_run(name)
    log(f"{row['name']} {name}: test {static['test_perplexity']:.2f} "
        f"(τ {tau['temperature']:.2f}), one stream {static['test_perplexity_one_stream']:.2f}")


def pass_summary(losses, block):
    """What the search keeps of a pass's per-token losses: their mean and
    the means of their whole blocks of `block` tokens (enough for
    `summary_separation`, and small enough to record pass by pass)."""
    losses = np.asarray(losses, "float64")
    blocks = len(losses) // block
    return {"mean_loss": float(losses.mean()), "block_means": [
        float(m) for m in losses[: blocks * block].reshape(blocks, block).mean(axis=1)]}


def summary_separation(best, other):
    """How many standard errors `other`'s mean loss is above `best`'s (two
    `pass_summary`s of the same tokens): the difference of the means over
    the standard error of the blocks' differences."""
    differences = np.asarray(other["block_means"]) - np.asarray(best["block_means"])
    blocks = len(differences)
    if blocks < 2:
        return math.nan
    error = differences.std(ddof=1) / math.sqrt(blocks)
    gap = other["mean_loss"] - best["mean_loss"]
    return float(gap / error) if error > 0 else math.inf


def separation(best, other, block):
    """How many standard errors `other`'s per-token losses are above
    `best`'s on average (batch means over blocks of `block` tokens)."""
    return summary_separation(pass_summary(best, block), pass_summary(other, block))


def _grid_neighbours(grid, point):
    """The settings next to `point` on the grid (one step in η or in λ)."""
    etas, lambdas = grid
    i, j = etas.index(point[0]), lambdas.index(point[1])
    steps = [(i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)]
    return [(etas[a], lambdas[b]) for a, b in steps
            if 0 <= a < len(etas) and 0 <= b < len(lambdas)]


def _widened(values, index):
    """`values` with one more step beyond the edge at `index` (0 or -1)."""
    ratio = values[1] / values[0]
    return (values[0] / ratio,) + tuple(values) if index == 0 else tuple(values) + (
        values[-1] * ratio,)


def search_dynamic(evaluator, valid, log_line, slice_tokens, etas, lambdas, block,
                   done=(), on_pass=None):
    """The joint η × λ search on a validation slice that separates the best
    setting from its neighbours; returns the record of every pass.

    `done` are passes recorded before (each `{"learning_rate",
    "decay_rate", "tokens", "perplexity"}` with its `pass_summary`, or a
    `None` perplexity where it diverged), which are not evaluated again;
    `on_pass` is called with each new pass's record as soon as it ends (the
    caller writes it down, so a stopped search resumes where it was)."""
    passes, tokens = {}, min(slice_tokens, len(valid) - 1)
    for recorded in done:
        passes[(recorded["learning_rate"], recorded["decay_rate"], recorded["tokens"])] = (
            None if recorded["perplexity"] is None else
            {"mean_loss": recorded["mean_loss"], "block_means": recorded["block_means"]})
    widened = 0
    while True:
        grid = (list(etas), list(lambdas))
        for eta in etas:
            for lam in lambdas:
                key = (eta, lam, tokens)
                if key in passes:
                    continue
                evaluator.learning_rate, evaluator.decay_rate = eta, lam
                try:
                    logs = evaluator.evaluate(valid[: tokens + 1], verbose=0,
                                              return_token_losses=True)
                    passes[key] = pass_summary(logs["token_losses"][0], block)
                except DivergenceError:
                    passes[key] = None
                result = passes[key]
                log_line(f"η {eta:g}, λ {lam:g}, {tokens:,} tokens: " + (
                    "diverged" if result is None
                    else f"perplexity {math.exp(result['mean_loss']):.2f}"))
                if on_pass is not None:
                    on_pass(dict(
                        learning_rate=eta, decay_rate=lam, tokens=tokens,
                        perplexity=None if result is None else math.exp(result["mean_loss"]),
                        **(result or {})))
        scored = {(e, l): passes[(e, l, tokens)] for e in etas for l in lambdas
                  if passes[(e, l, tokens)] is not None}
        if not scored:
            raise RuntimeError("Every dynamic-evaluation setting diverged")
        best = min(scored, key=lambda k: scored[k]["mean_loss"])
        edges = [(axis, index) for axis, values in ((0, etas), (1, lambdas))
                 for index in (0, -1) if best[axis] == values[index]]
        if edges and widened < DYNAMIC_WIDEN:
            widened += 1
            for axis, index in edges:
                if axis == 0:
                    etas = _widened(etas, index)
                else:
                    lambdas = _widened(lambdas, index)
            continue
        gaps = {f"{e:g},{l:g}": summary_separation(scored[best], scored[(e, l)])
                for e, l in _grid_neighbours(grid, best) if (e, l) in scored}
        separated = all(g >= DYNAMIC_SEPARATION for g in gaps.values())
        if separated or tokens >= len(valid) - 1:
            break
        tokens = min(2 * tokens, len(valid) - 1)
    return {
        "learning_rate": best[0], "decay_rate": best[1], "slice_tokens": tokens,
        "separation": gaps, "separated": separated, "on_edge": [
            ("learning_rate", "decay_rate")[a] for a, _ in edges],
        "learning_rates": list(etas), "decay_rates": list(lambdas),
        "passes": [
            {"learning_rate": e, "decay_rate": l, "tokens": n,
             "perplexity": None if r is None else float(math.exp(r["mean_loss"]))}
            for (e, l, n), r in passes.items()
        ],
    }


def dynamic_run(record, name, row, candidate, corpus, args):
    """Dynamic evaluation of a run's best weights: the joint search on
    validation, then the whole test stream once."""
    entry = record.run(name)
    if "dynamic" in entry:
        return
    model, _, weights = best_model(record, name, row, candidate, corpus)
    evaluator = DynamicEvaluator(
        model.with_options(batch_size=args.dynamic_statistics_batch, samples=1),
        segment_length=DYNAMIC_SEGMENT,
    )
    evaluator.collect_gradient_statistics(
        corpus.train, steps=args.dynamic_statistics_batches,
        batch_size=args.dynamic_statistics_batch,
    )
    start = time.time()
    # The passes so far (a stopped search's, in the run's JSON) count only
    # for the same weights, statistics and blocks.
    identity = {"weights": weights, "best_epoch": entry.get("best_epoch"),
                "best_valid_perplexity": entry.get("best_valid_perplexity"),
                "epsilon": evaluator.epsilon,
                "segment_length": DYNAMIC_SEGMENT, "block": args.dynamic_block,
                "statistics_batches": args.dynamic_statistics_batches,
                "statistics_batch": args.dynamic_statistics_batch}
    progress = entry.get("dynamic_search")
    if progress is not None and progress["identity"] != identity:
        log(f"{row['name']} {name} dynamic: the {len(progress['passes'])} passes recorded "
            "were made with other weights or settings; the search starts again")
        progress = None
    done = list(progress["passes"]) if progress else []
    reused = len(done)
    if reused:
        log(f"{row['name']} {name} dynamic: {reused} passes recorded before are kept")

    def on_pass(recorded):
        done.append(recorded)
        entry["dynamic_search"] = {"identity": identity, "passes": done}
        record.save_run(name)

    search = search_dynamic(
        evaluator, corpus.valid,
        lambda line: log(f"{row['name']} {name} dynamic: {line}"),
        args.dynamic_slice_tokens, tuple(args.dynamic_learning_rates),
        tuple(args.dynamic_decay_rates),
        args.dynamic_block, done=done[:], on_pass=on_pass,
    )
    evaluator.learning_rate = search["learning_rate"]
    evaluator.decay_rate = search["decay_rate"]
    test = evaluator.evaluate(corpus.test, verbose=0)
    entry["dynamic"] = dict(
        search, weights=weights, epsilon=evaluator.epsilon, segment_length=DYNAMIC_SEGMENT,
        statistics_batches=args.dynamic_statistics_batches,
        test_perplexity=float(test["perplexity"]),
        gain=1.0 - float(test["perplexity"]) / entry["static"]["test_perplexity_one_stream"],
        seconds=time.time() - start, passes_reused=reused,
    )
    entry.pop("dynamic_search", None)  # the passes' record is in "dynamic" now
    record.save_run(name)
    log(f"{row['name']} {name}: dynamic test {test['perplexity']:.2f} "
        f"(η {search['learning_rate']:g}, λ {search['decay_rate']:g}, ranked on "
        f"{search['slice_tokens']:,} validation tokens)")


def summarise(record):
    seeds = [record.run(n) for n in record.data["seeds"].values()]
    for key in ("valid_perplexity", "test_perplexity", "test_perplexity_one_stream",
                "dynamic_test_perplexity"):
        values = [s["dynamic"]["test_perplexity"] if key.startswith("dynamic")
                  else s["static"][key] for s in seeds]
        record.data.setdefault("summary", {})[key] = {
            "mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1))
            if len(values) > 1 else None, "values": values,
        }
    record.data["summary"]["epochs"] = [len(s["epochs"]) for s in seeds]
    record.data["summary"]["best_epochs"] = [s["best_epoch"] for s in seeds]


# === Table ===


def load_rows(output):
    """Every row's JSON in `output` (`load_row`), by name."""
    if not os.path.isdir(output):
        return []
    return [load_row(os.path.join(output, name)) for name in sorted(os.listdir(output))
            if name.endswith(".json")]


def _spread(figure):
    """`mean ± sd (v1, v2, …)` of one of a row's `summary` figures."""
    sd = "" if figure["sd"] is None else f" ± {figure['sd']:.2f}"
    return f"{figure['mean']:.2f}{sd} ({', '.join(f'{v:.2f}' for v in figure['values'])})"


def table(output):
    """Markdown tables of every row in `output`: the finished rows' figures
    over their seeds, every candidate's ranks at each cut, and every run."""
    rows = load_rows(output)
    parts = []
    finished = [data for data in rows if data.get("complete")]
    if finished:
        lines = ["| row | params | seeds | epochs (best epoch) | valid | test | "
                 "test, one stream | dynamic test | dynamic gain |",
                 "| --- | ---: | ---: | --- | --- | --- | --- | --- | --- |"]
        for data in finished:
            summary = data["summary"]
            seeds = [data["runs"][n] for n in data["seeds"].values()]
            epochs = ", ".join(
                f"{len(s['epochs'])}{'*' if s.get('stopped_at_max_epochs') else ''}"
                f" ({s['best_epoch']})" for s in seeds)
            gains = [100 * s["dynamic"]["gain"] for s in seeds]
            lines.append(
                f"| {data['row']} | {data['params']:,} | {len(seeds)} | {epochs} | "
                f"{_spread(summary['valid_perplexity'])} | "
                f"{_spread(summary['test_perplexity'])} | "
                f"{_spread(summary['test_perplexity_one_stream'])} | "
                f"{_spread(summary['dynamic_test_perplexity'])} | "
                f"{np.mean(gains):.1f} % |")
        parts.append("\n".join(lines) + "\n\nMean ± standard deviation over the seeds "
                     "(each seed's value in brackets); * stopped by the seeds' cap, "
                     "not the plateau; dynamic gain against the one-stream test.")
    ranked = [data for data in rows if data.get("rungs")]
    if ranked:
        lines = ["| row | candidate | learning rate | dropout in / cell out / state / out "
                 "| ranks at the cuts | final rank |",
                 "| --- | --- | ---: | --- | --- | --- |"]
        for data in ranked:
            names = candidate_names(len(data["candidates"]))
            for name, candidate in zip(names, data["candidates"]):
                ranks = ", ".join(
                    f"{stage['ranked'].index(name) + 1} of {len(stage['ranked'])} "
                    f"({stage['epochs']} ep.)"
                    for stage in data["rungs"] if name in stage["ranked"])
                final = data.get("final_ranking") or []
                lines.append(
                    f"| {data['row']} | {name} | {candidate['learning_rate']:.1e} | "
                    + " / ".join(f"{candidate[k]:.2f}" for k in (
                        "input_dropout", "cell_output_dropout", "state_dropout",
                        "output_dropout"))
                    + f" | {ranks} | "
                    + (f"{final.index(name) + 1} of {len(final)} "
                       f"({data['settings']['max_epochs']} ep.)" if name in final else "")
                    + (" (winner)" if name == data.get("winner") else "") + " |")
        parts.append("\n".join(lines))
    lines = ["| row | units | params | run | epochs | best epoch | best valid | converged |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for data in rows:
        for run, entry in data["runs"].items():
            converged = "yes" if entry.get("converged") else (
                f"no (cap {entry.get('epoch_cap') or data['settings']['max_epochs']})"
                if entry.get("stopped_at_max_epochs")
                else "no")
            lines.append(
                f"| {data['row']} | {data['units']} | {data['params']:,} | {run} | "
                f"{len(entry['epochs'])} | {entry.get('best_epoch')} | "
                f"{entry.get('best_valid_perplexity') or math.nan:.2f} | {converged} |"
            )
    parts.append("\n".join(lines))
    return "\n\n".join(parts)


def plot(output, path):
    """Every run's validation curve, one panel per row, to `path` (PNG):
    the candidates thin, the winner's seeds thick, the cuts and the final
    ranking dotted, and a
    run's earlier attempts (trained on a machine that is gone) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = load_rows(output)
    if not rows:
        raise ValueError(f"Expected a row's JSON in {output}. Received: none")
    figure, axes = plt.subplots(1, len(rows), figsize=(6.5 * len(rows), 4.5), squeeze=False)
    for axis, data in zip(axes[0], rows):
        seeds = {data.get("winner")} | {n for n in data["runs"] if n.startswith("seed")}
        seed_curves = []  # (color, values, best epoch, earlier attempts) of each seed
        for index, (name, entry) in enumerate(sorted(data["runs"].items())):
            color = f"C{index % 10}"
            seed = name in seeds
            attempts = []
            for attempt in entry.get("earlier_attempts", []):
                values = [e["valid_perplexity"] for e in attempt["epochs"]]
                attempts.append(values)
                axis.plot(range(1, len(values) + 1), values, color=color,
                          lw=1.4 if seed else 0.8, ls="--", alpha=0.7)
            values = [e["valid_perplexity"] for e in entry["epochs"]]
            if values:  # (a lone first epoch drawn as a dot)
                axis.plot(range(1, len(values) + 1), values, color=color,
                          lw=2.0 if seed else 0.9, label=name,
                          marker="." if len(values) == 1 else None)
            if seed:
                seed_curves.append((color, values, entry.get("best_epoch"), attempts))
        for stage in data.get("rungs", []):
            axis.axvline(stage["epochs"], color="0.6", ls=":", lw=0.8)
        if "winner" in data:  # the final ranking; the seeds go on to their plateau
            axis.axvline(data["settings"]["max_epochs"], color="0.6", ls=":", lw=0.8)
        axis.set_yscale("log")
        axis.set_ylim(70, 300)
        ticks = [70, 80, 90, 100, 120, 150, 200, 300]
        axis.set_yticks(ticks, [str(t) for t in ticks])
        axis.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        axis.set_xlabel("epoch")
        axis.set_ylabel("validation perplexity (the weights validated)")
        axis.set_title(f"{data['row']} ({data['params']:,} parameters); thick: the "
                       "winner's seeds, dashed: earlier attempts", fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
        if "winner" in data:
            _seeds_inset(axis, seed_curves, max(1, data["settings"]["max_epochs"] // 2))
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, ncol=2, loc="upper right")
        else:  # a row just started: its panel says so
            axis.text(0.5, 0.5, "no epoch recorded yet", transform=axis.transAxes,
                      ha="center", va="center", color="0.4")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _seeds_inset(axis, seed_curves, start):
    """An inset of `axis`: the winner's seeds (`(color, values, best_epoch,
    earlier_attempts)` as the panel drew them) from epoch `start` (half the
    final ranking's budget) on, on a linear scale where the plateau shows,
    each seed's kept epoch (its lowest validation) marked and its earlier
    attempts dashed."""
    inset = axis.inset_axes([0.40, 0.27, 0.57, 0.38])
    for color, values, best, attempts in seed_curves:
        for attempt in attempts:
            if len(attempt) >= start:
                inset.plot(range(start, len(attempt) + 1), attempt[start - 1:], color=color,
                           lw=1.0, ls="--", alpha=0.7)
        if len(values) < start:
            continue
        inset.plot(range(start, len(values) + 1), values[start - 1:], color=color, lw=1.2)
        if best:
            inset.plot([best], [values[best - 1]], "o", color=color, ms=3)
    inset.set_title(f"the seeds from epoch {start} (dot: the kept epoch)", fontsize=7)
    inset.tick_params(labelsize=6)
    inset.grid(True, alpha=0.3)


def main(argv=None):
    parser = _harness.argument_parser(__doc__, json_flag=False, data_dir="optional")
    parser.add_argument("--row", default=None, help=f"one of {list(ROWS)}")
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--work-dir", default=DEFAULT_WORK_DIR,
        help="the runs' checkpoints and float32 best weights (about 110 MB a "
             "run); default ~/.cache/keras-mogrifier/convergence, outside "
             "the checkout so that a fresh clone on this machine resumes")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--checkpoint-every", type=int, default=200,
                        help="steps between checkpoints within an epoch")
    parser.add_argument("--parameters", type=int, default=paper_tables.PARAMETERS)
    parser.add_argument("--max-epochs", type=int, default=MAX_EPOCHS)
    parser.add_argument("--seed-max-epochs", type=int, default=None,
                        help=f"the seeds' epoch cap (default: {SEED_CAP_FACTOR} × "
                        "--max-epochs)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--candidates", type=int, default=CANDIDATES)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--bptt", type=int, default=SEQUENCE_LENGTH)
    parser.add_argument("--rungs", type=int, nargs="*", default=list(RUNGS))
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="train on the first tokens only (smoke runs)")
    parser.add_argument("--stop-after-units", type=int, default=None,
                        help="stop after this many epochs in all (tests)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="train up to this many runs at once, each in a worker "
                        "process (beyond the cores only when every run of a cut "
                        "then has a worker: `worker_count`)")
    parser.add_argument("--run", default=None,
                        help="worker: train this run only (candidateK or seedN)")
    parser.add_argument("--until", type=int, default=None,
                        help="worker: to this many epochs in all (or the plateau)")
    parser.add_argument("--dynamic-learning-rates", type=float, nargs="+",
                        default=list(DYNAMIC_LEARNING_RATES))
    parser.add_argument("--dynamic-decay-rates", type=float, nargs="+",
                        default=list(DYNAMIC_DECAY_RATES))
    parser.add_argument("--dynamic-slice-tokens", type=int, default=DYNAMIC_SLICE_TOKENS)
    parser.add_argument("--dynamic-statistics-batches", type=int,
                        default=DYNAMIC_STATISTICS_BATCHES)
    parser.add_argument("--dynamic-statistics-batch", type=int, default=100)
    parser.add_argument("--dynamic-block", type=int, default=DYNAMIC_BLOCK)
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--plot", metavar="PNG", default=None,
                        help="write every run's validation curve to this PNG and stop")
    args = parser.parse_args(argv)
    if (args.run is None) != (args.until is None):
        parser.error("--run and --until go together (a worker's run)")
    if args.seed_max_epochs is None:
        args.seed_max_epochs = SEED_CAP_FACTOR * args.max_epochs
    if args.seed_max_epochs < args.max_epochs:
        raise ValueError(
            f"Expected --seed-max-epochs of at least --max-epochs ({args.max_epochs}: "
            f"the seeds go on from the final ranking). Received: {args.seed_max_epochs}")
    if args.table:
        print(table(args.output))
        return 0
    if args.plot:
        plot(args.output, args.plot)
        return 0
    if args.row is None:
        parser.error("--row is required (one row per process)")
    row = row_spec(args.row)
    corpus = (
        load_corpus(args.data_dir) if args.data_dir else synthetic_corpus()
    )
    settings = study_settings(args)
    path = os.path.join(args.output, f"{row['name']}.json")
    args.command = _harness.command_line(__file__, argv, backend=keras.backend.backend())
    record = RowRecord(path, settings, args.resume, worker=args.run is not None)
    if "units" not in record.data:
        units, params = paper_tables.units_for_budget(
            len(corpus.vocabulary), row, settings
        )
        record.data.update(row=row["name"], cell=row["cell"], units=units, params=params,
                           data_hash=data_hash(args.data_dir))
    if record.data["data_hash"] != data_hash(args.data_dir):
        raise ValueError(
            f"Expected the data recorded in {path} (SHA-256 "
            f"{record.data['data_hash'][:12]}…) to resume that row. Received: "
            f"{args.data_dir!r}, whose files hash differently"
        )
    row.update(units=record.data["units"])
    if args.run is not None:
        worker(record, row, corpus, args)
        return 0
    row_candidates(record)  # before anything is written
    if row_finished(record):
        # Nothing to do (the rows run one after another, each with --resume:
        # a finished row is passed over without a record of the command).
        log(f"{row['name']}: complete already; nothing to do")
        return 0
    record.data["commands"].append({
        "command": args.command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "environment": environment(),
    })
    record.save()
    log(f"{row['name']}: {record.data['units']} units, {record.data['params']:,} "
        f"parameters; JSON {os.path.relpath(path, REPOSITORY)}")
    done = run_row(record, row, corpus, args)
    log(f"{row['name']}: {'complete' if done else 'stopped (--stop-after-units)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
