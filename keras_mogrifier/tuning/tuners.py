"""Building KerasTuner tuners for the hypermodels, and reading their results."""

import math

import keras_tuner

from keras_mogrifier import _validation

TUNERS = ("random", "bayesian", "hyperband")
# KerasTuner stops a search after 3 failed trials in a row by default; with
# the papers' wide ranges a few diverging trials in a row are not unusual.
MAX_CONSECUTIVE_FAILED_TRIALS = 10


def build_tuner(
    hypermodel,
    tuner="random",
    max_trials=10,
    max_epochs=None,
    objective=None,
    directory=None,
    project_name=None,
    overwrite=False,
    seed=None,
    max_consecutive_failed_trials=MAX_CONSECUTIVE_FAILED_TRIALS,
    **kwargs,
):
    """A KerasTuner tuner for `hypermodel`, with its objective.

    Args:
        hypermodel: `keras_tuner.HyperModel`. E.g. `LanguageModelHyperModel`
            (its `objective` attribute is used).
        tuner: str. `"random"` (`RandomSearch`), `"bayesian"`
            (`BayesianOptimization`, which needs SciPy:
            `pip install keras-tuner[bayesian]`) or `"hyperband"` (`Hyperband`, which runs
            as many trials as its brackets need, up to `max_epochs` epochs
            each, and ignores `max_trials`). Defaults to `"random"`.
        max_trials: int. Trials of random search and Bayesian optimisation.
            Defaults to `10`.
        max_epochs: int or None. Hyperband's largest number of epochs per
            trial; required for `"hyperband"`. Defaults to `None`.
        objective: `keras_tuner.Objective` or None. Defaults to `None`: the
            hypermodel's `objective` (`val_perplexity`, minimised).
        directory: str or None. Where KerasTuner keeps the trials; a search
            resumes from there with `overwrite=False`. Defaults to `None`
            (the working directory).
        project_name: str or None. Sub-directory of the search. Defaults to
            `None` (KerasTuner's `"untitled_project"`).
        overwrite: bool. Start afresh instead of resuming. Defaults to
            `False`.
        seed: int or None. Seed of the oracle. Defaults to `None`.
        max_consecutive_failed_trials: int. Failed trials in a row after
            which KerasTuner stops the search. Defaults to `10`.
        **kwargs: other arguments of the tuner's constructor.

    Returns:
        The tuner.

    Example:

    >>> import tempfile
    >>> from keras_mogrifier.tuning import LanguageModelHyperModel
    >>> hypermodel = LanguageModelHyperModel(100, batch_size=4,
    ...                                      fixed={"units": 8})
    >>> tuner = build_tuner(hypermodel, "hyperband", max_epochs=4,
    ...                     directory=tempfile.mkdtemp())
    >>> tuner.oracle.objective.name
    'val_perplexity'
    """
    _validation.one_of("tuner", tuner, TUNERS)
    max_trials = _validation.positive_int("max_trials", max_trials)
    max_consecutive_failed_trials = _validation.positive_int(
        "max_consecutive_failed_trials", max_consecutive_failed_trials
    )
    if objective is None:
        objective = getattr(hypermodel, "objective", None)
    if objective is None:
        raise ValueError(
            "Expected an `objective` (the hypermodel has none). "
            "Received: objective=None"
        )
    common = dict(
        hypermodel=hypermodel,
        objective=objective,
        directory=directory,
        project_name=project_name,
        overwrite=overwrite,
        seed=seed,
        max_consecutive_failed_trials=max_consecutive_failed_trials,
        **kwargs,
    )
    if tuner == "random":
        return keras_tuner.RandomSearch(max_trials=max_trials, **common)
    if tuner == "bayesian":
        return keras_tuner.BayesianOptimization(max_trials=max_trials, **common)
    max_epochs = _validation.positive_int("max_epochs", max_epochs)
    return keras_tuner.Hyperband(max_epochs=max_epochs, **common)


def trial_rows(tuner):
    """One dict per trial, in the order they started.

    Each row holds `trial_id`, `status` (`COMPLETED`, `FAILED`, ...), `score`
    (the objective value, `None` when the trial has none), `best` (whether it
    is the tuner's best trial), `message` (the last line of a failed trial's
    error) and `values` (its hyperparameter values).
    """
    oracle = tuner.oracle
    best = oracle.get_best_trials(1)
    best_id = best[0].trial_id if best and best[0].status == "COMPLETED" else None
    order = list(getattr(oracle, "start_order", [])) or sorted(oracle.trials)
    rows = []
    for trial_id in order:
        trial = oracle.trials[trial_id]
        message = (trial.message or "").strip().splitlines()
        rows.append(
            {
                "trial_id": trial_id,
                "status": trial.status,
                "score": None if trial.score is None else float(trial.score),
                "best": trial_id == best_id,
                "message": message[-1] if message else "",
                "values": dict(trial.hyperparameters.values),
            }
        )
    return rows


def search_summary(tuner, advice="", failed_as="failed"):
    """A few lines on how a search went: counts, each failure, what to try.

    Args:
        tuner: a KerasTuner tuner after (or during) `search`.
        advice: str. What to try when trials failed (appended then).
        failed_as: str. The word for a failed trial, e.g. `"diverged"` for
            `DynamicEvaluationTuner`, whose trials fail only by diverging.
            Defaults to `"failed"`.

    Returns:
        The text, e.g. `"8 trial(s): 6 completed, 2 failed"` followed by
        one line per failed trial.
    """
    rows = trial_rows(tuner)
    words = {"FAILED": failed_as}
    counts = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    parts = ", ".join(
        f"{n} {words.get(status, status.lower())}" for status, n in sorted(counts.items())
    )
    lines = [f"{len(rows)} trial(s): {parts or 'none ran'}"]
    for row in rows:
        if row["status"] not in ("COMPLETED", "RUNNING"):
            values = ", ".join(f"{k}={_format(v)}" for k, v in row["values"].items())
            status = words.get(row["status"], row["status"].lower())
            lines.append(
                f"  trial {row['trial_id']} {status} ({values}): "
                f"{row['message'] or 'no message'}"
            )
    if advice and any(r["status"] not in ("COMPLETED", "RUNNING") for r in rows):
        lines.append(advice)
    return "\n".join(lines)


def run_search(tuner, search, advice, failed_as="failed"):
    """Runs `search()` (the tuner's search), then fails if no trial completed.

    KerasTuner ends a search with a `RuntimeError` after too many failed
    trials in a row; either way, when no trial of `tuner` completed this
    raises `SearchFailedError` with `search_summary(tuner, advice,
    failed_as)`.
    """
    from keras_mogrifier.tuning.search_failed_error import SearchFailedError

    try:
        search()
    except RuntimeError as error:
        if "consecutive failures" not in str(error):
            raise
    rows = trial_rows(tuner)
    if not any(row["status"] == "COMPLETED" for row in rows):
        raise SearchFailedError(
            "No trial completed. " + search_summary(tuner, advice, failed_as), rows
        )
    return tuner


def _format(value):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    return str(value)


def trials_table(tuner):
    """The trials of a search as a text table (best marked with `*`).

    Columns: trial, status, the objective, then every hyperparameter (`-`
    when inactive in a trial). Failed trials end with their error.
    """
    rows = trial_rows(tuner)
    objective = tuner.oracle.objective.name
    names = []
    for row in rows:
        for name in row["values"]:
            if name not in names:
                names.append(name)
    header = ["trial", "status", objective] + names
    lines = [header]
    for row in rows:
        lines.append(
            [("*" if row["best"] else "") + row["trial_id"], row["status"],
             _format(row["score"])]
            + [_format(row["values"].get(name)) for name in names]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(cell.rjust(width) for cell, width in zip(line, widths))
        for line in lines
    ]
    failures = [r for r in rows if r["status"] not in ("COMPLETED", "RUNNING")]
    for row in failures:
        text.append(f"trial {row['trial_id']} {row['status']}: {row['message']}")
    return "\n".join(text)


def best_configuration(tuner):
    """The best trial's hyperparameter values and objective value.

    Returns:
        A dict with `trial_id`, `score` and `values`, plus, when the tuner's
        hypermodel has a `configuration` method (`LanguageModelHyperModel`),
        `configuration`: the model and training settings it maps to.

    Raises:
        ValueError: when no trial has completed.
    """
    best = tuner.oracle.get_best_trials(1)
    if not best or best[0].status != "COMPLETED":
        raise ValueError(
            "Expected at least one completed trial. Received: "
            f"{len(tuner.oracle.trials)} trial(s), none completed"
        )
    trial = best[0]
    result = {
        "trial_id": trial.trial_id,
        "score": float(trial.score),
        "values": dict(trial.hyperparameters.values),
    }
    configuration = getattr(tuner.hypermodel, "configuration", None)
    if callable(configuration):
        result["configuration"] = configuration(trial.hyperparameters.copy())
    return result
