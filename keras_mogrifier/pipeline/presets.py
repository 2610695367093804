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
  per Σv² on every trainable variable, biases included; clip 10 → 10/70;
  Adam's ε 1e-8 (config line 63) → 1e-8/70, because ε is added to the root
  of the second moment of the summed loss's gradient (Keras's default 1e-7
  would be 700 times larger).
- `wikitext2`: the Mogrifier LSTM with a mixture of 2 softmaxes of the
  Mogrifier paper's Wikitext-2 rows (Table 1: 56.6 test perplexity, 39.0
  with dynamic evaluation), from lamb's released configuration
  `experiment/mogrifier/config/c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747/config`
  (cited by line below). Load the corpus with
  `keras_mogrifier.data.load_wikitext2(data_dir)`. lamb sizes the model by
  `num_params` 35M (line 7) with `hidden_size` -1 (line 31): the largest
  hidden size within the budget; 1366 units with embedding width
  `int(0.1993 · 1366)` = 272 (line 11, tied, lines 8 and 12) gives 34.99M
  parameters in this library's `LanguageModel` (33,278 words). The
  Mogrifier: 6 rounds of rank 48 (lines 26-27; `feature_mask` False on line
  28 is a deprecated flag, the rounds are set directly), on an LSTM
  (`model` lstm, line 22) with the capped input gate (line 36), forget
  bias 1 (line 54), lamb's skip connections (lines 24-25). Dropout: input
  .547 (16), inter-layer .199 (38; `cell_output_dropout` with
  `residual=False`), state .221 (39), output .348 (17), and lamb's
  `downprojected_output_dropout` on each component's context (-1, line 18:
  the output dropout, `lamb_flags.py` lines 555-556), here
  `mixture_dropout` .348 (see docs/mixture-of-softmaxes.md). One dropout sample (line 45);
  `drop_state_probability` 0.01 (49). Optimiser: lamb's RMSProp with
  β₂ .999, ε 1e-8 (lines 61-63), which is Adam with β₁ = 0 (Mogrifier
  §3.3), learning rate 3.29e-3 (74), batch 64 (67), BPTT 70 (70). On its
  loss summed over the window: `l2_penalty` 1.9e-4 (46) → 1.36e-6 per Σv²,
  `max_grad_norm` 10 (69) → 10/70, ε 1e-8 (63) → 1e-8/70
  (`keras_mogrifier.pipeline.units`).
  lamb trains 1000 turns of 200 steps (lines 57-59), 200k steps of 64×70
  tokens: about 430 epochs of Wikitext-2's 2.09M training tokens. Its
  weight averaging — a running arithmetic mean of the weights (`Averaged`,
  `lamb/averaged.py`), started once 50 turns pass without a better
  validation score or at turn 800 at the latest (`trigger_averaging_turns`
  line 71, `trigger_averaging_at_the_latest` line 72; `lamb/training.py`
  lines 92-93 and 325-331) — is closest to Two-Tailed Averaging here.
  (`model_average` arithmetic, line 44, is not weight averaging: it is how
  the objective combines several dropout samples, the log of the mean of
  their probabilities, `lamb/lm.py` lines 403-407, as `IWAEDropoutLoss`;
  with one sample, line 45, it does nothing.)
- `enwik8`: the Mogrifier paper's Enwik8 48M Mogrifier LSTM (Table 2: 1.146
  test bpc, 1.012 with dynamic evaluation) from lamb's released
  configuration `experiment/mogrifier/config/4d0a9a5bdb04+_tune_enwik8_48m_lstm_fm_d4_arms/trial_234/config`
  (cited by line below): 4 layers of 1158 units (the largest within 48M
  here), 6 rounds of rank 79, untied, skip connections, small dropout,
  Adam (β₁ = 0) at 1.02e-3, batch 128, BPTT 500, 28 epochs; `l2_penalty`
  9.93e-4 → 9.93e-7 per Σv² and `max_grad_norm` 10 → 0.02 on our mean
  loss (T = 500). Load the data with `keras_mogrifier.data.load_enwik8`.
- `text8`: *Circling Back*'s Text8 recipe (§7, Table 2: 48M Mogrifier
  RLSTM, 1.119 test bpc, 1.068 with dynamic evaluation): 6 residual layers
  of 1002 units, batch 128, BPTT 256, 200 epochs, one dropout sample,
  RAdam, Two-Tailed Averaging, Chrono; the rates and the mogrifier's
  rounds and rank, unpublished, start from the `enwik8` preset (l2 and
  clip converted with T = 256). Load the data with
  `keras_mogrifier.data.load_text8`.
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
            # lamb's value (every released config): without it, a model
            # trained on the embedded corpus's documents sometimes latched
            # from a zero state (one of 32 evaluation streams at perplexity
            # 4·10⁴, never predicting <eos>; docs/language-models.md).
            "drop_state_probability": 0.01,
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
            # lamb adam/rmsprop epsilon 1e-8 (config line 63) on the root of
            # its summed loss's second moment: 1e-8 / 70 on ours.
            "epsilon": units.summed_loss_epsilon(1e-8, _LAMB_T),
            # lamb max_grad_norm 10 on its summed loss (lm.py 462).
            "global_clipnorm": units.summed_loss_clipnorm(10.0, _LAMB_T),
            "two_tailed_averaging": True,
            "divergence_recovery": True,
            "eval_batch_size": 64,
            "jit_compile": "auto",
        },
    },
}

# deepmind/lamb experiment/mogrifier/config/
# c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747/config
_WT2_T = 70  # max_time_steps, line 70
PRESETS["wikitext2"] = {
    "model": {
        "units": 1366,  # num_params 35M (line 7), hidden_size -1 (line 31)
        "num_layers": 2,  # line 23
        "embedding_dim": 272,  # input_embedding_ratio 0.1993 (line 11)
        "cell": "mogrifier_lstm",
        "mogrifier_rounds": 6,  # feature_mask_rounds, line 26
        "mogrifier_rank": 48,  # feature_mask_rank, line 27
        "capped_input_gate": True,  # cap_input_gate, line 36
        "residual": False,  # residual_connections, line 24
        "skip_connections": True,  # lstm_skip_connection, line 25
        "tie_embeddings": True,  # line 8
        "mixture_of_softmaxes": 2,  # mos_num_components, line 13
        "input_dropout": 0.5469087645499495,  # line 16
        "cell_output_dropout": 0.1988228263748591,  # inter_layer_dropout, 38
        "state_dropout": 0.22137985867236876,  # line 39
        "output_dropout": 0.34766651193735193,  # line 17
        # downprojected_output_dropout -1 (line 18): the output dropout.
        "mixture_dropout": 0.34766651193735193,
        "samples": 1,  # num_training_samples, line 45
        "l2": units.summed_loss_l2(0.00018994987193751323, _WT2_T),  # line 46
        "drop_state_probability": 0.01,  # line 49
    },
    "training": {
        "batch_size": 64,  # line 67
        "sequence_length": _WT2_T,
        "epochs": 430,  # 1000 turns × 200 steps (lines 57-59) of 64×70 tokens
        "optimizer": "adam",  # rmsprop, β₂ .999, ε 1e-8 (lines 61-63)
        "learning_rate": 0.003287792100749033,  # line 74
        "beta_1": 0.0,
        "epsilon": units.summed_loss_epsilon(1e-8, _WT2_T),  # line 63
        "global_clipnorm": units.summed_loss_clipnorm(10.0, _WT2_T),  # line 69
        "two_tailed_averaging": True,
        "divergence_recovery": True,
        "eval_batch_size": 64,
        "jit_compile": "auto",
    },
}

# deepmind/lamb experiment/mogrifier/config/
# 4d0a9a5bdb04+_tune_enwik8_48m_lstm_fm_d4_arms/trial_234/config: the
# Mogrifier LSTM of the Mogrifier paper's Table 2, Enwik8 48M (test 1.146
# bpc, 1.012 with dynamic evaluation), cited by line below.
_ENWIK8_T = 500  # max_time_steps, line 70
PRESETS["enwik8"] = {
    "model": {
        # num_params 48M (line 7), hidden_size -1 (line 31): the largest
        # width within 48M parameters in this library's LanguageModel with
        # the 257 byte-level tokens (47.94M; 1159 units: 48.02M).
        "units": 1158,
        "num_layers": 4,  # line 23
        "embedding_dim": 1158,  # input_embedding_ratio 1.0 (line 11)
        "cell": "mogrifier_lstm",  # model lstm (line 22) with a feature mask
        "mogrifier_rounds": 6,  # feature_mask_rounds, line 26
        "mogrifier_rank": 79,  # feature_mask_rank, line 27
        "capped_input_gate": True,  # cap_input_gate, line 36
        "unit_forget_bias": True,  # forget_bias 1.0, line 54
        "residual": False,  # residual_connections, line 24
        "skip_connections": True,  # lstm_skip_connection, line 25
        "tie_embeddings": False,  # share_input_and_output_embeddings, line 8
        "input_dropout": 0.015496029112930465,  # line 16
        "cell_output_dropout": 0.008633961431527571,  # inter_layer_dropout, 38
        "state_dropout": 0.0437288219541186,  # line 39
        "output_dropout": 0.138307173174503,  # line 17
        "samples": 1,  # num_training_samples, line 45
        "l2": units.summed_loss_l2(0.000993383826740019, _ENWIK8_T),  # line 46
        "drop_state_probability": 0.01,  # line 49
    },
    "training": {
        "batch_size": 128,  # line 67
        "sequence_length": _ENWIK8_T,
        # turns 100 × steps_per_turn 400 (lines 57, 59) = 40,000 steps of
        # 128 × 500 bytes: 28.4 passes over the 90M training bytes (Circling
        # Back §7: "the baseline model ... was trained for only 29 epochs").
        "epochs": 28,
        "optimizer": "adam",  # rmsprop, β₂ .999, ε 1e-8 (lines 61-63)
        "learning_rate": 0.001021423409385794,  # line 74
        "beta_1": 0.0,
        "epsilon": units.summed_loss_epsilon(1e-8, _ENWIK8_T),  # line 63
        "global_clipnorm": units.summed_loss_clipnorm(10.0, _ENWIK8_T),  # line 69
        # lamb's weight averaging (a running mean of the weights, started
        # after 10 turns without improvement or at turn 80 at the latest,
        # lines 71-72) is closest to Two-Tailed Averaging here. (Its
        # `model_average` arithmetic, line 44, is how several dropout
        # samples combine, not weight averaging; see the wikitext2 notes.)
        "two_tailed_averaging": True,
        "divergence_recovery": True,
        "eval_batch_size": 64,
        "jit_compile": "auto",
    },
}

# Circling Back (Melis 2022) §7 and Table 2, Text8: 6-layer Mogrifier RLSTMs
# of 48M parameters (test 1.119 bpc, 1.068 with dynamic evaluation), batch
# 128, BPTT 256, 200 epochs, one dropout sample, the residual architecture,
# RAdam, Two-Tailed Averaging, Chrono initialisation. Its rates (picked from
# 60 random candidates) and the mogrifier's rounds and rank are not
# published: they start from the released Enwik8 48M configuration above
# (same kind of text, same model size), converted to this window.
_TEXT8_T = 256
_ENWIK8_MODEL = PRESETS["enwik8"]["model"]
PRESETS["text8"] = {
    "model": {
        # The largest width within 48M parameters with text8's 28 tokens
        # (47.98M; 1003 units: 48.07M).
        "units": 1002,
        "num_layers": 6,
        "embedding_dim": 1002,
        "cell": "mogrifier_rlstm",
        "mogrifier_rounds": _ENWIK8_MODEL["mogrifier_rounds"],
        "mogrifier_rank": _ENWIK8_MODEL["mogrifier_rank"],
        "chrono_t_max": math.exp(3.5),  # the middle of the tuned [e², e⁵]
        "residual": True,
        "tie_embeddings": False,
        "input_dropout": _ENWIK8_MODEL["input_dropout"],
        "cell_output_dropout": _ENWIK8_MODEL["cell_output_dropout"],
        "state_dropout": _ENWIK8_MODEL["state_dropout"],
        "output_dropout": _ENWIK8_MODEL["output_dropout"],
        "samples": 1,
        "l2": units.summed_loss_l2(0.000993383826740019, _TEXT8_T),
        "drop_state_probability": 0.01,
    },
    "training": {
        "batch_size": 128,
        "sequence_length": _TEXT8_T,
        "epochs": 200,
        "optimizer": "radam",
        # lamb's ε 1e-8 on the loss summed over the window, as for enwik8.
        "epsilon": units.summed_loss_epsilon(1e-8, _TEXT8_T),
        "learning_rate": 0.001021423409385794,
        "beta_1": 0.0,
        "global_clipnorm": units.summed_loss_clipnorm(10.0, _TEXT8_T),
        "two_tailed_averaging": True,
        "divergence_recovery": True,
        "eval_batch_size": 64,
        "jit_compile": "auto",
    },
}

TRAINING_DEFAULTS = {
    "batch_size": 32,
    "sequence_length": 35,
    "epochs": 1,
    "optimizer": "adam",
    "learning_rate": 1e-3,
    "beta_1": 0.9,
    "epsilon": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "halve_after_epoch": None,
    "cosine_decay_steps": None,
    "two_tailed_averaging": False,
    "averaging_frequency": 1000,
    "divergence_recovery": False,
    "eval_batch_size": None,
    "max_tokens": None,
    "jit_compile": "auto",
    "data_parallel": False,
    # Across epochs (LanguageModel.fit): the streams go on reading their text
    # and the state is carried, as lamb trains; True restarts both each
    # epoch (how this package trained before 0.2).
    "reset_state_each_epoch": False,
    # How far a stream's start moves when it wraps around the training text:
    # lamb's ±100 lines (lamb/corpus.py, get_batches: start_jitter=100, in
    # lines), in tokens at the text's mean line length.
    "start_jitter_lines": 100,
    # Seed of those moves (StreamDataset's `seed`).
    "stream_seed": 0,
}


def get_preset(name, model=None, training=None):
    """A copy of the preset `name`, with overrides.

    Args:
        name: str. One of `"tiny"`, `"small"`, `"paper"`, `"wikitext2"`,
            `"enwik8"`, `"text8"`.
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
