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
  clipped at 5, 13 epochs. Published test perplexity: 114.5. Their loss is
  the sum over the 20 time steps of a window (mean over the batch); ours is
  the per-token mean, so the same updates are SGD at 20 with the global norm
  clipped at 0.25 (= 5 / 20), which is what the preset sets.
- `paper`: the 24M-parameter Mogrifier RLSTM of Circling Back (Melis 2022):
  2 layers of 950 units, 5 rounds of rank 84, tied embeddings, residual
  connections with cell-output dropout, D = 8 dropout samples, RAdam,
  Two-Tailed Averaging, Chrono initialisation, batch 128, BPTT 70, gradient
  clipping at 10, ~400 epochs; the training loss is computed from the
  softmax features 1024 tokens at a time (`softmax_chunk_size`) so that the
  multi-sample logits are never materialised. The dropout rates, learning rate and l2 come
  from the released Mogrifier configuration (input .73, inter-layer .29,
  state .39, output .72, lr 2.3e-3, l2 2.5e-4) since the tuned values are
  not published; `chrono_t_max = e^3.5` is the middle of the tuned range
  `[e², e⁵]`. A GPU-scale run.
"""

import copy
import math

from keras_mogrifier import _validation

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
            "sequence_length": 20,
            "epochs": 13,
            # Zaremba's loss is summed over the 20 time steps (mean over the
            # batch): SGD at 1 with the gradient norm clipped at 5 on that
            # loss is exactly SGD at 20 clipped at 5 / 20 on our per-token
            # mean loss.
            "optimizer": "sgd",
            "learning_rate": 20.0,
            "halve_after_epoch": 4,
            "global_clipnorm": 0.25,
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
            "l2": 2.5e-4,
        },
        "training": {
            "batch_size": 128,
            "sequence_length": 70,
            "epochs": 400,
            "optimizer": "radam",
            "learning_rate": 2.3e-3,
            "beta_1": 0.0,
            "global_clipnorm": 10.0,
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
