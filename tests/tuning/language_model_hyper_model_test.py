import math

import keras
import keras_tuner
import numpy as np
import pytest

from keras_mogrifier.data import StreamDataset
from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.tuning import LANGUAGE_MODEL_OBJECTIVE
from keras_mogrifier.tuning import LanguageModelHyperModel
from keras_mogrifier.tuning import best_configuration
from keras_mogrifier.tuning import build_tuner
from keras_mogrifier.tuning import trial_rows
from keras_mogrifier.tuning import trials_table

BATCH, WINDOW = 4, 10
# "auto": XLA on JAX (op by op, a trial took minutes), none on TensorFlow's
# CPU (graph mode) and PyTorch.
TINY = {"units": 12, "num_layers": 1, "jit_compile": "auto"}
# Few rounds keep the graphs (and the tracing time of each trial) small.
SEARCH_RANGES = {"mogrifier_rounds": (1, 2), "dual_units": [6, 12]}


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus(train_tokens=450, valid_tokens=120, test_tokens=50)


def hypermodel_for(corpus, **kwargs):
    kwargs.setdefault("fixed", dict(TINY))
    return LanguageModelHyperModel(
        len(corpus.vocabulary), batch_size=BATCH, sequence_length=WINDOW, **kwargs
    )


class CountFits(keras.callbacks.Callback):
    """Counts `fit` calls across the deep copies KerasTuner makes."""

    started = 0

    def on_train_begin(self, logs=None):
        CountFits.started += 1


class ScriptedOracle(keras_tuner.Oracle):
    """Proposes the given values in order (the rest at their defaults)."""

    def __init__(self, script, **kwargs):
        super().__init__(
            objective=LANGUAGE_MODEL_OBJECTIVE, max_trials=len(script), **kwargs
        )
        self.script = script

    def populate_space(self, trial_id):
        values = {hp.name: hp.default for hp in self.hyperparameters.space}
        values.update(self.script[len(self.trials)])
        return {"status": "RUNNING", "values": values}


# === The search space and how it maps to the model ===


def test_declares_the_papers_space_with_conditions(corpus):
    hypermodel = hypermodel_for(corpus)
    hp = keras_tuner.HyperParameters()
    hypermodel.configuration(hp)
    declared = {h.name: h for h in hp.space}
    assert set(declared) == {
        "learning_rate", "embedding_ratio", "l2", "input_dropout",
        "cell_output_dropout", "state_dropout", "output_dropout",
        "mogrifier_rounds", "mogrifier_rank", "chrono_t_max", "cell", "dual",
        "dual_units", "dual_dropout", "mixture_of_softmaxes",
    }
    assert (declared["chrono_t_max"].min_value, declared["chrono_t_max"].max_value) == (
        pytest.approx(math.exp(2)), pytest.approx(math.exp(5))
    )
    assert declared["chrono_t_max"].sampling == "log"
    for name in ("dual_units", "dual_dropout"):
        (condition,) = declared[name].conditions
        assert (condition.name, list(condition.values)) == ("dual", [True])
    # Both default cells are Mogrifier cells: rounds and rank always apply.
    assert declared["mogrifier_rounds"].conditions == []


def test_configuration_maps_hyperparameters_to_the_model(corpus):
    hypermodel = hypermodel_for(corpus, fixed={"units": 8, "num_layers": 2})
    config = hypermodel.configuration(
        {"embedding_ratio": 0.25, "mogrifier_rank": 3, "learning_rate": 3e-3,
         "dual": True, "dual_units": 400, "chrono_t_max": 20.0}
    )
    model, training = config["model"], config["training"]
    assert model["embedding_dim"] == 2  # round(0.25 · 8)
    assert model["mogrifier_rank"] == 2  # clipped to layer 1's side (2 < 3)
    assert model["dual"] is True and model["dual_units"] == 400
    assert model["chrono_t_max"] == 20.0
    assert training["learning_rate"] == 3e-3
    assert (training["batch_size"], training["sequence_length"]) == (BATCH, WINDOW)
    # The Mogrifier paper's optimiser: Adam with β₁ = 0, clipped at 10 on
    # lamb's loss summed over the window, 10 / T on ours.
    assert (training["optimizer"], training["beta_1"]) == ("adam", 0.0)
    assert training["global_clipnorm"] == pytest.approx(10.0 / WINDOW)

    def mapped(**values):
        return hypermodel.configuration(values)["model"]

    assert mapped(embedding_ratio=1.5)["embedding_dim"] == 8  # > 1: = units
    assert mapped(embedding_ratio=0.0)["embedding_dim"] == 1
    assert mapped(embedding_ratio=0.5)["embedding_dim"] == 4
    assert mapped(mogrifier_rank=-20)["mogrifier_rank"] is None  # ≤ 0: full
    assert mapped(mogrifier_rank=0)["mogrifier_rank"] is None
    assert mapped(mogrifier_rank=5, embedding_ratio=1.0)["mogrifier_rank"] == 5
    assert mapped(mogrifier_rank=8, embedding_ratio=1.0)["mogrifier_rank"] is None
    assert mapped(mogrifier_rank=100)["mogrifier_rank"] is None
    assert "dual_units" not in mapped(dual=False)  # inactive

    one_layer = hypermodel_for(corpus, fixed={"units": 8, "num_layers": 1})
    # One layer of 4 × 8 matrices: rank 4 or more is full rank.
    assert one_layer.configuration(
        {"embedding_ratio": 0.5, "mogrifier_rank": 6}
    )["model"]["mogrifier_rank"] is None


def test_fixed_values_leave_the_search(corpus):
    hypermodel = hypermodel_for(
        corpus,
        fixed={**TINY, "embedding_dim": 6, "cell": "rlstm", "dual": False,
               "input_dropout": 0.1},
    )
    assert set(hypermodel.search_space).isdisjoint(
        {"embedding_ratio", "cell", "mogrifier_rounds", "mogrifier_rank",
         "dual", "dual_units", "dual_dropout", "input_dropout"}
    )
    model = hypermodel.configuration({})["model"]
    assert (model["embedding_dim"], model["cell"], model["input_dropout"]) == (6, "rlstm", 0.1)
    # Mixed cells: rounds and rank only for the Mogrifier ones.
    mixed = hypermodel_for(corpus, ranges={"cell": ["lstm", "mogrifier_rlstm"]})
    hp = keras_tuner.HyperParameters()
    mixed.configuration(hp)
    (condition,) = {h.name: h for h in hp.space}["mogrifier_rank"].conditions
    assert (condition.name, list(condition.values)) == ("cell", ["mogrifier_rlstm"])


def test_build_returns_a_compiled_stateful_model(corpus):
    hypermodel = hypermodel_for(corpus)
    hp = keras_tuner.HyperParameters()
    model = hypermodel.build(hp)
    assert model.stateful and model.state_capacity == BATCH
    assert model.units == 12 and model.input_dropout == hp.values["input_dropout"]
    assert float(model.optimizer.learning_rate) == pytest.approx(hp.values["learning_rate"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ranges": {"learning_rate": (1e-2, 1e-3)}}, "low <= high"),
        ({"ranges": {"output_dropout": (0.0, 1.5)}}, "in \\[0, 1\\)"),
        ({"ranges": {"mogrifier_rank": (1.5, 4)}}, "integers"),
        ({"ranges": {"bogus": (0, 1)}}, "unknown"),
        ({"ranges": {"input_dropout": (0.1, 0.2)},
          "fixed": {**TINY, "input_dropout": 0.3}}, "either fixed or searched"),
        ({"fixed": {**TINY, "input_dropout": 1.2}}, "input_dropout"),
        ({"fixed": {**TINY, "bogus": 1}}, "unknown"),
        ({"fixed": {**TINY, "units": 0}}, "units"),
        ({"fixed": {**TINY, "optimizer": "lbfgs"}}, "optimizer"),
        ({"ranges": [("l2", (1e-5, 1e-4))]}, "dict"),
        ({"eval_batch_size": BATCH + 1}, "eval_batch_size"),
    ],
)
def test_bad_arguments_raise_clear_errors(corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        hypermodel_for(corpus, **kwargs)


def test_fit_without_validation_data_is_fatal(corpus):
    hypermodel = hypermodel_for(corpus)
    hp = keras_tuner.HyperParameters()
    model = hypermodel.build(hp)
    with pytest.raises(keras_tuner.errors.FatalValueError, match="validation_data"):
        hypermodel.fit(hp, model, corpus.train)
    with pytest.raises(keras_tuner.errors.FatalValueError, match="token ids in"):
        hypermodel.fit(hp, model, corpus.train + 10_000, validation_data=corpus.valid)


# === Searches ===


@pytest.fixture(scope="module")
def random_search(corpus, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("search"))
    hypermodel = hypermodel_for(corpus, ranges=SEARCH_RANGES)
    tuner = build_tuner(
        hypermodel, "random", max_trials=2, directory=directory,
        project_name="lm", seed=7,
    )
    CountFits.started = 0
    tuner.search(
        corpus.train, validation_data=corpus.valid, epochs=2, verbose=0,
        callbacks=[CountFits()],
    )
    return tuner, directory


# Loading a checkpoint into a fresh model skips the (unused) optimizer slots.
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_random_search_runs_and_picks_the_better_trial(corpus, random_search):
    tuner, _ = random_search
    rows = trial_rows(tuner)
    assert [r["status"] for r in rows] == ["COMPLETED", "COMPLETED"]
    assert CountFits.started == 2
    scores = [r["score"] for r in rows]
    assert all(math.isfinite(s) and s < len(corpus.vocabulary) for s in scores)
    assert scores[0] != scores[1]
    best = best_configuration(tuner)
    assert best["score"] == min(scores)
    winner = rows[int(np.argmin(scores))]
    assert winner["best"] and best["values"] == winner["values"]
    assert tuner.get_best_hyperparameters()[0].values == winner["values"]
    # The best epoch's weights were kept: re-scoring them on validation gives
    # the recorded objective.
    model = tuner.get_best_models(1)[0]
    valid = StreamDataset(corpus.valid, BATCH, WINDOW, drop_remainder=False)
    logs = model.evaluate(valid, verbose=0, return_dict=True)
    assert logs["perplexity"] == pytest.approx(best["score"], rel=1e-5)
    # The configuration retrains through the pipeline as it was tried.
    assert best["configuration"]["training"]["learning_rate"] == best["values"]["learning_rate"]
    table = trials_table(tuner)
    assert "val_perplexity" in table and "COMPLETED" in table
    assert f"*{winner['trial_id']}" in table


def test_search_resumes_without_rerunning_finished_trials(corpus, random_search):
    tuner, directory = random_search
    hypermodel = hypermodel_for(corpus, ranges=SEARCH_RANGES)
    resumed = build_tuner(
        hypermodel, "random", max_trials=2, directory=directory,
        project_name="lm", seed=7, overwrite=False,
    )
    CountFits.started = 0
    resumed.search(
        corpus.train, validation_data=corpus.valid, epochs=2, verbose=0,
        callbacks=[CountFits()],
    )
    assert CountFits.started == 0
    assert [r["score"] for r in trial_rows(resumed)] == [
        r["score"] for r in trial_rows(tuner)
    ]


class StubModel:
    """Stands in for a trained model: `fit` returns the given history."""

    def __init__(self, history):
        self.history = history

    def fit(self, *args, **kwargs):
        return _History(self.history)


class _History:
    def __init__(self, history):
        self.history = history


@pytest.mark.parametrize(
    "history, message",
    [
        ({"loss": [5.2, float("nan")], "val_perplexity": [180.0, float("nan")]},
         "non-finite training loss"),
        ({"loss": [5.5e6], "val_perplexity": [float("inf")]}, "no finite val_perplexity"),
        ({"loss": [], "val_perplexity": []}, "non-finite training loss"),
    ],
)
def test_divergence_criterion(corpus, history, message):
    hypermodel = hypermodel_for(corpus)
    hp = keras_tuner.HyperParameters()
    with pytest.raises(keras_tuner.errors.FailedTrialError, match=message):
        hypermodel.fit(hp, StubModel(history), corpus.train, validation_data=corpus.valid)
    # A finite last loss with one finite val_perplexity is a finished trial.
    fine = {"loss": [5.2, 5.1], "val_perplexity": [float("inf"), 170.0]}
    assert hypermodel.fit(
        hp, StubModel(fine), corpus.train, validation_data=corpus.valid
    ).history is fine


def test_diverging_trial_fails_and_the_search_goes_on(corpus, tmp_path):
    hypermodel = hypermodel_for(
        corpus, fixed={**TINY, "cell": "lstm", "dual": False}
    )
    oracle = ScriptedOracle(
        [
            {"learning_rate": 1e30},  # NaN loss: training stops at once
            {"learning_rate": 3e-3},
        ]
    )
    tuner = keras_tuner.Tuner(
        oracle=oracle, hypermodel=hypermodel, directory=str(tmp_path), project_name="div"
    )
    tuner.search(corpus.train, validation_data=corpus.valid, epochs=1, verbose=0)
    rows = trial_rows(tuner)
    assert [r["status"] for r in rows] == ["FAILED", "COMPLETED"]
    assert "diverged: non-finite training loss" in rows[0]["message"]
    assert best_configuration(tuner)["trial_id"] == rows[1]["trial_id"]
    assert "trial 0 FAILED: " in trials_table(tuner)


def test_lambs_l2_and_clip_are_converted_to_the_hypermodels_window():
    """Table 4's l2_penalty and the paper's clip 10 are on lamb's loss summed
    over T steps (lamb/lm.py 430-446, 462): l2 / (2T) and 10 / T here."""
    from keras_mogrifier.tuning import LanguageModelHyperModel

    hypermodel = LanguageModelHyperModel(100, batch_size=4, sequence_length=35)
    config = hypermodel.configuration({"l2": 7e-4})
    assert config["model"]["l2"] == pytest.approx(7e-4 / 70)
    assert config["training"]["global_clipnorm"] == pytest.approx(10 / 35)
    # Adam's ε 1e-8 (lamb_flags.py 150) on the summed loss is 1e-8 / T here.
    assert config["training"]["epsilon"] == pytest.approx(1e-8 / 35)
    # A fixed value is taken in the library's units, as given.
    fixed = LanguageModelHyperModel(100, batch_size=4, sequence_length=35, fixed={"l2": 1e-6})
    assert fixed.configuration({})["model"]["l2"] == 1e-6
