"""Named configurations of a language-modelling run: model and training.

A preset is a dict with two parts: `"model"`, the arguments of
`LanguageModel` (without `vocabulary_size`, which comes from the corpus), and
`"training"`, the arguments of `train_language_model`. `get_preset(name,
**overrides)` returns a copy with overrides applied to either part.

- `tiny`: a small Mogrifier LSTM that trains in a few minutes on 2 CPU cores
  on the embedded corpus (a smoke run on Penn Treebank with `max_tokens`).
- `small`: the classic small configuration of Zaremba et al. (2014), exactly
  as SPEC §7 describes it: a plain LSTM (no capped gate), untied embeddings,
  plain stacking, no dropout, 2 × 200, batch 20, BPTT 20, every parameter
  (biases included) uniform in ±0.1, SGD at learning rate 1 for epochs 1–5
  and halved before each later epoch (epoch 13 at 2⁻⁸; `main.lua`: `if epoch
  > max_epoch (4) then lr = lr / 2`, checked after each epoch), gradient norm
  clipped at 5, 13 epochs. Published test perplexity: 114.5, at τ = 1 on one
  sequential stream (`main.lua` `run_test`): compare it with
  `run_experiment`'s `test_perplexity_tau1_one_stream`, not with the tuned
  `test_perplexity`. Their loss is
  the sum over the 20 time steps of a window (mean over the batch); ours is
  the per-token mean, so the same updates are SGD at 20 with the global norm
  clipped at 0.25 (= 5 / 20), which is what the preset sets.
- `paper`: the 24M-parameter Mogrifier RLSTM of Circling Back (Melis 2022):
  2 layers of 950 units, 5 rounds of rank 84, tied embeddings, residual
  connections with cell-output dropout, D = 8 dropout samples, RAdam,
  Two-Tailed Averaging, Chrono initialisation, batch 128, BPTT 70, ~400
  epochs; the training loss is computed from the softmax features 1024
  tokens at a time (`softmax_chunk_size`) so that the multi-sample logits
  are never materialised. A GPU-scale run. Circling Back re-tuned its
  dropout rates, learning rate and l2 for this architecture and did not
  publish them: the preset starts from the released PTB configuration of the
  Mogrifier LSTM (deepmind/lamb
  `experiment/mogrifier/config/786252db3825+_tune_ptb_24m_lstm_fm_d2_arms/trial_483/config`:
  input_dropout .729, inter_layer_dropout .291, state_dropout .387,
  output_dropout .716, learning_rate 2.3e-3, l2_penalty 2.52e-4,
  max_grad_norm 10, drop_state_probability 0.01), which were tuned for
  lamb's *skip-connection* model, where the inter-layer mask hits only the
  second layer's input; here the cell-output mask also multiplies the last
  layer's output before the output dropout, so these rates are starting
  values for the Circling Back architecture, to be re-tuned.
  So this is Circling Back's architecture with the old rates as a start,
  not a configuration either paper published; lamb's own wiring is
  `residual=False, skip_connections=True` (docs/fidelity.md).
  `chrono_t_max = e^3.5` is the middle of the tuned range `[e², e⁵]`.
  lamb's l2 and clip are for its loss summed over the 70 steps of a window
  and are converted (`keras_mogrifier.pipeline.units`): l2 2.5e-4 → 1.79e-6
  per Σv² on every trainable variable, biases included; clip 10 → 10/70.
"""

import copy
import math

from keras_mogrifier import _validation
from keras_mogrifier.pipeline import units

_ZAREMBA_T = 20  # main.lua: seq_length=20
_LAMB_T = 70  # lamb PTB config: max_time_steps 70

PRESETS = {
    "tiny": {
        "model": {
            "units": 128,
            "num_layers": 2,
            "embedding_dim": 128,
            "cell": "mogrifier_lstm",
            "mogrifier_rounds": 4,
            "mogrifier_rank": 16,
            "residual": True,
            "tie_embeddings": True,
            "input_dropout": 0.2,
            "cell_output_dropout": 0.1,
            "state_dropout": 0.1,
            "output_dropout": 0.2,
        },
        "training": {
            "batch_size": 32,
            "sequence_length": 35,
            "epochs": 6,
            "optimizer": "adam",
            "learning_rate": 3e-3,
            "beta_1": 0.0,
            "clipnorm": 10.0,
            "eval_batch_size": 32,
            "jit_compile": "auto",
        },
    },
    "small": {
        "model": {
            "units": 200,
            "num_layers": 2,
            "embedding_dim": 200,
            "cell": "lstm",
            "capped_input_gate": False,
            "unit_forget_bias": False,
            "residual": False,
            "tie_embeddings": False,
            "initializer": {
                "class_name": "RandomUniform",
                "config": {"minval": -0.1, "maxval": 0.1, "seed": None},
                "module": "keras.initializers",
                "registered_name": None,
            },
        },
        "training": {
            "batch_size": 20,
            "sequence_length": _ZAREMBA_T,
            "epochs": 13,
            # main.lua: lr=1, max_grad_norm=5 on the loss summed over the
            # 20 steps of a window (see `units`): SGD at 20, clip 0.25 here.
            "optimizer": "sgd",
            "learning_rate": units.summed_loss_learning_rate(1.0, _ZAREMBA_T),
            "halve_after_epoch": 4,
            "global_clipnorm": units.summed_loss_clipnorm(5.0, _ZAREMBA_T),
            "eval_batch_size": 20,
            "jit_compile": "auto",
        },
    },
    "paper": {
        "model": {
            "units": 950,
            "num_layers": 2,
            "embedding_dim": 950,
            "cell": "mogrifier_rlstm",
            "mogrifier_rounds": 5,
            "mogrifier_rank": 84,
            "residual": True,
            "tie_embeddings": True,
            "input_dropout": 0.73,
            "cell_output_dropout": 0.29,
            "state_dropout": 0.39,
            "output_dropout": 0.72,
            "chrono_t_max": math.exp(3.5),
            "samples": 8,
            # B·D·T·V = 128·8·70·10k logits would be 2.9 GB in float32.
            "softmax_chunk_size": 1024,
            # lamb l2_penalty 2.5e-4 on its summed loss (lm.py 430-446).
            "l2": units.summed_loss_l2(2.5e-4, _LAMB_T),
            # lamb training.py feeds each stream's state zeroed w.p. 0.01.
            "drop_state_probability": 0.01,
        },
        "training": {
            "batch_size": 128,
            "sequence_length": _LAMB_T,
            "epochs": 400,
            "optimizer": "radam",
            "learning_rate": 2.3e-3,
            "beta_1": 0.0,
            # lamb max_grad_norm 10 on its summed loss (lm.py 462).
            "global_clipnorm": units.summed_loss_clipnorm(10.0, _LAMB_T),
            "two_tailed_averaging": True,
            "divergence_recovery": True,
            "eval_batch_size": 64,
            "jit_compile": "auto",
        },
    },
}

TRAINING_DEFAULTS = {
    "batch_size": 32,
    "sequence_length": 35,
    "epochs": 1,
    "optimizer": "adam",
    "learning_rate": 1e-3,
    "beta_1": 0.9,
    "clipnorm": None,
    "global_clipnorm": None,
    "halve_after_epoch": None,
    "two_tailed_averaging": False,
    "averaging_frequency": 1000,
    "divergence_recovery": False,
    "eval_batch_size": None,
    "max_tokens": None,
    "jit_compile": "auto",
    "data_parallel": False,
}


def get_preset(name, model=None, training=None):
    """A copy of the preset `name`, with overrides.

    Args:
        name: str. One of `"tiny"`, `"small"`, `"paper"`.
        model: dict or None. Overrides of `LanguageModel` arguments.
        training: dict or None. Overrides of training settings (see
            `TRAINING_DEFAULTS`).

    Returns:
        A dict `{"model": {...}, "training": {...}}` with every training
        setting present.
    """
    _validation.one_of("preset", name, PRESETS)
    preset = copy.deepcopy(PRESETS[name])
    preset["model"].update(model or {})
    unknown = set(training or {}) - set(TRAINING_DEFAULTS)
    if unknown:
        raise ValueError(
            f"Expected training settings among {sorted(TRAINING_DEFAULTS)}. "
            f"Received unknown: {sorted(unknown)}"
        )
    merged = dict(TRAINING_DEFAULTS)
    merged.update(preset["training"])
    merged.update(training or {})
    preset["training"] = merged
    return preset
