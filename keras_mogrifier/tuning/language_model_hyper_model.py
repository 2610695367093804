"""A KerasTuner `HyperModel` of the library's language models."""

import inspect
import math

import keras
import keras_tuner
import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.models.language_model import LanguageModel
from keras_mogrifier.models.non_finite_loss_error import NonFiniteLossError
from keras_mogrifier.pipeline import language_modeling
from keras_mogrifier.pipeline.units import summed_loss_clipnorm
from keras_mogrifier.pipeline.units import summed_loss_epsilon
from keras_mogrifier.pipeline.units import summed_loss_l2
from keras_mogrifier.pipeline.presets import TRAINING_DEFAULTS
from keras_mogrifier.tuning import search_space

LANGUAGE_MODEL_OBJECTIVE = keras_tuner.Objective("val_perplexity", "min")

_MODEL_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(LanguageModel.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}
# Arguments the hypermodel sets itself (or that make no sense to fix).
_MODEL_OWNED = ("batch_size", "vocabulary_size")
_TRAINING_OWNED = ("batch_size", "sequence_length", "max_tokens", "eval_batch_size", "epochs")
_TRAINING_KEYS = tuple(k for k in TRAINING_DEFAULTS if k not in _TRAINING_OWNED)
_MODEL_KEYS = tuple(k for k in _MODEL_DEFAULTS if k not in _MODEL_OWNED)
# The Mogrifier paper's optimiser (§3.3): Adam with β₁ = 0, gradients clipped
# to norm 10 on lamb's loss summed over the T steps of a window, i.e. 10 / T
# on the library's per-token mean (set per hypermodel from its T; see
# `keras_mogrifier.pipeline.units`), and Adam's ε 1e-8 (lamb_flags.py line
# 150) on the same summed loss, i.e. 1e-8 / T. The rest are the pipeline's
# defaults.
LAMB_MAX_GRAD_NORM = 10.0
LAMB_ADAM_EPSILON = 1e-8
HYPER_MODEL_TRAINING_DEFAULTS = {
    **{k: TRAINING_DEFAULTS[k] for k in _TRAINING_KEYS},
    "optimizer": "adam",
    "beta_1": 0.0,
}
_DUAL_NAMES = ("dual_units", "dual_dropout")
_MOGRIFIER_NAMES = ("mogrifier_rounds", "mogrifier_rank")


class LanguageModelHyperModel(keras_tuner.HyperModel):
    """The papers' search space over `LanguageModel`s, as a KerasTuner `HyperModel`.

    Every trial builds a stateful `LanguageModel` for `batch_size` streams,
    compiles it as the pipeline does (`IWAEDropoutLoss`, `Perplexity` as a
    weighted metric), trains it with truncated BPTT on windows of
    `sequence_length` tokens, in order (`shuffle=False`; the streams and the
    carried state continue across epochs, as `LanguageModel.fit` does, and
    every evaluation starts from zero state), and reports `val_perplexity`, the
    objective (`LANGUAGE_MODEL_OBJECTIVE`, minimised). Use it with any
    KerasTuner tuner (`RandomSearch`, `BayesianOptimization`, `Hyperband`),
    or with `build_tuner`.

    The search space is `LANGUAGE_MODEL_SEARCH_SPACE` (see that module for
    each range and its source): the Mogrifier paper's Table 4 (learning rate,
    embedding ratio, l2, input / inter-layer (→ cell-output) / state / output
    dropout, mogrifier rounds 0–6 and rank −20…100), Circling Back §7 (Chrono
    `T_max` in `[e², e⁵]`, LSTM vs RLSTM) and the Dual paper's Table 1 (Dual
    on/off, its units and input dropout) and the mixture of softmaxes (K in
    {0, 2}: the Mogrifier paper's PTB and Wikitext-2 rows). How
    hyperparameters map to the
    model:

    - `embedding_ratio` r: embedding width `round(r · units)` (at least 1),
      or `units` when r > 1 (Appendix A of the Mogrifier paper);
    - `mogrifier_rank` k: k ≤ 0 is full rank (`mogrifier_rank=None`); a rank
      of at least the smaller side of every mogrifier matrix is full rank too,
      and a rank above the first layer's smaller side (embedding width below
      `units`) is clipped to it;
    - `mogrifier_rounds` and `mogrifier_rank` are conditional on a Mogrifier
      `cell`, `dual_units` and `dual_dropout` on `dual=True` (KerasTuner
      conditional scopes), and left out when those are fixed otherwise.

    Trials that diverge — a non-finite training loss at the end (training
    stops at the first one: `NonFiniteLossError`, or
    `keras.callbacks.TerminateOnNaN` for other models) or no finite
    `val_perplexity` in any epoch — raise `keras_tuner.errors.FailedTrialError`,
    so KerasTuner records them as `FAILED` and goes on (BayesianOptimization
    leaves them out of its model). KerasTuner stops a search after
    `max_consecutive_failed_trials` (its default 3) failures in a row;
    `build_tuner` raises that to 10. Errors in the data or settings raise
    `keras_tuner.errors.FatalValueError`, which stops the search at once.

    Args:
        vocabulary_size: int. Number of token ids.
        batch_size: int. Streams per batch, B (also the model's state rows).
            Defaults to `64` (the Mogrifier paper's word-level setting).
        sequence_length: int. BPTT window, T. Defaults to `70` (ditto).
        fixed: dict or None. Values held fixed: `LanguageModel` arguments
            (e.g. `units`, `num_layers`, `samples`), training settings of the
            pipeline (`optimizer`, `beta_1`, `clipnorm`, `global_clipnorm`,
            `two_tailed_averaging`, `divergence_recovery`, `jit_compile`, ...)
            and search-space names, which then leave the search (fixing
            `embedding_dim` removes `embedding_ratio`). Defaults to `None`.
        ranges: dict or None. Overrides of the search space: `name -> (low,
            high)` (the sampling, log or linear, stays), `name -> [values]`
            for `cell`, `dual`, `dual_units`, or `name -> None` to leave
            `name` out (the `LanguageModel` default applies). Defaults to
            `None`: the papers' ranges.
        max_tokens: int or None. Training tokens per epoch (whole windows).
            Defaults to `None` (all).
        max_validation_tokens: int or None. Validation tokens scored per
            epoch. Defaults to `None` (all).
        eval_batch_size: int or None. Streams of the validation pass (at most
            `batch_size × samples`). Defaults to `None` (`batch_size`).
        name: str or None. Name of the hypermodel. Defaults to `None`.
        tunable: bool. Whether the hyperparameters it declares are tuned.
            Defaults to `True`.

    Example:

    >>> import keras_tuner
    >>> from keras_mogrifier.data import synthetic_corpus
    >>> corpus = synthetic_corpus(train_tokens=400, valid_tokens=100,
    ...                           test_tokens=100)
    >>> hypermodel = LanguageModelHyperModel(
    ...     len(corpus.vocabulary), batch_size=4, sequence_length=10,
    ...     fixed={"units": 8, "num_layers": 1, "jit_compile": False})
    >>> model = hypermodel.build(keras_tuner.HyperParameters())
    >>> model.cell, model.input_dropout   # the space's defaults
    ('mogrifier_lstm', 0.73)
    >>> config = hypermodel.configuration(
    ...     {"embedding_ratio": 0.5, "mogrifier_rank": 3})
    >>> config["model"]["embedding_dim"], config["model"]["mogrifier_rank"]
    (4, 3)
    >>> print(hypermodel.configuration({"mogrifier_rank": -3})["model"]["mogrifier_rank"])
    None

    A search: `build_tuner(hypermodel, "random", max_trials=20)` (or any
    KerasTuner tuner with `objective=LANGUAGE_MODEL_OBJECTIVE`), then
    `tuner.search(corpus.train, validation_data=corpus.valid, epochs=...)`.

    Reference:
        - Melis, Kočiský, Blunsom, "Mogrifier LSTM", ICLR 2020, §3.3 and
          Appendix A, https://arxiv.org/abs/1909.01792
        - Melis, "Circling Back to Recurrent Models of Language", 2022, §7,
          https://arxiv.org/abs/2211.01848
        - "The Importance of the Current Input in Sequence Modeling", ICLR
          2022 submission, Table 1.
    """

    def __init__(
        self,
        vocabulary_size,
        batch_size=64,
        sequence_length=70,
        fixed=None,
        ranges=None,
        max_tokens=None,
        max_validation_tokens=None,
        eval_batch_size=None,
        name=None,
        tunable=True,
    ):
        v = _validation
        vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
        batch_size = v.positive_int("batch_size", batch_size)
        sequence_length = v.positive_int("sequence_length", sequence_length)
        max_tokens = v.optional_positive_int("max_tokens", max_tokens)
        max_validation_tokens = v.optional_positive_int(
            "max_validation_tokens", max_validation_tokens
        )
        eval_batch_size = v.optional_positive_int("eval_batch_size", eval_batch_size)
        fixed = _check_dict("fixed", fixed)
        ranges = _check_dict("ranges", ranges)
        space_names = search_space.LANGUAGE_MODEL_SEARCH_SPACE
        known = set(_MODEL_KEYS) | set(_TRAINING_KEYS) | set(space_names)
        unknown = sorted(set(fixed) - known)
        if unknown:
            raise ValueError(
                "Expected `fixed` to name `LanguageModel` arguments, training "
                f"settings or search-space names ({sorted(known)}). "
                f"Received unknown: {unknown}"
            )
        both = sorted(k for k in set(fixed) & set(ranges) if ranges[k] is not None)
        if both:
            raise ValueError(
                "Expected each hyperparameter to be either fixed or searched. "
                f"Received both a fixed value and a range for: {both}"
            )
        for key in set(fixed) & set(space_names):
            search_space.check_value(space_names, key, fixed[key])

        remove = set(fixed) & set(space_names)
        if "embedding_dim" in fixed:
            remove.add("embedding_ratio")
        space = search_space.resolve_space(space_names, ranges, remove)
        cells = [fixed.get("cell", _MODEL_DEFAULTS["cell"])]
        if "cell" in space:
            cells = list(space["cell"]["values"])
        if not any(c in search_space.MOGRIFIER_CELLS for c in cells):
            for key in _MOGRIFIER_NAMES:
                space.pop(key, None)
        duals = [fixed.get("dual", _MODEL_DEFAULTS["dual"])]
        if "dual" in space:
            duals = list(space["dual"]["values"])
        if True not in duals:
            for key in _DUAL_NAMES:
                space.pop(key, None)

        super().__init__(name=name, tunable=tunable)
        self.vocabulary_size = vocabulary_size
        self.batch_size = batch_size
        self.sequence_length = sequence_length
        self.fixed = fixed
        self.ranges = ranges
        self.max_tokens = max_tokens
        self.max_validation_tokens = max_validation_tokens
        self.eval_batch_size = eval_batch_size
        self.search_space = space
        self.objective = LANGUAGE_MODEL_OBJECTIVE
        # Catch bad fixed values now rather than in every trial.
        config = self.configuration(keras_tuner.HyperParameters())
        LanguageModel(vocabulary_size, batch_size=batch_size, **config["model"])
        _validation.one_of(
            "optimizer", config["training"]["optimizer"], language_modeling.OPTIMIZERS
        )
        capacity = batch_size * config["model"].get("samples", 1)
        if (eval_batch_size or batch_size) > capacity:
            raise ValueError(
                f"Expected `eval_batch_size` to be at most batch_size × samples "
                f"= {capacity}, the model's state rows. "
                f"Received: eval_batch_size={eval_batch_size}"
            )

    # === Search space ===

    def _declare(self, hp):
        """Declares the space on `hp`; returns `{name: value or None}`."""
        space = self.search_space
        values = {}
        mogrifier_cells = None
        if "cell" in space:
            chosen = [c for c in space["cell"]["values"] if c in search_space.MOGRIFIER_CELLS]
            if len(chosen) < len(space["cell"]["values"]):
                mogrifier_cells = chosen
        for name, spec in space.items():
            if name in _DUAL_NAMES and "dual" in space:
                with hp.conditional_scope("dual", [True]):
                    values[name] = search_space.declare(hp, name, spec)
            elif name in _MOGRIFIER_NAMES and mogrifier_cells is not None:
                with hp.conditional_scope("cell", mogrifier_cells):
                    values[name] = search_space.declare(hp, name, spec)
            else:
                values[name] = search_space.declare(hp, name, spec)
        return values

    def configuration(self, hp):
        """The `LanguageModel` arguments and training settings of `hp`.

        Args:
            hp: `keras_tuner.HyperParameters` (its values; missing ones are
                declared with the space's defaults) or a dict of values.

        Returns:
            A dict `{"model": {...}, "training": {...}}`: the arguments of
            `LanguageModel` (without `vocabulary_size` and `batch_size`) and
            the training settings of `keras_mogrifier.pipeline`
            (`batch_size`, `sequence_length` and `max_tokens` included), as
            `run_experiment(model_overrides=..., training_overrides=...)`
            takes them to retrain the chosen configuration.
        """
        if isinstance(hp, dict):
            values = dict(hp)
            hp = keras_tuner.HyperParameters()
            hp.values.update(values)
        values = self._declare(hp)
        for key, value in self.fixed.items():
            if key in search_space.LANGUAGE_MODEL_SEARCH_SPACE:
                values[key] = value
        model = {k: v for k, v in self.fixed.items() if k in _MODEL_KEYS}
        training = dict(HYPER_MODEL_TRAINING_DEFAULTS)
        training["global_clipnorm"] = summed_loss_clipnorm(
            LAMB_MAX_GRAD_NORM, self.sequence_length
        )
        training["epsilon"] = summed_loss_epsilon(LAMB_ADAM_EPSILON, self.sequence_length)
        training.update({k: v for k, v in self.fixed.items() if k in _TRAINING_KEYS})
        training.update(
            batch_size=self.batch_size,
            sequence_length=self.sequence_length,
            max_tokens=self.max_tokens,
            eval_batch_size=self.eval_batch_size or self.batch_size,
        )
        for name, value in values.items():
            if value is None:
                continue  # inactive conditional hyperparameter
            if name == "learning_rate":
                training["learning_rate"] = float(value)
            elif name == "l2" and "l2" not in self.fixed:
                # Table 4's l2_penalty is lamb's, on its summed loss.
                model["l2"] = summed_loss_l2(float(value), self.sequence_length)
            elif name not in ("embedding_ratio", "mogrifier_rank"):
                model[name] = value
        units = model.get("units", _MODEL_DEFAULTS["units"])
        if values.get("embedding_ratio") is not None:
            model["embedding_dim"] = _embedding_width(values["embedding_ratio"], units)
        if values.get("mogrifier_rank") is not None:
            width = model.get("embedding_dim") or units
            layers = model.get("num_layers", _MODEL_DEFAULTS["num_layers"])
            model["mogrifier_rank"] = _rank(values["mogrifier_rank"], units, width, layers)
        if "chrono_t_max" in model:
            model["chrono_t_max"] = float(model["chrono_t_max"])
        return {"model": model, "training": training}

    # === Build and fit ===

    def build(self, hp):
        config = self.configuration(hp)
        model = language_modeling.build_language_model(
            self.vocabulary_size, config["model"], self.batch_size
        )
        language_modeling.compile_language_model(model, config["training"])
        return model

    def fit(self, hp, model, x, y=None, validation_data=None, epochs=1,
            callbacks=None, **kwargs):
        """Trains `model` on the stream `x`; returns the `History`.

        Args:
            hp: the trial's `keras_tuner.HyperParameters`.
            model: the model `build(hp)` returned.
            x: 1-D token ids of the training split (cut into `batch_size`
                streams and windows of `sequence_length`, at most
                `max_tokens` per epoch), or a dataset of `(x, y)` batches used
                as given (in order).
            y: must be `None`: targets are the next tokens of `x`.
            validation_data: 1-D validation token ids (every token scored
                once, `drop_remainder=False`), or a dataset yielding
                `(x, y, sample_weight)`. Required: it gives `val_perplexity`.
            epochs: int. Defaults to `1`.
            callbacks: list of callbacks (KerasTuner adds its own).
            **kwargs: other arguments of `model.fit` (`verbose`,
                `initial_epoch`, ...).
        """
        if y is not None:
            raise keras_tuner.errors.FatalValueError(
                "Expected `y=None`: the targets are the next tokens of `x`. "
                f"Received: y of type {type(y).__name__}"
            )
        if validation_data is None:
            raise keras_tuner.errors.FatalValueError(
                "Expected `validation_data` (validation token ids): the "
                "objective is `val_perplexity`. Received: validation_data=None"
            )
        training = self.configuration(hp)["training"]
        train = self._dataset(x, "x", evaluation=False)
        valid = self._dataset(validation_data, "validation_data", evaluation=True)
        extra = language_modeling.training_callbacks(training)
        if not training.get("divergence_recovery"):
            extra.append(keras.callbacks.TerminateOnNaN())
        kwargs["shuffle"] = False  # windows in order: the state is carried
        # Across epochs too (the streams continue), unless the config says.
        kwargs.setdefault(
            "reset_state_each_epoch", training.get("reset_state_each_epoch", False)
        )
        try:
            history = model.fit(
                train,
                validation_data=valid,
                epochs=epochs,
                callbacks=extra + list(callbacks or []),
                **kwargs,
            )
        except NonFiniteLossError as error:
            raise keras_tuner.errors.FailedTrialError(
                "The trial diverged: non-finite training loss "
                f"({error.loss}) at batch {error.batch} of epoch {error.epoch}; "
                "training stopped there."
            ) from error
        losses = history.history.get("loss", [])
        objective = history.history.get(LANGUAGE_MODEL_OBJECTIVE.name, [])
        if not losses or not math.isfinite(losses[-1]):
            raise keras_tuner.errors.FailedTrialError(
                "The trial diverged: non-finite training loss "
                f"({losses[-1] if losses else None}) after "
                f"{len(losses)} epoch(s)."
            )
        if not any(math.isfinite(value) for value in objective):
            raise keras_tuner.errors.FailedTrialError(
                "The trial diverged: no finite val_perplexity "
                f"(values: {objective})."
            )
        return history

    def _dataset(self, data, name, evaluation):
        if isinstance(data, (np.ndarray, list, tuple)):
            ids = np.asarray(data)
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise keras_tuner.errors.FatalValueError(
                    f"Expected `{name}` to be a 1-D array of token ids. "
                    f"Received: shape {ids.shape}, dtype {ids.dtype}"
                )
            try:
                _validation.token_ids(name, ids, self.vocabulary_size)
                return StreamDataset(
                    ids,
                    batch_size=(self.eval_batch_size or self.batch_size)
                    if evaluation else self.batch_size,
                    sequence_length=self.sequence_length,
                    drop_remainder=not evaluation,
                    max_tokens=self.max_validation_tokens if evaluation else self.max_tokens,
                )
            except ValueError as error:
                raise keras_tuner.errors.FatalValueError(str(error)) from error
        return data


def _check_dict(name, value):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(
            f"Expected `{name}` to be a dict or None. Received: {name}={value!r}"
        )
    return dict(value)


def _embedding_width(ratio, units):
    # Appendix A of the Mogrifier paper: above 1, embeddings are as wide as
    # the cell; below, round(ratio · units) as in the authors' code.
    if ratio > 1:
        return units
    return max(1, int(round(ratio * units)))


def _rank(rank, units, width, num_layers):
    """The `mogrifier_rank` argument for the searched rank k."""
    if rank <= 0:
        return None
    # Layer 1's matrices are width × units, the others units × units: a rank
    # reaching every matrix's smaller side is full rank; a rank above layer
    # 1's smaller side is clipped to it (the most it can have).
    smallest = min(width, units)
    full = smallest if num_layers == 1 else units
    if rank >= full:
        return None
    return int(min(rank, smallest))
