import math

import numpy as np
import pytest

from keras_mogrifier.optimizers import TwoTailedController


E = 10


def run(controller, evaluations):
    """Scripted `(raw, short, long)` losses, every `E` steps; the actions.

    The lengths `S`, `L` follow the decisions as the optimizer's counts do.
    """
    actions, short_length, long_length = [], 0, 0
    for raw, short, long in evaluations:
        short_length, long_length = short_length + E, long_length + E
        decision = controller.decide(
            raw, short, long, short_length, long_length, E
        )
        short_length, long_length = apply(decision.action, short_length, long_length)
        actions.append(decision.action)
    return actions


def apply(action, short_length, long_length):
    """What `TwoTailedAveragingOptimizer` does to the counts."""
    if action == "switch":
        return 0, short_length
    if action == "restart_short":
        return 0, long_length
    if action == "restart_both":
        return 0, 0
    return short_length, long_length


class Algorithm2:
    """Two-Tailed Averaging's `evaluate_and_adapt`, transcribed from the paper.

    Melis, arXiv 2209.12581, Algorithm 1 (`add_weights`, `switch`) and
    Algorithm 2 ("Extensions to Two-Tailed Averaging", the version
    recommended in practice); melisgl/two-tailed-averaging `paper.tex`
    lines 284-303 and 344-368. The stagnation extension is left out
    (`patience=None` on our side): the paper does not define "stagnating"
    beyond "not improved for a few evaluations".
    """

    def __init__(self, evaluation_frequency):
        self.E = evaluation_frequency
        self.S = self.L = 0

    def add_weights(self):
        self.S, self.L = self.S + 1, self.L + 1

    def switch(self):
        self.S, self.L = 0, self.S

    def evaluate_and_adapt(self, f_raw, f_short, f_long):
        if f_short <= f_long:
            f_long = f_short
            self.switch()
        if self.L > 1 and f_raw <= f_long:  # use the non-averaged weights
            if self.L == self.E:  # if they have always been better so far
                self.S, self.L = 0, 0  # ... then reinitialize
            return f_raw, "raw", 1
        return f_long, "long", self.L


def test_decisions_are_algorithm_2_of_the_paper():
    """Over a long random script (ties included), our controller and the
    optimizer's counts make exactly the paper's decisions: the same `S` and
    `L` after every evaluation and the same estimate (raw or long)."""
    rng = np.random.default_rng(0)
    reference = Algorithm2(E)
    controller = TwoTailedController(patience=None, prefer_raw_early=True)
    short_length = long_length = 0
    in_use = []
    for _ in range(300):
        for _ in range(E):
            reference.add_weights()
        short_length, long_length = short_length + E, long_length + E
        # One decimal: equal losses are frequent, so `≤` against `<` shows.
        raw, short, long = np.round(rng.normal(3.5, 0.3, size=3), 1)
        _, expected_in_use, _ = reference.evaluate_and_adapt(raw, short, long)
        decision = controller.decide(raw, short, long, short_length, long_length, E)
        short_length, long_length = apply(decision.action, short_length, long_length)
        assert (short_length, long_length) == (reference.S, reference.L)
        assert decision.weights_in_use == expected_in_use
        assert controller.weights_in_use == expected_in_use
        in_use.append(expected_in_use)
    # The script exercises both estimates, and raw weights late in training.
    assert in_use[200:].count("raw") > 10 and in_use.count("long") > 100


def test_raw_weights_win_at_any_evaluation_not_only_early():
    """The issue's example: after the averages have taken over, raw 3.0
    against long 3.4 (short 3.5): Algorithm 2 returns the raw weights and
    keeps both averages (L = 3E > E: no reinitialisation)."""
    controller = TwoTailedController(patience=None)
    assert run(controller, [(4.0, 3.9, 3.9), (3.8, 3.85, 3.6)]) == ["switch", "keep"]
    assert controller.weights_in_use == "long"
    decision = controller.decide(3.0, 3.5, 3.4, short_length=10, long_length=30,
                                 evaluation_frequency=E)
    assert decision.action == "keep" and decision.weights_in_use == "raw"
    assert controller.weights_in_use == "raw"
    # A tie counts for the raw weights (F¹ ≤ Fᴸ), after a switch to L = 2E.
    decision = controller.decide(3.3, 3.3, 3.35, short_length=20, long_length=50,
                                 evaluation_frequency=E)
    assert decision.action == "switch" and decision.weights_in_use == "raw"
    # And the averages come back when they win again.
    decision = controller.decide(3.4, 3.2, 3.25, short_length=10, long_length=30,
                                 evaluation_frequency=E)
    assert decision.action == "switch" and decision.weights_in_use == "long"


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


def test_raw_weights_restart_both_averages_only_while_l_is_e():
    controller = TwoTailedController(patience=3)
    assert controller.weights_in_use == "raw"
    actions = run(
        controller,
        [
            (5.0, 6.0, 6.0),  # switch, L = E, raw better: reinitialise
            (4.0, 4.5, 4.5),  # again
            (3.6, 3.6, 3.6),  # a tie is "at least as good": again
            (3.45, 3.41, 3.4),  # long wins, raw loses: keep, L = 2E
        ],
    )
    assert actions == ["restart_both"] * 3 + ["keep"]
    assert controller.weights_in_use == "long"
    # L = 3E now: the raw weights win without reinitialising anything.
    assert controller.decide(1.0, 3.5, 3.35, 10, 30, E) == (
        "keep",
        "the raw weights are at least as good as the long average",
        "raw",
    )


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
    decision = controller.decide(math.nan, 4.0, 4.5, 10, 20, E)
    assert decision.action == "switch" and decision.weights_in_use == "long"
    decision = controller.decide(math.nan, math.nan, 4.0, 10, 20, E)
    assert decision.action == "keep" and decision.weights_in_use == "long"


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
