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
is the estimate) or `"raw"` (the optimizer's current weights, which were at
least as good as the long average at this evaluation).
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
    Every `E` steps the caller evaluates the raw weights (`F¹`), `θS` (`Fˢ`)
    and `θL` (`Fᴸ`) and passes the three losses and the lengths `S`, `L` to
    `decide`, which returns what to do with the averages and which weights
    are the estimate until the next evaluation. The rule is Algorithm 2 of
    the paper ("Extensions to Two-Tailed Averaging", the version it
    recommends in practice), in its order:

    1. If `Fˢ ≤ Fᴸ`, or the long average stagnates (rule 3), the long
       average is replaced by the short one, which restarts (`"switch"`:
       `θL ← θS`, `L ← S`, `S ← 0`, and `Fᴸ ← Fˢ`); the paper's core rule.
    2. Else, if the short average stagnates, it restarts (`"restart_short"`).
    3. Stagnation (`patience`): an average stagnates when it has not
       improved its best loss for `patience` evaluations in a row.
    4. Raw weights (`prefer_raw_early=True`): then, at *any* evaluation
       where `L > 1` and `F¹ ≤ Fᴸ` (the long average after step 1), the raw
       weights are the estimate (`weights_in_use == "raw"`); if moreover
       `L = E` — the long average holds only the iterates since the previous
       evaluation, so the raw weights have been at least as good as every
       average so far — both averages restart (`"restart_both"`: `S, L ← 0`).
       Otherwise the averages are kept (or switched, by step 1) as they are.
       Early in training this defers to the raw weights while they improve
       faster than any average can; later it can happen again, e.g. after
       a learning-rate drop. (With evaluations not exactly `E` steps apart,
       as with `steps_per_execution`, `L = E` is read as `L ≤ E`.)

    `patience=None` turns stagnation off and `prefer_raw_early=False` the
    raw weights (the paper's core Algorithm 1). Otherwise the estimate is
    `θL`. All state is five numbers (`get_state` / `set_state`), so it can
    live in the optimizer's variables and survive a checkpoint.

    Args:
        patience: int or None. Evaluations without improvement before a
            stagnating average is switched out or restarted. Defaults to `3`.
        prefer_raw_early: bool. Whether to apply step 4 (Algorithm 2's "use
            the non-averaged weights if better"). Defaults to `True`.

    Example:

    >>> controller = TwoTailedController(patience=3)
    >>> controller.decide(5.0, 6.0, 6.0, short_length=4, long_length=4,
    ...                   evaluation_frequency=4).action
    'restart_both'
    >>> controller.decide(4.0, 3.9, 3.9, short_length=4, long_length=4,
    ...                   evaluation_frequency=4).action
    'switch'
    >>> decision = controller.decide(3.0, 3.7, 3.6, short_length=4,
    ...                              long_length=8, evaluation_frequency=4)
    >>> decision.action, decision.weights_in_use
    ('keep', 'raw')

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2209.12581), Two-Tailed
          Averaging: Anytime, Adaptive, Once-in-a-While Optimal Weight
          Averaging for Better Generalization, Algorithms 1 and 2.
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
        """`[raw_in_use, best_long, long_stale, best_short, short_stale]`."""
        return [
            float(self.raw_in_use),
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
        # Before any evaluation the raw weights are the only estimate.
        self.raw_in_use = state[0] > 0.5
        self.best_long = state[1]
        self.long_stale = int(round(state[2]))
        self.best_short = state[3]
        self.short_stale = int(round(state[4]))

    @property
    def weights_in_use(self):
        """`"raw"` when the last evaluation chose the raw weights (and before
        the first one), `"long"` otherwise."""
        return "raw" if self.raw_in_use and self.prefer_raw_early else "long"

    def _restart_short(self):
        self.best_short, self.short_stale = math.inf, 0

    def _switch(self, short_loss):
        # The old short average is the new long one, with its loss as best.
        self.best_long, self.long_stale = short_loss, 0
        self._restart_short()

    def decide(
        self,
        raw_loss,
        short_loss,
        long_loss,
        short_length,
        long_length,
        evaluation_frequency,
    ):
        """Updates the state with one evaluation and returns the decision.

        Args:
            raw_loss: float. Loss `F¹` of the optimizer's current weights.
            short_loss: float or None. Loss `Fˢ` of `θS`; `None` when `S = 0`.
            long_loss: float. Loss `Fᴸ` of `θL`.
            short_length: int. `S`, the iterates in `θS`.
            long_length: int. `L`, the iterates in `θL`.
            evaluation_frequency: int. `E`, the steps between evaluations.

        Returns:
            A `TwoTailedDecision(action, reason, weights_in_use)`.
        """
        raw_loss = _as_loss(raw_loss)
        has_short = short_loss is not None
        short_loss = _as_loss(short_loss)
        long_loss = _as_loss(long_loss)

        if long_loss < self.best_long:
            self.best_long, self.long_stale = long_loss, 0
        else:
            self.long_stale += 1
        if has_short:
            if short_loss < self.best_short:
                self.best_short, self.short_stale = short_loss, 0
            else:
                self.short_stale += 1

        # Algorithm 2, lines "if Fˢ ≤ Fᴸ or Fᴸ is stagnating ... elif Fˢ is
        # stagnating".
        stagnation = self.patience is not None
        action, reason = "keep", ""
        if has_short and short_loss <= long_loss:
            action, reason = "switch", "the short average is at least as good"
        elif stagnation and has_short and self.long_stale >= self.patience:
            action, reason = "switch", "the long average stagnated"
        elif stagnation and has_short and self.short_stale >= self.patience:
            action, reason = "restart_short", "the short average stagnated"
        if action == "switch":
            long_loss, long_length = short_loss, short_length
            self._switch(short_loss)
        elif action == "restart_short":
            self._restart_short()

        # Algorithm 2, "if L > 1 and F¹ ≤ Fᴸ: use the non-averaged weights;
        # if L = E, reinitialize (S, L ← 0, 0)".
        self.raw_in_use = (
            self.prefer_raw_early
            and long_length > 1
            and math.isfinite(raw_loss)
            and raw_loss <= long_loss
        )
        if self.raw_in_use:
            if long_length <= evaluation_frequency:
                self.best_long, self.long_stale = math.inf, 0
                self._restart_short()
                return TwoTailedDecision(
                    "restart_both",
                    "the raw weights are at least as good as every average "
                    "so far",
                    "raw",
                )
            reason = (reason + "; " if reason else "") + (
                "the raw weights are at least as good as the long average"
            )
            return TwoTailedDecision(action, reason, "raw")
        return TwoTailedDecision(action, reason, "long")
