import collections
import math

from keras_mogrifier import _validation

TwoTailedDecision = collections.namedtuple(
    "TwoTailedDecision", ["action", "reason", "weights_in_use"]
)
TwoTailedDecision.__doc__ = """What `TwoTailedController.decide` concluded.

`action` is one of `"keep"`, `"switch"` (the long average is replaced by the
short one, which restarts), `"restart_short"` or `"restart_both"`;
`reason` says why in words; `weights_in_use` is `"long"` (the long average
is the estimate) or `"raw"` (the optimizer's weights, early in training).
"""

ACTIONS = ("keep", "switch", "restart_short", "restart_both")


def _as_loss(value):
    """A loss as a float, with NaN and None (not evaluated) read as +inf."""
    if value is None:
        return math.inf
    value = float(value)
    return math.inf if math.isnan(value) else value


class TwoTailedController:
    """The switching and restart rule of Two-Tailed Averaging, in plain Python.

    Two-Tailed Averaging keeps two running means of the weights, a short one
    `θS` over the last `S` iterates and a long one `θL` over the last `L ≥ S`.
    Every `E` steps the caller evaluates the raw weights, `θS` and `θL` and
    passes the three losses to `decide`, which returns what to do with the
    averages. The rule, in the order it is applied:

    1. Early phase (`prefer_raw_early=True`): while the raw weights are
       strictly better than both averages, averaging is not helping yet, so
       both averages restart (`"restart_both"`) and the raw weights are the
       ones in use. The phase ends for good at the first evaluation where an
       average is at least as good as the raw weights.
    2. If `f(θS) <= f(θL)`, the long average is replaced by the short one and
       the short one restarts (`"switch"`), the paper's basic rule.
    3. If the long average has not improved its best loss for `patience`
       evaluations in a row, switch anyway (`"switch"`): a long average that
       stagnates holds iterates that are too old.
    4. If the short average has not improved its best loss for `patience`
       evaluations in a row, restart it (`"restart_short"`).

    `patience=None` turns rules 3 and 4 off (the paper's basic algorithm).
    The estimate is `θL` outside the early phase. All state is five numbers
    (`get_state` / `set_state`), so it can live in the optimizer's variables
    and survive a checkpoint.

    Args:
        patience: int or None. Evaluations without improvement before a
            stagnating average is switched out or restarted. Defaults to `3`.
        prefer_raw_early: bool. Whether to apply rule 1. Defaults to `True`.

    Example:

    >>> controller = TwoTailedController(patience=3)
    >>> controller.decide(raw_loss=5.0, short_loss=6.0, long_loss=6.0).action
    'restart_both'
    >>> controller.decide(raw_loss=4.0, short_loss=3.9, long_loss=3.9).action
    'switch'
    >>> controller.decide(raw_loss=3.8, short_loss=3.7, long_loss=3.6).action
    'keep'

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2209.12581), Two-Tailed
          Averaging: Anytime, Adaptive, Once-in-a-While Optimal Weight
          Averaging for Better Generalization.
    """

    STATE_SIZE = 5

    def __init__(self, patience=3, prefer_raw_early=True):
        self.patience = _validation.optional_positive_int("patience", patience)
        if not isinstance(prefer_raw_early, bool):
            raise ValueError(
                "Expected `prefer_raw_early` to be a bool. Received: "
                f"prefer_raw_early={prefer_raw_early!r}"
            )
        self.prefer_raw_early = prefer_raw_early
        self.set_state(self.initial_state())

    @staticmethod
    def initial_state():
        """The state before the first evaluation, as a list of floats."""
        return [1.0, math.inf, 0.0, math.inf, 0.0]

    def get_state(self):
        """`[early_phase, best_long, long_stale, best_short, short_stale]`."""
        return [
            float(self.early_phase),
            self.best_long,
            float(self.long_stale),
            self.best_short,
            float(self.short_stale),
        ]

    def set_state(self, state):
        state = [float(s) for s in state]
        if len(state) != self.STATE_SIZE:
            raise ValueError(
                f"Expected `state` to have {self.STATE_SIZE} entries. "
                f"Received: state={state}"
            )
        self.early_phase = state[0] > 0.5
        self.best_long = state[1]
        self.long_stale = int(round(state[2]))
        self.best_short = state[3]
        self.short_stale = int(round(state[4]))

    @property
    def weights_in_use(self):
        """`"raw"` in the early phase, `"long"` afterwards."""
        return "raw" if self.early_phase and self.prefer_raw_early else "long"

    def _restart_short(self):
        self.best_short, self.short_stale = math.inf, 0

    def _switch(self, short_loss):
        # The old short average is the new long one, with its loss as best.
        self.best_long, self.long_stale = short_loss, 0
        self._restart_short()

    def decide(self, raw_loss, short_loss, long_loss):
        """Updates the state with one evaluation and returns the decision.

        Args:
            raw_loss: float. Loss of the optimizer's current weights.
            short_loss: float or None. Loss of `θS`; `None` when `S = 0`.
            long_loss: float. Loss of `θL`.

        Returns:
            A `TwoTailedDecision(action, reason, weights_in_use)`.
        """
        raw_loss = _as_loss(raw_loss)
        has_short = short_loss is not None
        short_loss = _as_loss(short_loss)
        long_loss = _as_loss(long_loss)

        if self.early_phase and self.prefer_raw_early:
            if raw_loss < min(short_loss, long_loss):
                self.best_long, self.long_stale = math.inf, 0
                self._restart_short()
                return TwoTailedDecision(
                    "restart_both",
                    "the raw weights are better than both averages",
                    "raw",
                )
            self.early_phase = False

        if long_loss < self.best_long:
            self.best_long, self.long_stale = long_loss, 0
        else:
            self.long_stale += 1
        if has_short:
            if short_loss < self.best_short:
                self.best_short, self.short_stale = short_loss, 0
            else:
                self.short_stale += 1

        if has_short and short_loss <= long_loss:
            self._switch(short_loss)
            return TwoTailedDecision(
                "switch", "the short average is at least as good", "long"
            )
        stagnation = self.patience is not None
        if stagnation and has_short and self.long_stale >= self.patience:
            self._switch(short_loss)
            return TwoTailedDecision(
                "switch", "the long average stagnated", "long"
            )
        if stagnation and has_short and self.short_stale >= self.patience:
            self._restart_short()
            return TwoTailedDecision(
                "restart_short", "the short average stagnated", "long"
            )
        return TwoTailedDecision("keep", "", "long")
