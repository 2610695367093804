import math

import pytest

from keras_mogrifier.optimizers import TwoTailedController


def run(controller, evaluations):
    """`evaluations`: (raw, short, long) triples; returns the actions."""
    return [controller.decide(*e).action for e in evaluations]


def test_basic_rule_switches_when_short_is_at_least_as_good():
    controller = TwoTailedController(patience=None, prefer_raw_early=False)
    actions = run(
        controller,
        [
            (9.0, 5.0, 5.0),  # equal: switch (≤)
            (9.0, None, 4.0),  # S = 0: nothing to compare
            (9.0, 4.1, 4.0),
            (9.0, 3.9, 4.0),
            (9.0, 3.95, 3.9),
            (9.0, 3.97, 3.95),  # worse and worse: no stagnation rule
            (9.0, 3.99, 3.96),
            (9.0, 4.0, 3.97),
            (9.0, 4.1, 3.98),
        ],
    )
    assert actions == ["switch", "keep", "keep", "switch"] + ["keep"] * 5
    assert controller.weights_in_use == "long"


def test_early_phase_prefers_raw_weights_until_an_average_catches_up():
    controller = TwoTailedController(patience=3)
    assert controller.weights_in_use == "raw"
    actions = run(
        controller,
        [
            (5.0, 6.0, 6.0),
            (4.0, None, 4.5),
            (3.5, 3.6, 3.6),
            (3.4, 3.41, 3.4),  # long == raw: averaging has caught up
        ],
    )
    assert actions == ["restart_both"] * 3 + ["keep"]
    assert controller.weights_in_use == "long"
    # The phase is over for good, even if the raw weights win again.
    assert controller.decide(1.0, 3.3, 3.35).action == "switch"
    assert controller.weights_in_use == "long"


def test_long_average_stagnation_forces_a_switch():
    controller = TwoTailedController(patience=3, prefer_raw_early=False)
    actions = run(
        controller,
        [
            (9.0, 4.5, 4.0),  # best long 4.0, best short 4.5
            (9.0, 4.4, 4.1),  # long stale 1
            (9.0, 4.3, 4.2),  # long stale 2
            (9.0, 4.25, 4.3),  # long stale 3, but 4.25 <= 4.3: basic rule
        ],
    )
    assert actions == ["keep", "keep", "keep", "switch"]

    controller = TwoTailedController(patience=3, prefer_raw_early=False)
    actions = run(
        controller,
        [
            (9.0, 4.5, 4.0),
            (9.0, 4.4, 4.1),  # long stale 1, short improves
            (9.0, 4.3, 4.2),  # long stale 2, short improves
            (9.0, 4.29, 4.25),  # long stale 3: switch although short is worse
            (9.0, 4.4, 4.29),  # the new long starts from the short's 4.29
        ],
    )
    assert actions == ["keep", "keep", "keep", "switch", "keep"]
    assert controller.best_long == pytest.approx(4.29)
    assert controller.long_stale == 1


def test_short_average_stagnation_restarts_it():
    controller = TwoTailedController(patience=2, prefer_raw_early=False)
    actions = run(
        controller,
        [
            (9.0, 5.0, 4.0),  # long 4.0 best, short 5.0 best
            (9.0, 5.1, 3.9),  # short stale 1 (long improves)
            (9.0, 5.2, 3.8),  # short stale 2 -> restart short
            (9.0, None, 3.7),  # S = 0 at this evaluation
            (9.0, 6.0, 3.6),  # a fresh best for the new short average
        ],
    )
    assert actions == ["keep", "keep", "restart_short", "keep", "keep"]
    assert controller.best_short == 6.0 and controller.short_stale == 0


def test_nan_losses_count_as_infinitely_bad():
    controller = TwoTailedController(patience=None, prefer_raw_early=True)
    # A NaN raw loss never wins; a NaN short loss never switches.
    assert controller.decide(math.nan, 4.0, 4.5).action == "switch"
    assert controller.decide(1.0, math.nan, 4.0).action == "keep"


def test_state_round_trip_gives_the_same_decisions():
    script = [
        (5.0, 6.0, 6.0), (4.0, 3.9, 4.0), (3.8, 3.85, 3.8), (3.7, 3.9, 3.81),
        (3.6, 3.95, 3.82), (3.5, 3.96, 3.83), (3.4, 3.7, 3.84), (3.3, 3.69, 3.6),
    ]
    original = TwoTailedController(patience=2)
    first = run(original, script[:4])
    restored = TwoTailedController(patience=2)
    restored.set_state(original.get_state())
    assert run(restored, script[4:]) == run(original, script[4:])
    assert first[0] == "restart_both"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"patience": 0}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"prefer_raw_early": 1}, "prefer_raw_early"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoTailedController(**kwargs)
