"""Choosing the learning and decay rates of dynamic evaluation."""

import itertools
import math

from keras.utils import Progbar

from keras_mogrifier import _validation
from keras_mogrifier.evaluation.divergence_error import DivergenceError
from keras_mogrifier.evaluation.update_rules import NEEDS_STATISTICS

STRATEGIES = ("grid", "sequential")


def search_dynamic_evaluation(
    evaluator,
    x,
    learning_rates=None,
    decay_rates=None,
    settings=None,
    strategy="grid",
    batch_size=None,
    verbose=0,
    on_result=None,
):
    """Tries `(learning_rate, decay_rate)` settings, one pass each; returns the best.

    Each setting is one dynamic evaluation of `x` (typically a slice of the
    validation stream) with the evaluator's gradient statistics, which must
    have been collected before. The best setting is the one with the lowest
    loss (a diverged pass, which stops at its first non-finite segment, never
    wins; ties keep the first; when every pass diverges a `DivergenceError`
    lists them). The evaluator's own `learning_rate` and `decay_rate` are left as
    they were; set them from the result.

    - `settings`: an explicit list of `(learning_rate, decay_rate)` pairs.
    - `strategy="grid"`: every pair of `learning_rates` × `decay_rates`.
    - `strategy="sequential"`: Krause et al.'s order — tune the learning rate
      first, with the evaluator's `decay_rate`, then the decay rate at the best
      learning rate (`len(learning_rates) + len(decay_rates)` passes, one
      fewer when the evaluator's `decay_rate` is among `decay_rates`: no
      setting runs twice).

    A list that is not given is the evaluator's current value.

    Args:
        evaluator: `DynamicEvaluator`. With a model and gradient statistics.
        x: token ids, as for `DynamicEvaluator.evaluate`.
        learning_rates: list of float or `None`. Candidate η. Defaults to
            `None`.
        decay_rates: list of float or `None`. Candidate λ. Defaults to `None`.
        settings: list of `(learning_rate, decay_rate)` or `None`. Replaces
            the two lists. Defaults to `None`.
        strategy: `"grid"` or `"sequential"`. Defaults to `"grid"`.
        batch_size: int or `None`. As for `evaluate`. Defaults to `None`.
        verbose: int. 1 shows a progress bar over the settings; 2 prints one
            line per setting as it finishes (for logs). Defaults to 0.
        on_result: callable or `None`. Called after every pass with its
            result dict (as in `results`) and `(k, total)`, e.g. to log it.
            Defaults to `None`.

    Returns:
        A dict with the best `learning_rate`, `decay_rate`, `loss` and
        `perplexity`, and `results`: one dict per pass, in order, with
        `learning_rate`, `decay_rate`, `loss`, `perplexity`,
        `bits_per_token` and `num_tokens` (a diverged pass: infinite loss, 0
        tokens, and its `DivergenceError` as `diverged`).

    Example:

    >>> import numpy as np
    >>> import keras
    >>> from keras_mogrifier.evaluation import (
    ...     DynamicEvaluator, search_dynamic_evaluation)
    >>> model = keras.Sequential([
    ...     keras.Input(shape=(None,), dtype="int32"),
    ...     keras.layers.Embedding(20, 8),
    ...     keras.layers.LSTM(8, return_sequences=True),
    ...     keras.layers.Dense(20),
    ... ])
    >>> ev = DynamicEvaluator(model, segment_length=4)
    >>> _ = ev.collect_gradient_statistics(np.arange(200) % 20, batch_size=4)
    >>> best = search_dynamic_evaluation(
    ...     ev, np.tile(np.arange(7), 8),
    ...     learning_rates=[0.0, 1e-3, 1e-2], decay_rates=[0.0, 1e-2])
    >>> len(best["results"])
    6

    Reference:
        Krause et al., "Dynamic Evaluation of Neural Sequence Models", ICML
        2018, §5 (hyper-parameter tuning).
    """
    from keras_mogrifier.evaluation.dynamic_evaluator import DynamicEvaluator

    if not isinstance(evaluator, DynamicEvaluator):
        raise ValueError(
            "Expected `evaluator` to be a `DynamicEvaluator`. "
            f"Received: evaluator={evaluator!r}"
        )
    _validation.one_of("strategy", strategy, STRATEGIES)
    if verbose not in (0, 1, 2) or isinstance(verbose, bool):
        raise ValueError(f"Expected `verbose` to be 0, 1 or 2. Received: verbose={verbose!r}")
    if settings is not None:
        if learning_rates is not None or decay_rates is not None:
            raise ValueError(
                "Expected either `settings` or `learning_rates`/`decay_rates`. "
                f"Received: settings={settings!r}, learning_rates="
                f"{learning_rates!r}, decay_rates={decay_rates!r}"
            )
        settings = [_pair(s) for s in _non_empty("settings", settings)]
        strategy = "grid"
    else:
        learning_rates = _rates("learning_rates", learning_rates, evaluator.learning_rate)
        decay_rates = _rates("decay_rates", decay_rates, evaluator.decay_rate)
    if evaluator._statistics is None and NEEDS_STATISTICS[evaluator.update_rule]:
        raise ValueError(
            "Expected `evaluator` to have gradient statistics (its "
            f"update_rule={evaluator.update_rule!r} divides by their RMS): "
            "call `collect_gradient_statistics` first. Received none."
        )

    original = (evaluator.learning_rate, evaluator.decay_rate)
    results = []
    if strategy == "sequential":
        # The pair (best η, the evaluator's λ) ran in the first stage.
        total = len(learning_rates) + len(decay_rates) - (original[1] in decay_rates)
    else:
        total = len(settings) if settings is not None else len(learning_rates) * len(decay_rates)
    bar = Progbar(total, verbose=1, unit_name="setting") if verbose == 1 else None

    def run(pairs):
        for learning_rate, decay_rate in pairs:
            evaluator.learning_rate = learning_rate
            evaluator.decay_rate = decay_rate
            try:
                logs = evaluator.evaluate(x, batch_size=batch_size, verbose=0)
            except DivergenceError as error:
                # Stopped at the first non-finite segment: never the best.
                logs = {
                    "loss": math.inf, "perplexity": math.inf,
                    "bits_per_token": math.inf, "num_tokens": 0,
                    "diverged": error,
                }
            result = {"learning_rate": learning_rate, "decay_rate": decay_rate, **logs}
            results.append(result)
            if bar is not None:
                bar.add(1, [("perplexity", logs["perplexity"])])
            if verbose == 2:
                print(describe_setting(result, len(results), total), flush=True)
            if on_result is not None:
                on_result(result, (len(results), total))
        best = _best(results)
        if not math.isfinite(best["loss"]):
            last = results[-1].get("diverged")
            tried = "; ".join(
                f"learning_rate={r['learning_rate']:g}, decay_rate="
                f"{r['decay_rate']:g}"
                + (f" (token {r['diverged'].token})" if r.get("diverged") else "")
                for r in results
            )
            raise DivergenceError(
                f"Every dynamic-evaluation setting tried diverged ({len(results)} "
                f"of {len(results)}, epsilon={evaluator.epsilon:g}, "
                f"segment_length={evaluator.segment_length}): {tried}. Try "
                "smaller learning rates or a larger epsilon.",
                **({} if last is None else {
                    k: getattr(last, k) for k in (
                        "stream", "token", "segment", "loss", "settings",
                        "tokens_scored")
                }),
            )
        return best

    try:
        if settings is not None:
            best = run(settings)
        elif strategy == "grid":
            best = run(itertools.product(learning_rates, decay_rates))
        else:
            best = run((lr, original[1]) for lr in learning_rates)
            ran = {(r["learning_rate"], r["decay_rate"]) for r in results}
            rest = [(best["learning_rate"], d) for d in decay_rates]
            rest = [pair for pair in rest if pair not in ran]
            if rest:
                best = run(rest)
    finally:
        evaluator.learning_rate, evaluator.decay_rate = original
    return {
        "learning_rate": best["learning_rate"],
        "decay_rate": best["decay_rate"],
        "loss": best["loss"],
        "perplexity": best["perplexity"],
        "results": results,
    }


def describe_setting(result, k=None, total=None):
    """One line on a pass of the search: its setting and perplexity (or where it diverged)."""
    head = f"setting {k}/{total}: " if k is not None else ""
    setting = (
        f"learning_rate={result['learning_rate']:g}, decay_rate={result['decay_rate']:g}"
    )
    if "diverged" in result:
        return f"{head}{setting}: diverged at token {result['diverged'].token}"
    if result["perplexity"] > 1e6:  # a blown-up pass: its perplexity overflows
        return f"{head}{setting}: loss {result['loss']:.1f} nats (blew up)"
    return f"{head}{setting}: perplexity {result['perplexity']:.2f}"


def _best(results):
    def key(r):
        return r["loss"] if math.isfinite(r["loss"]) else math.inf

    return min(results, key=key)


def _non_empty(name, values):
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"Expected `{name}` to be a non-empty list. Received: {name}={values!r}")
    return list(values)


def _rates(name, values, default):
    if values is None:
        return [default]
    return [_validation.non_negative_float(name, v) for v in _non_empty(name, values)]


def _pair(setting):
    if not isinstance(setting, (list, tuple)) or len(setting) != 2:
        raise ValueError(
            "Expected each entry of `settings` to be a pair (learning_rate, "
            f"decay_rate). Received: {setting!r}"
        )
    return (
        _validation.non_negative_float("learning_rate", setting[0]),
        _validation.non_negative_float("decay_rate", setting[1]),
    )
