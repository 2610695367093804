"""Tuning dynamic evaluation on a trained model with KerasTuner."""

import hashlib
import json
import math
import os
import sys

import keras
import keras_tuner
import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.evaluation.divergence_error import DivergenceError
from keras_mogrifier.evaluation.dynamic_evaluator import NORMALIZERS
from keras_mogrifier.evaluation.update_rules import NEEDS_STATISTICS
from keras_mogrifier.evaluation.update_rules import UPDATE_RULES
from keras_mogrifier.evaluation.dynamic_evaluator import DynamicEvaluator
from keras_mogrifier.tuning import search_space
from keras_mogrifier.tuning.tuners import run_search

DYNAMIC_EVALUATION_OBJECTIVE = keras_tuner.Objective("val_dynamic_loss", "min")
LOSS_REDUCTIONS = ("sum", "mean")
ORACLES = ("random", "bayesian")
_METRICS = ("val_dynamic_loss", "val_dynamic_perplexity")
ADVICE = (
    "What to try: smaller learning rates or larger epsilons (`ranges=`), "
    "gradient statistics from more training tokens (`statistics_tokens`), or "
    "ranges that hold Krause et al.'s learning_rate=5e-5, decay_rate=2e-3, "
    "epsilon=2e-5, segment_length=5 (the first trial of a search takes it "
    "wherever the ranges allow)."
)
# What a failed trial of this tuner is: a pass that diverged.
FAILED_AS = "diverged"
_NO_MODELS = (
    "A dynamic-evaluation trial has no model of its own (the trained model "
    "is never changed): apply a setting with `evaluate(x)`."
)


class _DynamicEvaluationSpace(keras_tuner.HyperModel):
    """Declares the dynamic-evaluation space; `build` returns the values."""

    def __init__(self, space, fixed, loss_reduction, update_rule="rms_rms_prior"):
        super().__init__(name="dynamic_evaluation")
        self.search_space = space
        self.fixed = fixed
        self.loss_reduction = loss_reduction
        self.update_rule = update_rule

    def build(self, hp):
        values = {
            name: search_space.declare(hp, name, spec)
            for name, spec in self.search_space.items()
        }
        values.update(self.fixed)
        return values

    def first_values(self):
        """The values of a search's first trial: a setting known to work.

        Each searched hyperparameter takes its default in the rule's space
        (`DYNAMIC_EVALUATION_SEARCH_SPACES`), for the RMS rules Krause et
        al.'s released setting, η 5e-5, λ 2e-3, ε 2e-5 at n = 5 in the
        library's units; at another segment length (fixed or clipped into
        its range) η and λ are scaled by n/5, as Krause's grid scales them
        (benkrause/dynamic-evaluation `dynamiceval.py` lines 279-280); ε is
        given in the searched units (× n with `loss_reduction="sum"`); and
        every value is clipped into its range.
        """
        defaults = search_space.DYNAMIC_EVALUATION_SEARCH_SPACES[self.update_rule]
        n0 = defaults["segment_length"]["default"]
        n = self.fixed.get("segment_length")
        if n is None:
            n = _clip(n0, self.search_space.get("segment_length"))
        known = {
            "segment_length": n,
            "learning_rate": defaults["learning_rate"]["default"] * n / n0,
            "decay_rate": defaults["decay_rate"]["default"] * n / n0,
        }
        if "epsilon" in defaults:
            epsilon = defaults["epsilon"]["default"]
            known["epsilon"] = epsilon * n if self.loss_reduction == "sum" else epsilon
        return {name: _clip(known[name], spec) for name, spec in self.search_space.items()}

    def configuration(self, hp):
        """The `DynamicEvaluator` settings of `hp` (η converted, see the tuner)."""
        if isinstance(hp, dict):
            values = dict(hp)
            hp = keras_tuner.HyperParameters()
            hp.values.update(values)
        values = self.build(hp)
        space = search_space.DYNAMIC_EVALUATION_SEARCH_SPACES[self.update_rule]
        settings = {name: values.get(name, spec["default"]) for name, spec in space.items()}
        n = settings["segment_length"] = int(settings["segment_length"])
        settings["learning_rate"] = float(settings["learning_rate"])
        settings["decay_rate"] = float(settings["decay_rate"])
        if "epsilon" not in space:
            return settings  # the rule has no ε (plain SGD)
        settings["epsilon"] = float(settings["epsilon"])
        if self.loss_reduction == "sum":
            # lamb's gradient and RMS are of the loss summed over the n steps
            # of a segment, n × ours: η/(RMS_sum + ε) = (η/n)/(RMS + ε/n) and
            # g_sum = n·g, so its η is ours and its ε is n × ours
            # (lamb/dyneval.py `Dyneval._make_update`; SPEC §5).
            settings["epsilon"] /= n
        return settings

    def learning_rate_over_epsilon(self, hp):
        """η/ε of `hp` in the library's units (0 for a rule without ε)."""
        settings = self.configuration(hp)
        if "epsilon" not in settings:
            return 0.0
        return settings["learning_rate"] / settings["epsilon"]


# Draws an oracle makes for one trial before it gives up on the limit of η/ε.
_DRAWS = 1000


class _DynamicEvaluationOracle:
    """Runs `first_values` as the first trial, then the oracle's own draws,
    drawn again while `admits(values)` is false."""

    def __init__(self, first_values, admits, **kwargs):
        super().__init__(**kwargs)
        self.first_values = dict(first_values)
        self.admits = admits

    def populate_space(self, trial_id):
        if not self.start_order:  # no trial yet, also in a resumed search
            return {"status": "RUNNING", "values": dict(self.first_values)}
        response = super().populate_space(trial_id)
        for _ in range(_DRAWS):
            if response["status"] != "RUNNING" or self.admits(response["values"]):
                break
            # A random draw, also where Bayesian optimisation proposed a
            # setting outside (it learns nothing from diverged trials).
            values = self._random_values()
            response = {"status": "RUNNING" if values else "STOPPED", "values": values}
        return response


class _RandomSearchOracle(
    _DynamicEvaluationOracle, keras_tuner.oracles.RandomSearchOracle
):
    pass


class _BayesianOptimizationOracle(
    _DynamicEvaluationOracle, keras_tuner.oracles.BayesianOptimizationOracle
):
    pass


class DynamicEvaluationTuner(keras_tuner.Tuner):
    """Searches the settings of dynamic evaluation on a trained model.

    Each trial is one setting `(learning_rate, decay_rate, epsilon,
    segment_length)` scored by one dynamic-evaluation pass (see
    `DynamicEvaluator`) over the token stream given to `search` — typically a
    slice of the validation split. There is no training in the loop: the
    trained model's weights are only read (the passes run on a copy,
    `model.with_options(batch_size=statistics_batch_size, samples=1)` for a
    `LanguageModel`, whose weights the evaluator restores after every pass).
    The gradient statistics `MS_g` are gathered once per segment length on
    `gradient_data` (the training stream) and reused by every trial with that
    length; they are also saved in the search's directory, so a resumed
    search (`overwrite=False`) or a later `evaluate` reuses them. Finished
    trials are not rerun when a search resumes.

    The first trial of a search (with the `"random"` or `"bayesian"`
    oracle) is a setting known to work: Krause et al.'s released one, η 5e-5,
    λ 2e-3, ε 2e-5 at n = 5 (his code's normaliser is `"tensor_mean"`; with
    `"global_mean"` λ weighs the elements a little differently), in the
    searched units and clipped into the ranges (`tuner.oracle.first_values`);
    the oracle draws the others. A search whose ranges hold that setting
    ends with a result.

    The objective is `val_dynamic_loss` (`DYNAMIC_EVALUATION_OBJECTIVE`,
    minimised); trials also report `val_dynamic_perplexity`. A pass that
    diverges — the evaluator stops it at its first segment with a loss that
    is not finite or beyond 709.78 nats (`DivergenceError`), or it ends
    above `max_loss`, by default `2 ln(vocabulary size)`, twice the loss of
    a uniform guess, which a model (even an untrained one, whose loss is
    about `ln(vocabulary size)`) only exceeds when the adaptation blows up
    (with a tiny ε, rarely seen words get huge steps) — is a diverged trial:
    recorded as failed, with where and why as its message, kept out of
    Bayesian optimisation's model (whose normalised targets one loss of 1e15
    would flatten), logged in one line (no traceback), counted in the
    summary (`search_summary(tuner, ADVICE, FAILED_AS)`), and the search
    goes on; the weights are restored as after every pass.

    The default space is `DYNAMIC_EVALUATION_SEARCH_SPACE`, in the library's
    units (the rule of `DynamicEvaluator` on the per-token mean loss of a
    segment): the box of the Mogrifier paper's Table 6 converted — segment
    length 1–20 (word level; pass `ranges={"segment_length": (1, 50)}` for
    characters), η 1e-6–1e-3, λ 1e-6–1e-2 (both as printed) and ε
    5e-10–1e-2 (the printed 1e-8–1e-2 divided by n = 1–20), less its corner
    of large η and small ε, where passes diverge: the oracles draw only
    settings with η/ε ≤ `max_learning_rate_over_epsilon` (10). The paper's
    values were tuned with the authors' code, which adapts on the loss
    *summed* over a segment and gathers its RMS from the gradients of that
    same summed loss: both are n times ours, so η and λ carry over and ε
    becomes ε/n. With `loss_reduction="sum"` the space is read in the
    paper's units instead (ranges such as Table 6's as printed) and each
    trial's ε is divided by its segment length. `normalizer="global_mean"`
    (the default) matches the paper's decay convention.
    `tuner.hypermodel.configuration(hp)` (and `evaluator_settings`) give the
    evaluator's values of a trial.

    `evaluate(x)` applies the best setting found (or any other) to another
    stream — the test split — in one call; `evaluate_static(x)` scores it
    without adaptation, with the same segments, for comparison (η = 0 gives
    the same loss to float rounding).

    Args:
        model: a trained, built `keras.Model` mapping ids to logits — a
            `LanguageModel`, or any model `DynamicEvaluator` accepts (used
            directly).
        gradient_data: 1-D int array. The training stream, for the gradient
            statistics.
        oracle: `"random"`, `"bayesian"` or a `keras_tuner.Oracle` whose
            objective is `val_dynamic_loss` or `val_dynamic_perplexity`
            (which draws every trial itself, the first one included, and
            keeps its own `max_consecutive_failed_trials`). Defaults to
            `"random"`.
        max_trials: int. Trials of the `"random"` and `"bayesian"` oracles.
            Defaults to `10`.
        ranges: dict or None. Overrides of the search space, `name -> (low,
            high)` or `name -> None` (not searched: the default, or the
            `fixed` value). Defaults to `None`.
        fixed: dict or None. Values held fixed, e.g. `{"segment_length": 5}`;
            `learning_rate` and `decay_rate` may be 0. Defaults to `None`.
        loss_reduction: `"mean"` (the library's units) or `"sum"` (the
            Mogrifier paper's: ε is divided by the segment length, see
            above): the units of the searched values. Defaults to `"mean"`.
        normalizer: `"global_mean"` or `"tensor_mean"`, as in
            `DynamicEvaluator`. Defaults to `"global_mean"`.
        update_rule: str. The `DynamicEvaluator` rule searched:
            `"rms_rms_prior"` (eq. 8), `"rms_global_prior"` (eq. 6) or
            `"sgd"` (eq. 4; no ε and no gradient statistics), each with its
            default space (`DYNAMIC_EVALUATION_SEARCH_SPACES`). Defaults to
            `"rms_rms_prior"`.
        statistics_batch_size: int. Streams per batch of the statistics pass.
            Defaults to `100`.
        statistics_tokens: int or None. Training tokens the statistics are
            gathered on (whole batches of `statistics_batch_size × n`, spread
            over the stream). Defaults to `None` (all of `gradient_data`).
        evaluator_options: dict or None. Further `DynamicEvaluator`
            arguments, the same for every trial: `context_length`, `reset`,
            `separator`, `variables`, `sparse`, `lora_rank`, `lora_alpha`,
            `vocabulary_size`, `jit_compile` (e.g. `{"context_length": 128,
            "lora_rank": 4}` for a keras-hub causal LM). A model scored in
            context windows gathers its statistics on windows of
            `context_length` training tokens, once for every segment
            length. Defaults to `None`.
        max_loss: float, `math.inf` or `"auto"`. A trial whose loss is above
            it has diverged. Defaults to `"auto"`: `2 ln(vocabulary size)` when
            the model tells its vocabulary size, else `math.inf`.
        max_learning_rate_over_epsilon: float or None. The largest η/ε, in
            the library's units, that the `"random"` and `"bayesian"` oracles
            draw (a draw above it is drawn again): it leaves out the corner
            of the box where passes diverge. Ranges that hold no such setting
            raise a `ValueError`. Defaults to `10`
            (`MAX_LEARNING_RATE_OVER_EPSILON`, measured); `None`: no limit.
        seed: int or None. Seed of the oracle. Defaults to `None`.
        max_consecutive_failed_trials: int or None. Diverged trials in a row
            after which the search stops, as in KerasTuner's oracles.
            Defaults to `None`: never (a diverged pass costs at most one
            pass, and the first trial is a setting known to work).
        directory: str or None. Where the trials (and cached statistics) are
            kept. Defaults to `None` (the working directory).
        project_name: str or None. Defaults to `None` (`"dynamic_evaluation"`).
        overwrite: bool. Start afresh instead of resuming. Defaults to `False`.
        **kwargs: other arguments of `keras_tuner.Tuner`.

    Example:

    >>> import tempfile
    >>> from keras_mogrifier.data import synthetic_corpus
    >>> from keras_mogrifier.models import LanguageModel
    >>> corpus = synthetic_corpus(train_tokens=2000, valid_tokens=200,
    ...                           test_tokens=200)
    >>> model = LanguageModel(len(corpus.vocabulary), units=8, num_layers=1,
    ...                       mogrifier_rounds=2, batch_size=1)
    >>> model.build((1, None))
    >>> tuner = DynamicEvaluationTuner(
    ...     model, corpus.train, max_trials=2, seed=1,
    ...     fixed={"segment_length": 5}, statistics_batch_size=10,
    ...     directory=tempfile.mkdtemp())
    >>> tuner.search(corpus.valid, verbose=0)
    >>> results = tuner.evaluate(corpus.test)
    >>> sorted(results["settings"])
    ['decay_rate', 'epsilon', 'learning_rate', 'segment_length']

    Reference:
        - Krause, Kahembwe, Murray, Renals, "Dynamic Evaluation of Neural
          Sequence Models", ICML 2018, https://arxiv.org/abs/1709.07432
        - Melis, Kočiský, Blunsom, "Mogrifier LSTM", ICLR 2020, Appendix A,
          Table 6, https://arxiv.org/abs/1909.01792
    """

    def __init__(
        self,
        model,
        gradient_data,
        oracle="random",
        max_trials=10,
        ranges=None,
        fixed=None,
        loss_reduction="mean",
        normalizer="global_mean",
        update_rule="rms_rms_prior",
        statistics_batch_size=100,
        statistics_tokens=None,
        evaluator_options=None,
        max_loss="auto",
        max_learning_rate_over_epsilon=search_space.MAX_LEARNING_RATE_OVER_EPSILON,
        seed=None,
        max_consecutive_failed_trials=None,
        directory=None,
        project_name=None,
        overwrite=False,
        **kwargs,
    ):
        if not isinstance(model, keras.Model):
            raise ValueError(
                f"Expected `model` to be a Keras model. Received: {type(model).__name__}"
            )
        if not model.built:
            raise ValueError(
                "Expected a built (trained) model. Received an unbuilt model: "
                f"{model.name}"
            )
        gradient_data = _token_stream("gradient_data", gradient_data)
        evaluator_options = _evaluator_options(evaluator_options)
        loss_reduction = _validation.one_of("loss_reduction", loss_reduction, LOSS_REDUCTIONS)
        normalizer = _validation.one_of("normalizer", normalizer, NORMALIZERS)
        update_rule = _validation.one_of("update_rule", update_rule, UPDATE_RULES)
        statistics_batch_size = _validation.positive_int(
            "statistics_batch_size", statistics_batch_size
        )
        statistics_tokens = _validation.optional_positive_int(
            "statistics_tokens", statistics_tokens
        )
        if max_loss == "auto":
            size = _vocabulary_size(model)
            max_loss = 2.0 * math.log(size) if size else math.inf
        elif max_loss != math.inf:
            max_loss = _validation.positive_float("max_loss", max_loss)
        fixed = dict(fixed or {})
        ranges = dict(ranges or {})
        names = search_space.DYNAMIC_EVALUATION_SEARCH_SPACES[update_rule]
        unknown = sorted(set(fixed) - set(names))
        if unknown:
            raise ValueError(
                f"Expected `fixed` to name hyperparameters among {list(names)}. "
                f"Received unknown: {unknown}"
            )
        both = sorted(k for k in set(fixed) & set(ranges) if ranges[k] is not None)
        if both:
            raise ValueError(
                "Expected each hyperparameter to be either fixed or searched. "
                f"Received both a fixed value and a range for: {both}"
            )
        for key, value in fixed.items():
            search_space.check_value(names, key, value)
        space = search_space.resolve_space(names, ranges, remove=set(fixed))
        longest = fixed.get("segment_length")
        if longest is None:
            longest = space.get("segment_length", names["segment_length"])
            longest = longest.get("max", longest["default"])
        if len(gradient_data) < statistics_batch_size * (longest + 1):
            raise ValueError(
                "Expected `gradient_data` to hold at least statistics_batch_size "
                f"× (longest segment_length + 1) = "
                f"{statistics_batch_size * (longest + 1)} tokens, for one batch "
                f"of statistics. Received: {len(gradient_data)} tokens"
            )
        hypermodel = _DynamicEvaluationSpace(space, fixed, loss_reduction, update_rule)
        limit = max_learning_rate_over_epsilon
        if limit is not None:
            limit = _validation.positive_float("max_learning_rate_over_epsilon", limit)
        if isinstance(oracle, str):
            _validation.one_of("oracle", oracle, ORACLES)
            max_trials = _validation.positive_int("max_trials", max_trials)
            if limit is not None and "epsilon" in names:
                _check_ratio_reachable(names, space, fixed, loss_reduction, limit)
            if max_consecutive_failed_trials is None:
                max_consecutive_failed_trials = sys.maxsize  # never reached
            max_consecutive_failed_trials = _validation.positive_int(
                "max_consecutive_failed_trials", max_consecutive_failed_trials
            )
            oracle_class = (
                _RandomSearchOracle if oracle == "random" else _BayesianOptimizationOracle
            )

            def admits(values):
                return limit is None or hypermodel.learning_rate_over_epsilon(values) <= limit

            oracle = oracle_class(
                hypermodel.first_values(),
                admits,
                objective=DYNAMIC_EVALUATION_OBJECTIVE,
                max_trials=max_trials,
                seed=seed,
                max_consecutive_failed_trials=max_consecutive_failed_trials,
            )
        elif not isinstance(oracle, keras_tuner.Oracle):
            raise ValueError(
                "Expected `oracle` to be 'random', 'bayesian' or a "
                f"`keras_tuner.Oracle`. Received: oracle={oracle!r}"
            )
        elif getattr(oracle.objective, "name", None) not in _METRICS:
            raise ValueError(
                "Expected the oracle's objective to be one of "
                f"{list(_METRICS)}, e.g. `DYNAMIC_EVALUATION_OBJECTIVE`. "
                f"Received: {getattr(oracle.objective, 'name', None)!r}"
            )

        self.model = model
        self.gradient_data = gradient_data
        self.loss_reduction = loss_reduction
        self.normalizer = normalizer
        self.update_rule = update_rule
        self.statistics_batch_size = statistics_batch_size
        self.statistics_tokens = statistics_tokens
        self.evaluator_options = evaluator_options
        self.max_loss = max_loss
        self.max_learning_rate_over_epsilon = limit
        self.statistics_collected = 0  # statistics passes run by this tuner
        self._statistics = {}
        self._fingerprint = None
        self._evaluator = None
        self._diverged = {}  # trial id -> why, until the trial ends
        super().__init__(
            oracle=oracle,
            hypermodel=hypermodel,
            directory=directory,
            project_name=project_name or "dynamic_evaluation",
            overwrite=overwrite,
            **kwargs,
        )
        if evaluator_options:
            self.evaluator  # their ValueErrors now, before any trial

    # === The evaluator ===

    @property
    def evaluator(self):
        """The `DynamicEvaluator`, on a copy of the model, made on first use."""
        if self._evaluator is None:
            model = self.model
            if hasattr(model, "with_options"):
                model = model.with_options(
                    batch_size=self.statistics_batch_size, samples=1
                )
            self._evaluator = DynamicEvaluator(
                model, normalizer=self.normalizer, **self.evaluator_options
            )
        return self._evaluator

    def evaluator_settings(self, hyperparameters=None):
        """The evaluator's `segment_length`, `learning_rate` (η, converted),
        `decay_rate` and `epsilon` of `hyperparameters` (a
        `keras_tuner.HyperParameters` or a dict; `None`: the best trial's)."""
        if hyperparameters is None:
            hyperparameters = self._best_hyperparameters()
        return self.hypermodel.configuration(hyperparameters)

    def _configure(self, settings):
        evaluator = self.evaluator
        n = settings["segment_length"]
        evaluator.segment_length = n
        evaluator.update_rule = self.update_rule
        if NEEDS_STATISTICS[self.update_rule]:
            evaluator.gradient_statistics = self._statistics_for(n)
            evaluator.epsilon = settings["epsilon"]
        evaluator.learning_rate = settings["learning_rate"]
        evaluator.decay_rate = settings["decay_rate"]
        return evaluator

    def _statistics_for(self, n):
        """`MS_g` for segment length `n`: from memory, disk, or a new pass.

        A model scored in context windows of `K` tokens learns from windows
        of `K` training tokens whatever `n` is: one pass serves every `n`.
        """
        evaluator = self.evaluator
        window = evaluator._context_window(evaluator._require_model())
        if window is not None:
            n = window
        if n not in self._statistics:
            name = f"window{n}" if window is not None else f"n{n}"
            path = os.path.join(self.project_dir, f"gradient_statistics_{name}.npz")
            key = self._statistics_key(n)
            stored = _load_statistics(path, key)
            if stored is None:
                stored = self._collect_statistics(n)
                _save_statistics(path, key, stored)
            self._statistics[n] = stored
        # Stored by the variables' paths inside the model, which do not
        # depend on the model's name (it differs between copies).
        local = self._statistics[n]
        statistics = {}
        for variable in self.evaluator.adapted_variables():
            name = _local_path(variable)
            if name not in local:
                raise ValueError(
                    f"Expected gradient statistics for {name!r}. Received "
                    f"statistics for: {sorted(local)}"
                )
            statistics[variable.path] = local[name]
        return statistics

    def _collect_statistics(self, n):
        evaluator = self.evaluator
        batch = self.statistics_batch_size
        windows = (len(self.gradient_data) // batch - 1) // n
        if windows < 1:
            raise ValueError(
                f"Expected `gradient_data` to hold at least statistics_batch_size "
                f"× (segment_length + 1) = {batch * (n + 1)} tokens. "
                f"Received: {len(self.gradient_data)} tokens"
            )
        steps = None
        if self.statistics_tokens is not None:
            steps = max(1, self.statistics_tokens // (batch * n))
        evaluator.collect_gradient_statistics(
            self.gradient_data, steps=steps, batch_size=batch, segment_length=n
        )
        self.statistics_collected += 1
        paths = {v.path: _local_path(v) for v in evaluator.adapted_variables()}
        return {paths[p]: value for p, value in evaluator.gradient_statistics.items()}

    def _statistics_key(self, n):
        """Identifies the weights, data and settings the statistics depend on."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for variable in self.model.trainable_variables:
                digest.update(_local_path(variable).encode())
                digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(variable)).tobytes())
            digest.update(np.ascontiguousarray(self.gradient_data).tobytes())
            self._fingerprint = digest.hexdigest()[:16]
        return json.dumps(
            [self._fingerprint, n, self.statistics_batch_size, self.statistics_tokens,
             sorted((k, repr(v)) for k, v in self.evaluator_options.items())]
        )

    # === Search ===

    def search(self, x, max_tokens=None, **kwargs):
        """Runs the search: one dynamic-evaluation pass of `x` per trial.

        Args:
            x: 1-D int array. The tuning stream (a slice of validation data).

        Raises:
            SearchFailedError: when no trial completed (every setting
                diverged, say); its message counts the trials, says why each
                failed and what to try.
            max_tokens: int or None. Use only the first `max_tokens`
                predicted tokens of `x`. Defaults to `None` (all).
            **kwargs: `verbose` (0 silences KerasTuner's progress).
        """
        x = _token_stream("x", x)
        max_tokens = _validation.optional_positive_int("max_tokens", max_tokens)
        if max_tokens is not None:
            x = x[: max_tokens + 1]
        run_search(
            self,
            lambda: super(DynamicEvaluationTuner, self).search(x, **kwargs),
            ADVICE,
            failed_as=FAILED_AS,
        )

    def run_trial(self, trial, x, **kwargs):
        settings = self.hypermodel.configuration(trial.hyperparameters)
        try:
            results = self._configure(settings).evaluate(x, verbose=0)
        except DivergenceError as error:
            return self._divergence(trial, str(error))
        except ValueError as error:
            # A problem of the model, data or settings, not of this trial:
            # stop the search instead of failing every trial.
            raise keras_tuner.errors.FatalValueError(str(error)) from error
        if not results["loss"] <= self.max_loss:  # also catches NaN
            return self._divergence(
                trial,
                f"Dynamic evaluation diverged: loss {results['loss']:.4g} "
                f"(above max_loss={self.max_loss:.4g}) with {settings}. The "
                "trained weights and the recurrent state were restored.",
            )
        return {
            "val_dynamic_loss": results["loss"],
            "val_dynamic_perplexity": results["perplexity"],
        }

    def _divergence(self, trial, message):
        # Raising would have KerasTuner print the traceback of an expected
        # outcome; the trial is marked failed when it ends (`on_trial_end`).
        self._diverged[trial.trial_id] = message
        return {"val_dynamic_loss": math.inf, "val_dynamic_perplexity": math.inf}

    def on_trial_end(self, trial):
        message = self._diverged.pop(trial.trial_id, None)
        if message is not None:
            # Failed, not completed: no best trial and no Bayesian model sees
            # its infinite loss.
            trial.status = "FAILED"
            trial.message = message
        super().on_trial_end(trial)
        if message is not None and self.oracle.verbose:
            print(f"Trial {trial.trial_id} diverged: {message}")

    # === Applying the result ===

    def evaluate(self, x, hyperparameters=None, verbose=0):
        """Dynamic evaluation of `x` (e.g. the test split) with a setting.

        Args:
            x: token ids, as for `DynamicEvaluator.evaluate`.
            hyperparameters: `keras_tuner.HyperParameters`, a dict of values,
                or None for the best trial's. Defaults to `None`.
            verbose: int. Progress bar of the pass. Defaults to `0`.

        Returns:
            The evaluator's results (`loss`, `perplexity`, `bits_per_token`,
            `num_tokens`) and `settings`, the evaluator settings used.
        """
        settings = self.evaluator_settings(hyperparameters)
        results = self._configure(settings).evaluate(x, verbose=verbose)
        results["settings"] = settings
        return results

    def evaluate_static(self, x, segment_length=None, verbose=0):
        """Scores `x` without adaptation (same segments and carried state).

        Args:
            x: token ids.
            segment_length: int or None. Defaults to `None`: the best
                trial's, or 5 before any trial.
            verbose: int. Defaults to `0`.
        """
        evaluator = self.evaluator
        if segment_length is None:
            try:
                segment_length = self.evaluator_settings()["segment_length"]
            except ValueError:
                segment_length = 5
        evaluator.segment_length = _validation.positive_int("segment_length", segment_length)
        return evaluator.evaluate(x, adapt=False, verbose=verbose)

    def _best_hyperparameters(self):
        best = self.oracle.get_best_trials(1)
        if not best or best[0].status != "COMPLETED":
            raise ValueError(
                "Expected a completed trial to take the best setting from: run "
                "`search` first, or pass `hyperparameters`. Received: "
                f"{len(self.oracle.trials)} trial(s), none completed"
            )
        return best[0].hyperparameters.copy()

    def load_model(self, trial):
        raise NotImplementedError(_NO_MODELS)

    def get_best_models(self, num_models=1):
        raise NotImplementedError(_NO_MODELS)


def _check_ratio_reachable(names, space, fixed, loss_reduction, limit):
    """Raises unless some setting of the ranges has η/ε ≤ `limit` (our units)."""

    def bounds(name):
        if name in space:
            return space[name]["min"], space[name]["max"]
        value = fixed.get(name, names[name]["default"])  # fixed, or not searched
        return value, value

    smallest = bounds("learning_rate")[0]
    largest = bounds("epsilon")[1]
    if loss_reduction == "sum":
        largest /= bounds("segment_length")[0]
    if smallest > limit * largest:
        raise ValueError(
            "Expected ranges that hold settings with learning_rate / epsilon "
            f"<= max_learning_rate_over_epsilon={limit:g} (in the library's "
            "units; above it passes diverge), or "
            "max_learning_rate_over_epsilon=None to search them anyway. "
            f"Received: learning_rate from {smallest:g}, epsilon up to {largest:g}"
        )


def _clip(value, spec):
    """`value` clipped into the range of `spec` (None: no range)."""
    if spec is None:
        return value
    clipped = min(max(value, spec["min"]), spec["max"])
    return int(clipped) if spec["type"] == "int" else float(clipped)


def _vocabulary_size(model):
    size = getattr(model, "vocabulary_size", None)
    if size is None:
        try:
            size = model.output_shape[-1]
        except (AttributeError, ValueError, TypeError, IndexError):
            return None
    return size if isinstance(size, int) and size > 1 else None


def _local_path(variable):
    """The variable's path inside its model (without the model's name)."""
    return variable.path.split("/", 1)[-1]


def _load_statistics(path, key):
    """Statistics saved at `path` for `key`, or None."""
    if not os.path.exists(path):
        return None
    with np.load(path, allow_pickle=False) as stored:
        if str(stored["key"]) != key:
            return None
        names = [str(name) for name in stored["names"]]
        return {name: stored[f"value_{i}"] for i, name in enumerate(names)}


def _save_statistics(path, key, statistics):
    names = sorted(statistics)
    np.savez(
        path,
        key=np.asarray(key),
        names=np.asarray(names),
        **{f"value_{i}": statistics[name] for i, name in enumerate(names)},
    )


def _token_stream(name, data):
    array = _validation.token_ids(name, data, None, ndim=1)
    if array.size < 2:
        raise ValueError(
            f"Expected `{name}` to be a 1-D array of at least 2 token ids. "
            f"Received: shape {array.shape}"
        )
    return array


EVALUATOR_OPTIONS = (
    "context_length", "reset", "separator", "variables", "sparse", "lora_rank",
    "lora_alpha", "vocabulary_size", "jit_compile",
)


def _evaluator_options(options):
    """`evaluator_options` as a dict, or a ValueError naming what is not one."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(
            "Expected `evaluator_options` to be a dict of `DynamicEvaluator` "
            f"arguments. Received: {type(options).__name__}"
        )
    unknown = sorted(set(options) - set(EVALUATOR_OPTIONS))
    if unknown:
        raise ValueError(
            f"Expected `evaluator_options` among {list(EVALUATOR_OPTIONS)} (the "
            "tuner sets the update rule, its hyperparameters and the "
            f"normalizer itself). Received: {unknown}"
        )
    return dict(options)
