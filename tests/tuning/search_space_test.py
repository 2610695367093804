import math

import keras_tuner
import pytest

from keras_mogrifier.tuning import search_space
from keras_mogrifier.tuning.search_space import DYNAMIC_EVALUATION_SEARCH_SPACE
from keras_mogrifier.tuning.search_space import LANGUAGE_MODEL_SEARCH_SPACE

# NumPy and Python only: the outcome is the same on every backend.
pytestmark = pytest.mark.once_per_suite

# Typed in from the papers (../shared/seeds), independently of the module.
# Mogrifier LSTM, Appendix A, Table 4: (low, high, spacing).
MOGRIFIER_TABLE_4 = {
    "learning_rate": (0.001, 0.004, "log"),
    "embedding_ratio": (0.0, 2.0, "linear"),  # input_embedding_ratio
    "l2": (5e-6, 1e-3, "log"),  # l2_penalty
    "input_dropout": (0.0, 0.9, "linear"),
    "cell_output_dropout": (0.0, 0.95, "linear"),  # inter_layer_dropout (CB §7)
    "state_dropout": (0.0, 0.8, "linear"),
    "output_dropout": (0.0, 0.95, "linear"),
    "mogrifier_rounds": (0, 6, "linear"),
    "mogrifier_rank": (-20, 100, "linear"),
}
# Mogrifier LSTM, Table 6 (word level).
MOGRIFIER_TABLE_6 = {
    "segment_length": (1, 20, "linear"),  # max_time_steps
    "learning_rate": (1e-6, 1e-3, "log"),
    "decay_rate": (1e-6, 1e-2, "log"),
    "epsilon": (1e-8, 1e-2, "log"),
}


@pytest.mark.parametrize("name", sorted(MOGRIFIER_TABLE_4))
def test_language_model_space_has_mogrifier_table_4(name):
    low, high, sampling = MOGRIFIER_TABLE_4[name]
    spec = LANGUAGE_MODEL_SEARCH_SPACE[name]
    assert (spec["min"], spec["max"], spec["sampling"]) == (low, high, sampling)
    assert "Table 4" in spec["source"]


def test_language_model_space_has_circling_back_and_dual_ranges():
    chrono = LANGUAGE_MODEL_SEARCH_SPACE["chrono_t_max"]
    assert chrono["min"] == pytest.approx(math.e**2)
    assert chrono["max"] == pytest.approx(math.e**5)
    assert chrono["sampling"] == "log"  # uniform in log T_max
    assert "Circling Back" in chrono["source"]
    assert set(LANGUAGE_MODEL_SEARCH_SPACE["cell"]["values"]) == {
        "mogrifier_lstm", "mogrifier_rlstm"
    }
    assert LANGUAGE_MODEL_SEARCH_SPACE["dual"]["values"] == [False, True]
    assert LANGUAGE_MODEL_SEARCH_SPACE["dual_units"]["values"] == [400, 850]
    dual_dropout = LANGUAGE_MODEL_SEARCH_SPACE["dual_dropout"]
    assert (dual_dropout["min"], dual_dropout["max"]) == (0.0, 0.5)
    for name in ("dual", "dual_units", "dual_dropout"):
        assert "Dual paper" in LANGUAGE_MODEL_SEARCH_SPACE[name]["source"]


@pytest.mark.parametrize("name", sorted(MOGRIFIER_TABLE_6))
def test_dynamic_evaluation_space_is_mogrifier_table_6_in_library_units(name):
    """Table 6 is for lamb's loss summed over a segment of n steps.

    Its gradient and its RMS (gathered from the same summed loss) are both n
    times the library's, so η and λ carry over and ε becomes ε/n: over the
    segment lengths of the box, the smallest ε is Table 6's over the longest n.
    """
    low, high, sampling = MOGRIFIER_TABLE_6[name]
    if name == "epsilon":
        longest = MOGRIFIER_TABLE_6["segment_length"][1]
        low = low / longest
    spec = DYNAMIC_EVALUATION_SEARCH_SPACE[name]
    assert (spec["min"], spec["max"], spec["sampling"]) == pytest.approx((low, high, sampling))
    assert "Table 6" in spec["source"]


def test_defaults_lie_in_their_ranges():
    for space in (LANGUAGE_MODEL_SEARCH_SPACE, DYNAMIC_EVALUATION_SEARCH_SPACE):
        for spec in space.values():
            if spec["type"] in ("float", "int"):
                assert spec["min"] <= spec["default"] <= spec["max"]
            else:
                assert spec["default"] in spec["values"]


def test_declare_makes_the_keras_tuner_hyperparameters():
    hp = keras_tuner.HyperParameters()
    for name, spec in LANGUAGE_MODEL_SEARCH_SPACE.items():
        search_space.declare(hp, name, spec)
    declared = {h.name: h for h in hp.space}
    lr = declared["learning_rate"]
    assert isinstance(lr, keras_tuner.engine.hyperparameters.Float)
    assert (lr.min_value, lr.max_value, lr.sampling) == (0.001, 0.004, "log")
    rank = declared["mogrifier_rank"]
    assert isinstance(rank, keras_tuner.engine.hyperparameters.Int)
    assert (rank.min_value, rank.max_value) == (-20, 100)
    assert isinstance(declared["dual"], keras_tuner.engine.hyperparameters.Boolean)
    assert list(declared["dual_units"].values) == [400, 850]
    assert hp.values["input_dropout"] == 0.73  # released configuration


def test_resolve_space_overrides_keeps_sampling_and_removes():
    space = search_space.resolve_space(
        LANGUAGE_MODEL_SEARCH_SPACE,
        ranges={"learning_rate": (1e-4, 1e-2), "cell": ["lstm"], "l2": None},
        remove={"dual"},
    )
    assert (space["learning_rate"]["min"], space["learning_rate"]["max"]) == (1e-4, 1e-2)
    assert space["learning_rate"]["sampling"] == "log"
    assert space["learning_rate"]["default"] == 2.3e-3  # still inside
    assert space["cell"]["values"] == ["lstm"]
    assert "l2" not in space and "dual" not in space
    # A default outside the new range moves to its low end.
    narrow = search_space.resolve_space(
        LANGUAGE_MODEL_SEARCH_SPACE, ranges={"input_dropout": (0.1, 0.2)}
    )
    assert narrow["input_dropout"]["default"] == 0.1
    # The module's spaces are not modified.
    assert LANGUAGE_MODEL_SEARCH_SPACE["learning_rate"]["min"] == 1e-3


@pytest.mark.parametrize(
    "ranges, message",
    [
        ({"learning_rate": (4e-3, 1e-3)}, "low <= high"),
        ({"learning_rate": (0.0, 1e-3)}, "positive"),
        ({"input_dropout": (0.0, 1.0)}, "in \\[0, 1\\)"),
        ({"state_dropout": 0.3}, "pair \\(low, high\\)"),
        ({"mogrifier_rounds": (0.5, 3)}, "pair \\(low, high\\) of integers"),
        ({"mogrifier_rounds": (-1, 3)}, "non-negative"),
        ({"chrono_t_max": (1.5, 10.0)}, "larger than 2"),
        ({"cell": ["gru"]}, "one of"),
        ({"cell": []}, "non-empty list"),
        ({"dual_units": [0, 8]}, "positive integer"),
        ({"l2": (float("nan"), 1e-3)}, "finite"),
        ({"units": (8, 16)}, "unknown"),
    ],
)
def test_bad_ranges_raise(ranges, message):
    with pytest.raises(ValueError, match=message):
        search_space.resolve_space(LANGUAGE_MODEL_SEARCH_SPACE, ranges)


def test_check_value_accepts_zero_learning_rate_only_when_fixed():
    assert search_space.check_value(DYNAMIC_EVALUATION_SEARCH_SPACE, "learning_rate", 0.0) == 0.0
    with pytest.raises(ValueError, match="at least 1"):
        search_space.check_value(DYNAMIC_EVALUATION_SEARCH_SPACE, "segment_length", 0)
    with pytest.raises(ValueError, match="positive"):
        search_space.check_value(DYNAMIC_EVALUATION_SEARCH_SPACE, "epsilon", 0.0)
    with pytest.raises(ValueError, match="positive"):
        search_space.resolve_space(
            DYNAMIC_EVALUATION_SEARCH_SPACE, {"learning_rate": (0.0, 1e-3)}
        )


def test_search_space_table_lists_every_name_with_its_source():
    table = search_space.search_space_table(DYNAMIC_EVALUATION_SEARCH_SPACE)
    for name in DYNAMIC_EVALUATION_SEARCH_SPACE:
        assert f"`{name}`" in table
    assert "[1e-06, 0.001] | log" in table
