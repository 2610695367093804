import keras_tuner
import pytest

from keras_mogrifier.tuning import LanguageModelHyperModel
from keras_mogrifier.tuning import best_configuration
from keras_mogrifier.tuning import build_tuner
from keras_mogrifier.tuning import trials_table


@pytest.fixture
def hypermodel():
    return LanguageModelHyperModel(50, batch_size=2, sequence_length=5, fixed={"units": 4})


def test_random_search_gets_the_objective_and_failure_limit(hypermodel, tmp_path):
    tuner = build_tuner(hypermodel, "random", max_trials=3, directory=str(tmp_path))
    assert isinstance(tuner, keras_tuner.RandomSearch)
    assert tuner.oracle.objective.name == "val_perplexity"
    assert tuner.oracle.objective.direction == "min"
    assert tuner.oracle.max_trials == 3
    assert tuner.oracle.max_consecutive_failed_trials == 10
    # Every hyperparameter of the space is known to the oracle up front.
    names = {hp.name for hp in tuner.oracle.get_space().space}
    assert {"learning_rate", "mogrifier_rank", "dual_units"} <= names


def test_hyperband_takes_max_epochs(hypermodel, tmp_path):
    tuner = build_tuner(hypermodel, "hyperband", max_epochs=3, directory=str(tmp_path))
    assert isinstance(tuner, keras_tuner.Hyperband)
    assert tuner.oracle.max_epochs == 3
    with pytest.raises(ValueError, match="max_epochs"):
        build_tuner(hypermodel, "hyperband", directory=str(tmp_path / "b"))


def test_no_trials_yet(hypermodel, tmp_path):
    tuner = build_tuner(hypermodel, max_trials=1, directory=str(tmp_path))
    assert trials_table(tuner).split()[:3] == ["trial", "status", "val_perplexity"]
    with pytest.raises(ValueError, match="completed trial"):
        best_configuration(tuner)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tuner": "grid"}, "tuner"),
        ({"max_trials": 0}, "max_trials"),
        ({"max_consecutive_failed_trials": 0}, "max_consecutive_failed_trials"),
    ],
)
def test_bad_arguments(hypermodel, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_tuner(hypermodel, directory=str(tmp_path), **kwargs)


def test_objective_is_required_without_a_hypermodel_objective(tmp_path):
    with pytest.raises(ValueError, match="objective"):
        build_tuner(keras_tuner.HyperModel(), directory=str(tmp_path))
