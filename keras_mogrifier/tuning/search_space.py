"""The papers' hyperparameter search spaces, as data, and how to declare them.

Two spaces, each a dict `name -> spec` (see `LANGUAGE_MODEL_SEARCH_SPACE`
and `DYNAMIC_EVALUATION_SEARCH_SPACE`). A spec is a plain dict:

- `"type"`: `"float"`, `"int"`, `"choice"` or `"boolean"`;
- `"min"`, `"max"` (float and int) or `"values"` (choice and boolean);
- `"sampling"`: `"linear"` or `"log"` (float and int);
- `"default"`: the value KerasTuner reports for the hyperparameter before it
  samples one (the authors' released configuration where there is one);
- `"source"`: where the range comes from.

`resolve_space(space, ranges, remove)` applies a user's overrides and checks
them; `declare(hp, name, spec)` declares one hyperparameter on a
`keras_tuner.HyperParameters`.

Sources (plain-text copies in the project's `../shared/seeds/`):

- Melis, Kočiský, Blunsom, "Mogrifier LSTM", ICLR 2020, Appendix A: Table 4
  (model ranges, all tasks but Enwik8) and Table 6 (dynamic evaluation).
- Melis, "Circling Back to Recurrent Models of Language", 2022, §7: the
  residual architecture replaces `inter_layer_dropout` by
  `cell_output_dropout`, and Chrono's `T_max` is tuned in `[e², e⁵]`.
- "The Importance of the Current Input in Sequence Modeling" (the Dual
  paper), ICLR 2022 submission, Table 1: dual units and dual dropouts.
- The Mogrifier paper's Wikitext-2 rows use a mixture of K = 2 softmaxes
  (`mixture_of_softmaxes`), its PTB rows one softmax.
"""

import copy
import math
import numbers

from keras_mogrifier.models.language_model import CELLS

MOGRIFIER_TABLE_4 = (
    "Melis et al. 2020 (Mogrifier LSTM), Appendix A, Table 4"
)
MOGRIFIER_TABLE_6 = (
    "Melis et al. 2020 (Mogrifier LSTM), Appendix A, Table 6"
)
CIRCLING_BACK_7 = "Melis 2022 (Circling Back), §7"
DUAL_TABLE_1 = "Importance of the Current Input (Dual paper), Table 1"
MOGRIFIER_WT2_MOS = (
    "Melis et al. 2020 (Mogrifier LSTM), Table 1 and the released Wikitext-2 "
    "configuration (deepmind/lamb `experiment/mogrifier/config/"
    "c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747/config`"
    " line 13)"
)

MOGRIFIER_CELLS = tuple(c for c in CELLS if c.startswith("mogrifier"))

# Defaults are the authors' released PTB configuration (SPEC §7) where it
# has the value: lr 2.3e-3, l2 2.5e-4, dropouts .73/.29/.39/.72, 5 rounds of
# rank 84; T_max e^3.5 is the middle of its range (as in the `paper` preset).
LANGUAGE_MODEL_SEARCH_SPACE = {
    "learning_rate": {
        "type": "float", "min": 1e-3, "max": 4e-3, "sampling": "log",
        "default": 2.3e-3,
        "source": f"{MOGRIFIER_TABLE_4}: learning_rate 0.001–0.004, log",
    },
    "embedding_ratio": {
        "type": "float", "min": 0.0, "max": 2.0, "sampling": "linear",
        "default": 1.0,
        "source": f"{MOGRIFIER_TABLE_4}: input_embedding_ratio 0–2 (embedding "
        "width round(ratio·units); above 1 the width equals `units`)",
    },
    "l2": {
        "type": "float", "min": 5e-6, "max": 1e-3, "sampling": "log",
        "default": 2.5e-4,
        "source": f"{MOGRIFIER_TABLE_4}: l2_penalty 5e-6–1e-3, log, in lamb's "
        "units (on its loss summed over T steps, times Σ v²/2): the model gets "
        "l2_penalty / (2T) (`keras_mogrifier.pipeline.units.summed_loss_l2`)",
    },
    "input_dropout": {
        "type": "float", "min": 0.0, "max": 0.9, "sampling": "linear",
        "default": 0.73,
        "source": f"{MOGRIFIER_TABLE_4}: input_dropout 0–0.9",
    },
    "cell_output_dropout": {
        "type": "float", "min": 0.0, "max": 0.95, "sampling": "linear",
        "default": 0.29,
        "source": f"{MOGRIFIER_TABLE_4}: inter_layer_dropout 0–0.95, which "
        f"{CIRCLING_BACK_7} replaces by cell_output_dropout",
    },
    "state_dropout": {
        "type": "float", "min": 0.0, "max": 0.8, "sampling": "linear",
        "default": 0.39,
        "source": f"{MOGRIFIER_TABLE_4}: state_dropout 0–0.8",
    },
    "output_dropout": {
        "type": "float", "min": 0.0, "max": 0.95, "sampling": "linear",
        "default": 0.72,
        "source": f"{MOGRIFIER_TABLE_4}: output_dropout 0–0.95",
    },
    "cell": {
        "type": "choice", "values": ["mogrifier_lstm", "mogrifier_rlstm"],
        "default": "mogrifier_lstm",
        "source": f"{CIRCLING_BACK_7}: Mogrifier LSTM vs Mogrifier RLSTM "
        "(the plain cells are mogrifier_rounds = 0)",
    },
    "mogrifier_rounds": {
        "type": "int", "min": 0, "max": 6, "sampling": "linear",
        "default": 5,
        "source": f"{MOGRIFIER_TABLE_4}: mogrifier_rounds (r) 0–6",
    },
    "mogrifier_rank": {
        "type": "int", "min": -20, "max": 100, "sampling": "linear",
        "default": 84,
        "source": f"{MOGRIFIER_TABLE_4}: mogrifier_rank (k) -20–100; k ≤ 0 "
        "means full rank (Appendix A), so about 1/6 of draws are full rank",
    },
    "chrono_t_max": {
        "type": "float", "min": math.exp(2.0), "max": math.exp(5.0),
        "sampling": "log", "default": math.exp(3.5),
        "source": f"{CIRCLING_BACK_7}: T_max in [e², e⁵] (sampled uniformly "
        "in log T_max)",
    },
    "dual": {
        "type": "boolean", "values": [False, True], "default": False,
        "source": f"{DUAL_TABLE_1}: ERS (no Dual head) vs Dual architecture",
    },
    "dual_units": {
        "type": "choice", "values": [400, 850], "default": 850,
        "source": f"{DUAL_TABLE_1}: Dual units {{400, 850}} (for models of "
        "400–1150 units; scale it with the model)",
    },
    "dual_dropout": {
        "type": "float", "min": 0.0, "max": 0.5, "sampling": "linear",
        "default": 0.5,
        "source": f"{DUAL_TABLE_1}: Dual input dropout 0–0.5 (the Dual "
        "output dropout is `output_dropout` here)",
    },
    "mixture_of_softmaxes": {
        "type": "choice", "values": [0, 2], "default": 0,
        "source": f"{MOGRIFIER_WT2_MOS}: one softmax (PTB rows) or a mixture "
        "of K = 2 softmaxes (Wikitext-2 rows, `mos_num_components` 2)",
    },
}

# The default space of `DynamicEvaluationTuner`, in the library's units: the
# rule of SPEC §5 on the per-token *mean* loss of a segment, ε added after the
# square root, decay normalised by the mean RMS. It is the box of the Mogrifier
# paper's Table 6, converted. The paper's values are for the authors' code
# (deepmind/lamb): `lamb/dyneval.py` `Dyneval._make_update` applies
# `-lr * grad / (ms + epsilon) + min(1, decay_rate * ms / gsum) * (save - var)`
# with `grad` the gradient of `lamb/lm.py` `_build_loss`'s `self.loss`, the
# cross-entropy *summed* over the segment's n time steps (`reduce_sum(...,
# axis=0)`, mean over the batch), and `ms` the RMS of that same gradient over
# training windows of the same length; `gsum` is the mean over all elements.
# Both the gradient and the RMS are n times ours, so in our units η and λ are
# as printed and ε is ε/n (`loss_reduction="sum"` in the tuner searches the
# paper's box and divides ε by each trial's n). Table 6's ε range 1e-8–1e-2 is
# therefore 1e-8/n–1e-2/n here: 5e-10–1e-2 over n = 1–20.
DYNAMIC_EVALUATION_SEARCH_SPACE = {
    "segment_length": {
        "type": "int", "min": 1, "max": 20, "sampling": "linear", "default": 5,
        "source": f"{MOGRIFIER_TABLE_6}: max_time_steps 1–20 (word level; "
        "1–50 at character level)",
    },
    "learning_rate": {
        "type": "float", "min": 1e-6, "max": 1e-3, "sampling": "log",
        "default": 5e-5,
        "source": f"{MOGRIFIER_TABLE_6}: dyneval_learning_rate 1e-6–1e-3, log; "
        "the same in the library's units (gradient and RMS both n × ours "
        "there); default: Krause et al.'s 5e-5",
    },
    "decay_rate": {
        "type": "float", "min": 1e-6, "max": 1e-2, "sampling": "log",
        "default": 2e-3,
        "source": f"{MOGRIFIER_TABLE_6}: dyneval_decay_rate 1e-6–1e-2, log "
        "(unchanged: a ratio of RMS values with the global normaliser)",
    },
    "epsilon": {
        "type": "float", "min": 5e-10, "max": 1e-2, "sampling": "log",
        "default": 2e-5,
        "source": f"{MOGRIFIER_TABLE_6}: dyneval_epsilon 1e-8–1e-2, log, on "
        "the summed loss: ε/n here, 5e-10–1e-2 over n = 1–20; default: "
        "Krause et al.'s 2e-5",
    },
}

# The largest η/ε, in the library's units, that `DynamicEvaluationTuner`'s
# oracles draw from the box above (a draw above it is drawn again). Step sizes
# of elements whose RMS is below ε are η·g/ε, so the diverging corner of the
# box is a diagonal one. Measured (docs/tuning.md, "Where dynamic evaluation
# diverges"): on a `tiny` PTB model trained 1 epoch (n = 5, λ = 1e-6), every
# setting with η/ε ≥ 30 diverged, and two of four at η/ε = 10; every one up
# to 3.3 completed, the best at η/ε = 1. On issue 26's 6-epoch PTB model
# (10 draws of the box) the three that diverged had η/ε ≥ 1.0e4, the two that
# beat static evaluation 9.6 and 35, the others above 10 were worse than
# static. Krause et al.'s setting is 2.5.
MAX_LEARNING_RATE_OVER_EPSILON = 10.0

# One default space per update rule of `DynamicEvaluator` (Krause et al.'s
# ladder, `keras_mogrifier.evaluation.update_rules`), in the library's units.
# The RMS rules share Table 6's box (converted above); eq. 6 reads λ as the
# fraction of (θ_g − θ) restored per segment, everywhere alike, for which the
# same 1e-6–1e-2 is the natural range (eq. 8's min(1, λ·RMS/mean RMS) is that
# fraction for an element of average RMS). SGD (eq. 4; plain SGD with λ = 0)
# has no published range: its step η·g equals the RMS rule's η_rms·g/RMS for
# η = η_rms / RMS, and the mean RMS of a trained word-level model's gradients
# is ~1e-3 (measured on the PTB models of docs/dynamic-evaluation.md), so
# Table 6's η_rms range 1e-6–1e-3 maps to about 1e-3–1; it needs no ε.
DYNAMIC_EVALUATION_SEARCH_SPACES = {
    "rms_rms_prior": DYNAMIC_EVALUATION_SEARCH_SPACE,
    "rms_global_prior": DYNAMIC_EVALUATION_SEARCH_SPACE,
    "sgd": {
        "segment_length": DYNAMIC_EVALUATION_SEARCH_SPACE["segment_length"],
        "learning_rate": {
            "type": "float", "min": 1e-3, "max": 1.0, "sampling": "log",
            "default": 0.03,
            "source": f"{MOGRIFIER_TABLE_6}'s η range 1e-6–1e-3 for the RMS rule, "
            "divided by a mean RMS of ~1e-3: the SGD step of the same size",
        },
        "decay_rate": DYNAMIC_EVALUATION_SEARCH_SPACE["decay_rate"],
    },
}

# What each hyperparameter may take, whatever the range: (check, message).
_DOMAINS = {
    "learning_rate": (lambda v: v > 0, "positive"),
    "embedding_ratio": (lambda v: v >= 0, "non-negative"),
    "l2": (lambda v: v > 0, "positive (fix `l2` to 0 to turn it off)"),
    "input_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "cell_output_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "state_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "output_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "dual_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "mogrifier_rounds": (lambda v: v >= 0, "non-negative"),
    "mogrifier_rank": (lambda v: True, "an integer"),
    "chrono_t_max": (
        lambda v: v > 2, "larger than 2 (Chrono draws from U(1, T_max − 1))"
    ),
    "cell": (lambda v: v in CELLS, f"one of {list(CELLS)}"),
    "dual": (lambda v: isinstance(v, bool), "a bool"),
    "dual_units": (
        lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)
        and v > 0,
        "a positive integer",
    ),
    "mixture_of_softmaxes": (
        lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)
        and v >= 0,
        "a non-negative integer (0: one softmax)",
    ),
    "segment_length": (lambda v: v >= 1, "at least 1"),
    "decay_rate": (lambda v: v > 0, "positive"),
    "epsilon": (lambda v: v > 0, "positive"),
}


def _is_number(value, integer=False):
    if isinstance(value, bool):
        return False
    kind = numbers.Integral if integer else numbers.Real
    return isinstance(value, kind) and math.isfinite(value)


def _resolve_one(name, spec, override):
    """The spec of `name` with the range `override` applied and checked."""
    check, meaning = _DOMAINS[name]
    spec = dict(spec)
    kind = spec["type"]
    if kind in ("float", "int"):
        integer = kind == "int"
        if (
            not isinstance(override, (list, tuple))
            or len(override) != 2
            or not all(_is_number(v, integer) for v in override)
        ):
            raise ValueError(
                f"Expected the range of `{name}` to be a pair (low, high) of "
                f"{'integers' if integer else 'finite numbers'}. "
                f"Received: {name}={override!r}"
            )
        low, high = override
        if low > high:
            raise ValueError(
                f"Expected low <= high in the range of `{name}`. "
                f"Received: {name}={override!r}"
            )
        for value in (low, high):
            if not check(value):
                raise ValueError(
                    f"Expected the range of `{name}` to be {meaning}. "
                    f"Received: {name}={override!r}"
                )
        if spec["sampling"] == "log" and low <= 0:
            raise ValueError(
                f"Expected a positive range for `{name}`, which is sampled on "
                f"a log scale. Received: {name}={override!r}"
            )
        spec["min"], spec["max"] = (int(low), int(high)) if integer else (
            float(low), float(high)
        )
        if not spec["min"] <= spec["default"] <= spec["max"]:
            spec["default"] = spec["min"]
    else:
        if not isinstance(override, (list, tuple)) or not override:
            raise ValueError(
                f"Expected the values of `{name}` to be a non-empty list. "
                f"Received: {name}={override!r}"
            )
        for value in override:
            if not check(value):
                raise ValueError(
                    f"Expected every value of `{name}` to be {meaning}. "
                    f"Received: {name}={override!r}"
                )
        if len(set(override)) != len(override):
            raise ValueError(
                f"Expected distinct values of `{name}`. "
                f"Received: {name}={override!r}"
            )
        spec["values"] = list(override)
        if spec["default"] not in spec["values"]:
            spec["default"] = spec["values"][0]
    spec["source"] = f"user range (the default follows {spec['source']})"
    return spec


def resolve_space(space, ranges=None, remove=()):
    """A copy of `space` with `ranges` applied and the names `remove` dropped.

    Args:
        space: dict. One of the module's search spaces.
        ranges: dict or None. `name -> (low, high)` for float and int
            hyperparameters, `name -> [values]` for choices and booleans, or
            `name -> None` to take `name` out of the search (the model's or
            evaluator's default applies). Defaults to `None`.
        remove: iterable of str. Names to drop (e.g. values fixed elsewhere).

    Returns:
        A dict `name -> spec`, in the order of `space`.
    """
    ranges = dict(ranges or {})
    unknown = sorted(set(ranges) - set(space))
    if unknown:
        raise ValueError(
            f"Expected `ranges` to name hyperparameters among {list(space)}. "
            f"Received unknown: {unknown}"
        )
    resolved = {}
    for name, spec in space.items():
        if name in remove:
            continue
        if name in ranges:
            if ranges[name] is None:
                continue
            resolved[name] = _resolve_one(name, spec, ranges[name])
        else:
            resolved[name] = copy.deepcopy(spec)
    return resolved


# A fixed value (not searched) may also be 0 for these: no l2 penalty, a
# static pass (dynamic evaluation with η = 0), no decay back to θ_g.
_FIXED_NON_NEGATIVE = ("learning_rate", "l2", "decay_rate")


def check_value(space, name, value):
    """Checks a fixed (not searched) value of the hyperparameter `name`."""
    spec = space[name]
    check, meaning = _DOMAINS[name]
    if name in _FIXED_NON_NEGATIVE:
        check, meaning = (lambda v: v >= 0), "non-negative"
    if spec["type"] in ("float", "int"):
        ok = _is_number(value, spec["type"] == "int") and check(value)
        if spec["type"] == "int":
            meaning = f"an integer, {meaning}"
    else:
        ok = check(value)
    if not ok:
        raise ValueError(
            f"Expected `{name}` to be {meaning}. Received: {name}={value!r}"
        )
    return value


def declare(hp, name, spec):
    """Declares `name` on the `keras_tuner.HyperParameters` `hp`; returns its value."""
    kind = spec["type"]
    if kind in ("float", "int") and spec["min"] == spec["max"]:
        return hp.Fixed(name, spec["min"])
    if kind == "float":
        return hp.Float(
            name, spec["min"], spec["max"], sampling=spec["sampling"],
            default=spec["default"],
        )
    if kind == "int":
        return hp.Int(
            name, spec["min"], spec["max"], sampling=spec["sampling"],
            default=spec["default"],
        )
    if len(spec["values"]) == 1:
        return hp.Fixed(name, spec["values"][0])
    if kind == "boolean":
        return hp.Boolean(name, default=spec["default"])
    return hp.Choice(name, spec["values"], default=spec["default"])


def search_space_table(space):
    """A Markdown table of a search space: name, range, sampling, source."""
    rows = ["| hyperparameter | range | sampling | source |", "| --- | --- | --- | --- |"]
    for name, spec in space.items():
        if spec["type"] in ("float", "int"):
            span = f"[{spec['min']:.4g}, {spec['max']:.4g}]"
            sampling = spec["sampling"]
        else:
            span = "{" + ", ".join(str(v) for v in spec["values"]) + "}"
            sampling = "choice"
        rows.append(f"| `{name}` | {span} | {sampling} | {spec['source']} |")
    return "\n".join(rows)
