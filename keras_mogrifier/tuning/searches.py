"""Complete searches on a corpus: what `tuning/search_ptb.py` and
`tuning/search_dyneval.py` run, as functions."""

import os

import keras

from keras_mogrifier import _validation
from keras_mogrifier.tuning.dynamic_evaluation_tuner import DynamicEvaluationTuner
from keras_mogrifier.tuning.language_model_hyper_model import LanguageModelHyperModel
from keras_mogrifier.tuning.tuners import build_tuner
from keras_mogrifier.tuning.tuners import run_search

LANGUAGE_MODEL_ADVICE = (
    "What to try: smaller learning rates (`ranges={'learning_rate': (low, "
    "high)}`), gradient clipping, or `fixed=` values of a preset that trains "
    "(e.g. keras_mogrifier.pipeline.get_preset('tiny'))."
)


def run_language_model_search(
    corpus,
    tuner="random",
    max_trials=4,
    epochs=1,
    max_tokens=None,
    max_validation_tokens=None,
    batch_size=32,
    sequence_length=35,
    fixed=None,
    ranges=None,
    directory="tuning_runs",
    project_name="language_model",
    overwrite=False,
    seed=None,
    verbose=1,
):
    """Searches `LanguageModelHyperModel`'s space on `corpus`; returns the tuner.

    Trains on `corpus.train` (at most `max_tokens` tokens per epoch) and
    scores `corpus.valid` (at most `max_validation_tokens`). With
    `overwrite=False` a search in `directory/project_name` resumes: finished
    trials are kept and only the remaining ones run.

    Args:
        corpus: a `keras_mogrifier.data.Corpus`.
        tuner: str. `"random"`, `"bayesian"` or `"hyperband"` (whose
            `max_epochs` is `epochs`). Defaults to `"random"`.
        max_trials: int. Defaults to `4`.
        epochs: int. Training epochs per trial. Defaults to `1`.
        max_tokens: int or None. Training tokens per epoch. Defaults to
            `None` (all).
        max_validation_tokens: int or None. Defaults to `None` (all).
        batch_size: int. Defaults to `32`.
        sequence_length: int. Defaults to `35`.
        fixed: dict or None. See `LanguageModelHyperModel`. Defaults to
            `None`.
        ranges: dict or None. See `LanguageModelHyperModel`. Defaults to
            `None`.
        directory: str. Defaults to `"tuning_runs"`.
        project_name: str. Defaults to `"language_model"`.
        overwrite: bool. Defaults to `False` (resume).
        seed: int or None. Seed of the oracle. Defaults to `None`.
        verbose: int. Verbosity of KerasTuner and `fit`. Defaults to `1`.

    Raises:
        SearchFailedError: when no trial completed.
    """
    epochs = _validation.positive_int("epochs", epochs)
    hypermodel = LanguageModelHyperModel(
        len(corpus.vocabulary),
        batch_size=batch_size,
        sequence_length=sequence_length,
        fixed=fixed,
        ranges=ranges,
        max_tokens=max_tokens,
        max_validation_tokens=max_validation_tokens,
    )
    search = build_tuner(
        hypermodel,
        tuner,
        max_trials=max_trials,
        max_epochs=epochs if tuner == "hyperband" else None,
        directory=directory,
        project_name=project_name,
        overwrite=overwrite,
        seed=seed,
    )
    run_search(
        search,
        lambda: search.search(
            corpus.train, validation_data=corpus.valid, epochs=epochs,
            verbose=verbose,
        ),
        LANGUAGE_MODEL_ADVICE,
    )
    return search


def load_or_train_model(corpus, path, epochs=1, max_tokens=None, log=print):
    """The `LanguageModel` saved at `path`, or a small one trained and saved there.

    The small model is the pipeline's `tiny` preset, trained for `epochs`
    epochs of at most `max_tokens` tokens, with its softmax temperature tuned
    on validation data (`keras_mogrifier.pipeline.run_experiment`).
    """
    if os.path.exists(path):
        log(f"loading the model saved at {path}")
        return keras.saving.load_model(path)
    from keras_mogrifier.pipeline.language_modeling import run_experiment

    log(f"training a small model (`tiny` preset, {epochs} epoch(s)) first")
    results = run_experiment(
        corpus,
        preset="tiny",
        training_overrides={"epochs": epochs, "max_tokens": max_tokens},
        dynamic=False,
        like_for_like=False,
        verbose=0,
        log=log,
    )
    model = results["model_object"]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    model.save(path)
    log(f"saved the model to {path}")
    return model


def run_dynamic_evaluation_search(
    model,
    corpus,
    tuner="random",
    max_trials=8,
    max_tokens=2000,
    test_tokens=None,
    statistics_tokens=None,
    statistics_batch_size=100,
    ranges=None,
    fixed=None,
    loss_reduction="mean",
    directory="tuning_runs",
    project_name="dynamic_evaluation",
    overwrite=False,
    seed=None,
    verbose=1,
):
    """Tunes dynamic evaluation of `model` on validation, applies it to test.

    Each trial is one pass over the first `max_tokens` validation tokens; the
    best setting is then applied to the test split (its first `test_tokens`)
    and compared with static evaluation of the same tokens.

    Args:
        model: a trained `LanguageModel`.
        corpus: a `keras_mogrifier.data.Corpus`.
        tuner: str. `"random"` or `"bayesian"`. Defaults to `"random"`.
        max_trials: int. Defaults to `8`.
        max_tokens: int or None. Validation tokens per trial. Defaults to
            `2000`.
        test_tokens: int or None. Test tokens of the final evaluation.
            Defaults to `None` (all).
        statistics_tokens: int or None. Training tokens of the gradient
            statistics. Defaults to `None` (all).
        statistics_batch_size: int. Defaults to `100`.
        ranges: dict or None. See `DynamicEvaluationTuner`. Defaults to
            `None`.
        fixed: dict or None. See `DynamicEvaluationTuner`. Defaults to
            `None`.
        loss_reduction: str. See `DynamicEvaluationTuner`. Defaults to
            `"mean"`.
        directory: str. Defaults to `"tuning_runs"`.
        project_name: str. Defaults to `"dynamic_evaluation"`.
        overwrite: bool. Defaults to `False` (resume).
        seed: int or None. Defaults to `None`.
        verbose: int. Defaults to `1`.

    Returns:
        `(tuner, results)`; `results` holds `valid_static` and `test_static`
        (static evaluation of the tuning slice and of the test tokens),
        `test_dynamic` (the best setting on the test tokens, with its
        `settings`).

    Raises:
        SearchFailedError: when no trial completed.
    """
    test_tokens = _validation.optional_positive_int("test_tokens", test_tokens)
    search = DynamicEvaluationTuner(
        model,
        corpus.train,
        oracle=tuner,
        max_trials=max_trials,
        ranges=ranges,
        fixed=fixed,
        loss_reduction=loss_reduction,
        statistics_batch_size=statistics_batch_size,
        statistics_tokens=statistics_tokens,
        seed=seed,
        directory=directory,
        project_name=project_name,
        overwrite=overwrite,
    )
    search.search(corpus.valid, max_tokens=max_tokens, verbose=verbose)
    valid = corpus.valid if max_tokens is None else corpus.valid[: max_tokens + 1]
    test = corpus.test if test_tokens is None else corpus.test[: test_tokens + 1]
    results = {
        "valid_static": search.evaluate_static(valid),
        "test_static": search.evaluate_static(test),
        "test_dynamic": search.evaluate(test),
    }
    return search, results
