import keras
import keras_tuner
import numpy as np
import pytest

from keras_mogrifier import pipeline
from keras_mogrifier.data import StreamDataset
from keras_mogrifier.data import synthetic_corpus
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.tuning import DYNAMIC_EVALUATION_OBJECTIVE
from keras_mogrifier.tuning import DynamicEvaluationTuner
from keras_mogrifier.tuning import SearchFailedError
from keras_mogrifier.tuning import best_configuration
from keras_mogrifier.tuning import search_summary
from keras_mogrifier.tuning import trial_rows
from keras_mogrifier.tuning.dynamic_evaluation_tuner import ADVICE
from keras_mogrifier.tuning.dynamic_evaluation_tuner import FAILED_AS

from testing import CausalMean

STATISTICS_BATCH = 8
N = 5


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus(train_tokens=2000, valid_tokens=200, test_tokens=200)


@pytest.fixture(scope="module")
def trained(corpus):
    model = pipeline.build_language_model(
        len(corpus.vocabulary), {"units": 16, "num_layers": 1, "mogrifier_rounds": 1}, 8
    )
    pipeline.compile_language_model(
        model, {"optimizer": "adam", "learning_rate": 1e-2, "beta_1": 0.0, "jit_compile": "auto"}
    )
    model.fit(StreamDataset(corpus.train, 8, 20), epochs=3, verbose=0)
    return model


@pytest.fixture(scope="module")
def tuning_stream(corpus):
    # Text that repeats: adapting to it pays off, as on real documents.
    return np.tile(corpus.valid[:25], 8)


# On this toy model and repeated text, the settings that help are larger than
# on real text: the searches of these tests draw from this box. Its large-η
# edge may diverge, on one machine and not on another (η 0.0149 did on one
# CI machine); the tests assert what holds either way.
TOY_RANGES = {"learning_rate": (1e-3, 3e-2), "epsilon": (1e-5, 1e-3)}
# Krause et al.'s released setting (benkrause/dynamic-evaluation
# `dynamiceval.py` lines 21-26, 35), typed in: the first trial of a search.
KRAUSE = {"segment_length": 5, "learning_rate": 5e-5, "decay_rate": 2e-3, "epsilon": 2e-5}
KRAUSE_RATES = {k: v for k, v in KRAUSE.items() if k != "segment_length"}
DIVERGED = "Dynamic evaluation diverged"


def make_tuner(model, corpus, directory, cls=DynamicEvaluationTuner, **kwargs):
    kwargs.setdefault("max_trials", 3)
    kwargs.setdefault("fixed", {"segment_length": N})
    kwargs.setdefault("ranges", TOY_RANGES)
    return cls(
        model, corpus.train, seed=3, statistics_batch_size=STATISTICS_BATCH,
        directory=directory, project_name="dyneval", **kwargs,
    )


class CountingTuner(DynamicEvaluationTuner):
    trials_run = 0

    def run_trial(self, trial, *args, **kwargs):
        CountingTuner.trials_run += 1
        return super().run_trial(trial, *args, **kwargs)


@pytest.fixture(scope="module")
def searched(trained, corpus, tuning_stream, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("dyneval"))
    before = [np.copy(w) for w in trained.get_weights()]
    CountingTuner.trials_run = 0
    tuner = make_tuner(trained, corpus, directory, cls=CountingTuner)
    tuner.search(tuning_stream, verbose=0)
    return tuner, directory, before


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_search_finds_a_setting_better_than_static(searched, tuning_stream):
    # Whatever each trial does: it ran once and completed or diverged (then
    # recorded as such), and the best completed one beats static evaluation.
    tuner, _, _ = searched
    rows = trial_rows(tuner)
    assert CountingTuner.trials_run == len(rows) == 3
    for row in rows:
        assert row["status"] in ("COMPLETED", "FAILED")
        assert (row["status"] == "FAILED") == row["message"].startswith(DIVERGED)
    assert tuner.statistics_collected == 1  # one segment length, gathered once
    static = tuner.evaluate_static(tuning_stream)
    best = best_configuration(tuner)
    assert best["score"] == min(r["score"] for r in rows if r["status"] == "COMPLETED")
    assert best["score"] < static["loss"] - 0.2
    # η = 0 is static evaluation (to float rounding: static scoring reads
    # whole windows of segments per call).
    zero = tuner.evaluate(tuning_stream, {**best["values"], "learning_rate": 0.0})
    assert zero["loss"] == pytest.approx(static["loss"], rel=1e-6)


def test_trial_is_one_dynamic_pass_with_its_settings(
    searched, trained, corpus, tuning_stream
):
    tuner, _, _ = searched
    best = best_configuration(tuner)
    values = best["values"]
    settings = best["configuration"]
    # The default space is in the library's units: nothing is converted.
    assert settings == {"segment_length": N, **values}
    # An independent evaluator with those settings scores what the trial did.
    evaluator = DynamicEvaluator(
        trained.with_options(batch_size=STATISTICS_BATCH, samples=1),
        learning_rate=values["learning_rate"],
        decay_rate=values["decay_rate"],
        epsilon=values["epsilon"],
        segment_length=N,
        normalizer="global_mean",
    )
    evaluator.collect_gradient_statistics(corpus.train, batch_size=STATISTICS_BATCH)
    assert evaluator.evaluate(tuning_stream, verbose=0)["loss"] == pytest.approx(
        best["score"], rel=1e-5
    )


def test_trained_model_is_left_unchanged(searched, trained):
    # And the copy that the passes adapt holds the trained weights again, bit
    # for bit, after every trial (a diverged one included).
    tuner, _, before = searched
    for old, new in zip(before, trained.get_weights()):
        np.testing.assert_array_equal(old, new)
    trained_weights = {_local_path(v): v for v in trained.trainable_variables}
    adapted = tuner.evaluator.model.trainable_variables
    assert sorted(map(_local_path, adapted)) == sorted(trained_weights)
    for variable in adapted:
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(variable),
            keras.ops.convert_to_numpy(trained_weights[_local_path(variable)]),
        )


def _local_path(variable):
    return variable.path.split("/", 1)[-1]


def test_a_search_whose_draws_all_diverge_ends_with_its_first_trial(
    trained, corpus, tuning_stream, tmp_path, capsys
):
    # Without the limit on η/ε, every draw of this range (seed 3) has η > 20
    # and η/ε > 1000: each diverges at its first update. The first trial is
    # Krause et al.'s setting, which the range holds; eleven divergences in a
    # row do not stop the search. (10 segments per pass: a pass that diverges
    # is scored to its end on some backends.)
    tuner = make_tuner(
        trained, corpus, str(tmp_path), max_trials=12,
        ranges={"learning_rate": (5e-5, 1e30)}, max_learning_rate_over_epsilon=None,
    )
    tuner.search(tuning_stream[: 10 * N + 1], verbose=1)
    rows = trial_rows(tuner)
    assert len(rows) == 12
    assert rows[0]["status"] == "COMPLETED" and rows[0]["best"]
    assert rows[0]["values"] == pytest.approx(KRAUSE_RATES)  # n is fixed at 5
    for row in rows[1:]:
        values = row["values"]
        assert values["learning_rate"] > 20 and values["learning_rate"] > 1e3 * values["epsilon"]
    for row in rows[1:]:
        assert row["status"] == "FAILED"
        assert row["message"].startswith(DIVERGED) and "\n" not in row["message"]
        assert tuner.oracle.trials[row["trial_id"]].message == row["message"]
    # One line per diverged trial, no traceback, and the count in the summary.
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    lines = [line for line in captured.out.splitlines() if " diverged: " in line]
    assert lines == [f"Trial {row['trial_id']} diverged: {row['message']}" for row in rows[1:]]
    assert search_summary(tuner, ADVICE, FAILED_AS).startswith(
        "12 trial(s): 1 completed, 11 diverged\n"
    )
    assert tuner.evaluator_settings() == pytest.approx(KRAUSE)


@pytest.mark.parametrize("loss_reduction", ["mean", "sum"])
def test_draws_leave_out_the_corner_where_passes_diverge(
    trained, corpus, tmp_path, loss_reduction
):
    # The default box, 200 draws: none above η/ε = 10 in the library's
    # units; without the limit about half of them are (up to ~1e6).
    ratios = {}
    for limit in (10.0, None):
        tuner = make_tuner(
            trained, corpus, str(tmp_path / str(limit)), fixed={}, ranges=None,
            max_trials=201, loss_reduction=loss_reduction,
            max_learning_rate_over_epsilon=limit,
        )
        trials = [tuner.oracle.create_trial(f"tuner{i}") for i in range(201)]
        assert trials[0].hyperparameters.values == pytest.approx(tuner.oracle.first_values)
        ratios[limit] = [
            tuner.hypermodel.learning_rate_over_epsilon(trial.hyperparameters.values)
            for trial in trials[1:]
        ]
    assert max(ratios[10.0]) <= 10.0
    assert min(ratios[10.0]) < 1e-3  # the rest of the box is still drawn
    assert max(ratios[None]) > 1e3
    assert sum(ratio > 10.0 for ratio in ratios[None]) > 50


@pytest.mark.parametrize(
    "kwargs, first",
    [
        ({"fixed": {}, "ranges": None}, KRAUSE),
        # Lamb's units: ε × n, so that the evaluator gets Krause's 2e-5.
        ({"fixed": {}, "ranges": None, "loss_reduction": "sum"}, {**KRAUSE, "epsilon": 1e-4}),
        # Krause's grid scales η and λ by n / 5 (`dynamiceval.py` 279-280).
        ({"fixed": {"segment_length": 10}, "ranges": None},
         {"learning_rate": 1e-4, "decay_rate": 4e-3, "epsilon": 2e-5}),
        # Clipped into the ranges given.
        ({}, {"learning_rate": 1e-3, "decay_rate": 2e-3, "epsilon": 2e-5}),
        ({"fixed": {}, "ranges": {"segment_length": (8, 20), "epsilon": (1e-4, 1e-2)}},
         {"segment_length": 8, "learning_rate": 8e-5, "decay_rate": 3.2e-3, "epsilon": 1e-4}),
    ],
)
def test_first_trial_is_krauses_setting_in_the_searched_units(
    trained, corpus, tmp_path, kwargs, first
):
    tuner = make_tuner(trained, corpus, str(tmp_path), **kwargs)
    assert tuner.oracle.first_values == pytest.approx(first)
    if kwargs.get("loss_reduction") == "sum":
        assert tuner.evaluator_settings(first) == pytest.approx(KRAUSE)




def test_best_setting_applies_to_test_in_one_call(searched, corpus):
    tuner, _, _ = searched
    results = tuner.evaluate(corpus.test)
    assert results["num_tokens"] == len(corpus.test) - 1
    assert results["settings"] == tuner.evaluator_settings()
    assert np.isfinite(results["loss"])


def test_resume_reruns_nothing_and_reuses_statistics(
    searched, trained, corpus, tuning_stream
):
    tuner, directory, _ = searched
    CountingTuner.trials_run = 0
    resumed = make_tuner(trained, corpus, directory, cls=CountingTuner, overwrite=False)
    resumed.search(tuning_stream, verbose=0)
    assert CountingTuner.trials_run == 0
    assert [r["score"] for r in trial_rows(resumed)] == [r["score"] for r in trial_rows(tuner)]
    again = resumed.evaluate(tuning_stream)
    assert resumed.statistics_collected == 0  # read from the search's directory
    assert again["loss"] == pytest.approx(best_configuration(tuner)["score"], rel=1e-5)


@pytest.mark.parametrize(
    "learning_rates, max_loss, reason",
    [
        # Overflows: stopped at the first non-finite (or > 709.78 nats) token.
        ((1e36, 1e37), "auto", "diverged at token"),
        # Finite, but above the bound the tuner was given. (η 1 and 10 once
        # served here; their token losses now pass 709.78 nats, which the
        # evaluator itself refuses as diverged.)
        ((1e-4, 1e-3), 0.5, "above max_loss"),
    ],
)
@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_diverging_pass_is_a_failed_trial_and_the_search_ends_with_a_summary(
    trained, corpus, tuning_stream, tmp_path, learning_rates, max_loss, reason
):
    tuner = make_tuner(
        trained, corpus, str(tmp_path), max_trials=2,
        ranges={"learning_rate": learning_rates}, max_loss=max_loss,
        max_learning_rate_over_epsilon=None,
    )
    expected = 2 * np.log(len(corpus.vocabulary)) if max_loss == "auto" else max_loss
    assert tuner.max_loss == pytest.approx(expected)
    with pytest.raises(SearchFailedError) as raised:
        tuner.search(tuning_stream, verbose=0)
    rows = trial_rows(tuner)
    assert [row["status"] for row in rows] == ["FAILED", "FAILED"]
    assert all(reason in row["message"] for row in rows)
    summary = raised.value.summary
    assert summary.startswith("No trial completed. 2 trial(s): 2 diverged")
    assert summary.count(reason) == 2 and "What to try" in summary
    with pytest.raises(ValueError, match="completed trial"):
        tuner.evaluate(tuning_stream)


def test_the_papers_units_divide_epsilon_by_the_segment_length(trained, corpus, tmp_path):
    tuner = make_tuner(
        trained, corpus, str(tmp_path), loss_reduction="sum", fixed={}, ranges=None,
    )
    settings = tuner.evaluator_settings(
        {"learning_rate": 3e-4, "decay_rate": 1e-3, "epsilon": 1e-6, "segment_length": 4}
    )
    assert settings == {
        "segment_length": 4, "learning_rate": 3e-4, "decay_rate": 1e-3, "epsilon": 2.5e-7
    }


def test_mean_convention_and_custom_oracle(trained, corpus, tmp_path):
    oracle = keras_tuner.oracles.RandomSearchOracle(
        objective=DYNAMIC_EVALUATION_OBJECTIVE, max_trials=1
    )
    tuner = make_tuner(trained, corpus, str(tmp_path), oracle=oracle)
    settings = tuner.evaluator_settings(
        {"learning_rate": 5e-5, "decay_rate": 2e-3, "epsilon": 2e-5}
    )
    assert settings == {
        "segment_length": N, "learning_rate": 5e-5, "decay_rate": 2e-3, "epsilon": 2e-5
    }
    with pytest.raises(NotImplementedError, match="evaluate"):
        tuner.get_best_models()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ranges": {"segment_length": (0, 5)}, "fixed": {}}, "at least 1"),
        ({"ranges": {"decay_rate": (1e-2, 1e-6)}}, "low <= high"),
        ({"ranges": {"epsilon": (0.0, 1e-2)}}, "positive"),
        ({"ranges": {"segment_length": (2, 4)}}, "either fixed or searched"),
        ({"fixed": {"momentum": 0.9}}, "unknown"),
        ({"fixed": {"epsilon": 0.0}}, "epsilon"),
        ({"loss_reduction": "max"}, "loss_reduction"),
        ({"normalizer": "median"}, "normalizer"),
        ({"oracle": "grid"}, "oracle"),
        ({"oracle": keras_tuner.oracles.RandomSearchOracle(
            objective=keras_tuner.Objective("val_loss", "min"), max_trials=1)},
         "objective"),
        ({"fixed": {"segment_length": 300}}, "at least statistics_batch_size"),
        ({"max_loss": -1.0}, "max_loss"),
        ({"evaluator_options": {"learning_rate": 1e-3}}, "evaluator_options"),
        ({"evaluator_options": [("context_length", 8)]}, "evaluator_options"),
        # Passed on to the evaluator, whose checks run at once.
        ({"evaluator_options": {"context_length": 8}}, "context_length=None"),
        ({"max_learning_rate_over_epsilon": 0.0}, "max_learning_rate_over_epsilon"),
        # The toy box's ε reaches 1e-3: η ≥ 1 has η/ε ≥ 1000 everywhere.
        ({"ranges": {"learning_rate": (1.0, 2.0)}}, "learning_rate / epsilon"),
        # In lamb's units ε is n × ours: η/ε ≥ 1e-2 / (1e-3 / 5) = 50.
        ({"loss_reduction": "sum",
          "ranges": {"learning_rate": (1e-2, 1e-1), "epsilon": (1e-4, 1e-3)}},
         "learning_rate / epsilon"),
    ],
)
def test_bad_arguments_raise_clear_errors(trained, corpus, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_tuner(trained, corpus, str(tmp_path), **kwargs)


def test_bad_model_and_data_raise(trained, corpus, tmp_path):
    unbuilt = keras.Sequential([keras.layers.Embedding(10, 4)])
    with pytest.raises(ValueError, match="built"):
        DynamicEvaluationTuner(unbuilt, corpus.train, directory=str(tmp_path))
    with pytest.raises(ValueError, match="1-D array"):
        DynamicEvaluationTuner(trained, corpus.train[:2000].reshape(2, -1), directory=str(tmp_path))
    tuner = make_tuner(trained, corpus, str(tmp_path))
    with pytest.raises(ValueError, match="1-D array"):
        tuner.search(np.zeros((2, 5), "int32"), verbose=0)


def test_setup_errors_in_a_trial_stop_the_search(corpus, tuning_stream, tmp_path):
    # A stateful model with room for one stream cannot take statistics
    # batches of 8: that is fatal, not a failed trial.
    size = len(corpus.vocabulary)
    model = keras.Sequential([
        keras.Input(batch_shape=(1, None), dtype="int32"),
        keras.layers.Embedding(size, 4),
        keras.layers.LSTM(4, stateful=True, return_sequences=True),
        keras.layers.Dense(size),
    ])
    tuner = make_tuner(model, corpus, str(tmp_path), max_trials=1)
    with pytest.raises(keras_tuner.errors.FatalValueError):
        tuner.search(tuning_stream, verbose=0)


@pytest.mark.parametrize("rule", ["sgd", "rms_global_prior"])
def test_each_update_rule_has_its_space_and_searches(trained, corpus, tuning_stream, tmp_path, rule):
    from keras_mogrifier.tuning import DYNAMIC_EVALUATION_SEARCH_SPACES

    ranges = {"learning_rate": (0.3, 1.0)} if rule == "sgd" else TOY_RANGES
    tuner = make_tuner(trained, corpus, str(tmp_path), update_rule=rule, max_trials=2,
                       ranges=ranges)
    tuner.search(tuning_stream, verbose=0)
    best = best_configuration(tuner)
    space = DYNAMIC_EVALUATION_SEARCH_SPACES[rule]
    assert ("epsilon" in best["configuration"]) == ("epsilon" in space) == (rule != "sgd")
    # Plain SGD reads no gradient statistics: none were gathered.
    assert tuner.statistics_collected == (0 if rule == "sgd" else 1)
    static = tuner.evaluate_static(tuning_stream)
    assert best["score"] < static["loss"]
    evaluator = DynamicEvaluator(
        trained.with_options(batch_size=STATISTICS_BATCH, samples=1),
        update_rule=rule, normalizer="global_mean", **best["configuration"],
    )
    if rule != "sgd":
        evaluator.collect_gradient_statistics(corpus.train, batch_size=STATISTICS_BATCH)
    assert evaluator.evaluate(tuning_stream, verbose=0)["loss"] == pytest.approx(
        best["score"], rel=1e-5
    )


def test_a_windowed_model_gathers_its_statistics_once_on_windows(corpus, tmp_path):
    """A model without carried state, scored in windows of 12 tokens: one
    statistics pass, on windows of 12 training tokens, serves every
    segment length; the trials' evaluator reads the same windows."""
    vocab = len(corpus.vocabulary)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((None,), dtype="int32"),
        keras.layers.Embedding(vocab, 8),
        CausalMean(),
        keras.layers.Dense(vocab),
    ])
    tuner = make_tuner(
        model, corpus, str(tmp_path), max_trials=3, fixed={}, ranges={
            "segment_length": (2, 6), **TOY_RANGES}, evaluator_options={"context_length": 12},
    )
    tuner.search(corpus.valid[:60], verbose=0)
    lengths = {t.hyperparameters.values["segment_length"] for t in tuner.oracle.trials.values()}
    assert len(lengths) > 1  # several segment lengths ...
    assert tuner.statistics_collected == 1  # ... one statistics pass
    assert (tmp_path / "dyneval" / "gradient_statistics_window12.npz").exists()
    expected = DynamicEvaluator(model, context_length=12)
    expected.collect_gradient_statistics(corpus.train, batch_size=STATISTICS_BATCH)
    for path, value in expected.gradient_statistics.items():
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(tuner.evaluator.gradient_statistics[path]),
            keras.ops.convert_to_numpy(value), rtol=1e-5, atol=1e-12,
        )
    assert tuner.evaluator.context_length == 12
