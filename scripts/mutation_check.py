"""A mutation check of the test suite over the library's core math.

Each *mutant* below is one small, deliberate bug in the package — an operator
flipped, a term dropped, an index off by one, a wrong axis, a constant
changed — in the cells' equations, the Mogrifier rounds, the update rules of
dynamic evaluation, the RMS statistics, the IWAE loss, the chunked softmax,
the stream batching, the optimizers, the mixture of softmaxes, the metrics
and the neural cache. For every mutant the script copies the repository
(`keras_mogrifier/`, `tests/` and what the tests read: `examples/`,
`benchmarks/`, `tuning/`, `scripts/`, `docs/`, `pyproject.toml`,
`README.md`, `CHANGELOG.md`, `MANIFEST.in`) into a temporary directory, applies the mutant there (its `old`
snippet must occur exactly once in the file), and runs the test files that
cover that module:

    python -m pytest -x -q -rfE -p no:cacheprovider <test files>

with `cwd` and `PYTHONPATH` the copy (so the mutated package is the one
imported, whatever the environment's editable install points at: checked
before every run), `KERAS_BACKEND` the backend and `OMP_NUM_THREADS=1`.
Exit status 1 (a test failed) means the suite *killed* the mutant, 0 that
it *survived*; a timeout or any other status (2 interrupted, e.g. a
collection error; 3 internal error; 4 usage error; 5 no tests; a signal) is
recorded as such and printed, and is neither.

Before the mutants, each distinct set of test files is run once on the
unmutated copy (the *baseline*): a set that fails there cannot judge its
mutants, which are then reported as `baseline-failed` and not run.

Most mutated code runs on every backend. A mutant whose code runs only on
some backends says so (`backends`), and runs on the requested backend if it
is one of them, else on the first it names: the generic update rules
(`evaluation/update_rules.py`) are what TensorFlow and JAX compile, while
PyTorch applies its own fused in-place form of the same rules
(`backend/torch.py`, `in_place_update`), which has its own mutants.

The results go to a JSON file, rewritten after every mutant (a run that is
stopped keeps what it did; `--resume` skips the ids already in it): per
mutant its id, file, description, test files, backend, outcome, exit status,
seconds and the first failing test; and the commit of the library (with
whether the working tree is dirty), the commit of the tests, the backend and
the date.

Use: before and after a change to the test suite (e.g. making it faster),
run the mutants once with the old suite and once with the new one, against
the same library, then compare. Every mutant the old suite killed, the new
one must kill too.

    # The old suite (tests/ from a commit) against today's library:
    python scripts/mutation_check.py --tests-from 4ca2d99 --output old.json
    # The suite of the working tree:
    python scripts/mutation_check.py --output new.json
    # Markdown table and counts; exit status 1 if a mutant the old suite
    # killed is not killed by the new one:
    python scripts/mutation_check.py --compare old.json new.json

Other commands:

    python scripts/mutation_check.py --list           # the mutants; checks
        # every `old` snippet occurs exactly once and the mutated file compiles
    python scripts/mutation_check.py --only rlstm-forget-gate-sign,sgd-decay-sign
    python scripts/mutation_check.py --backend jax --jobs 2 --timeout 1200
    python scripts/mutation_check.py --output new.json --resume   # go on

A whole run takes hours of CPU (about 70 pytest runs of one to three test
files each, plus the baselines); `--only` runs a few.
"""

import argparse
import ast
import concurrent.futures
import dataclasses
import datetime
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("torch", "jax", "tensorflow")
# What a copy of the repository holds: the package, the tests, and what the
# tests read (the example, benchmark and tuning scripts they run, the docs
# some check, the project file pytest reads its options from).
COPIED = (
    "keras_mogrifier",
    "tests",
    "examples",
    "benchmarks",
    "tuning",
    "scripts",
    "docs",
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",  # with MANIFEST.in: the sdist that package_install_test builds
    "MANIFEST.in",
)
IGNORED = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "*.egg-info", ".pytest_cache"
)
OUTCOMES_OF_EXIT = {
    0: "survived",
    1: "killed",
    2: "interrupted",
    3: "internal-error",
    4: "usage-error",
    5: "no-tests-collected",
}


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # path of the mutated file, from the repository root
    old: str  # occurs exactly once in the file
    new: str
    description: str
    tests: tuple  # test files that cover the module, from the repository root
    backends: tuple = None  # where the mutated code runs (None: everywhere)

    def backend_for(self, requested):
        if self.backends is None or requested in self.backends:
            return requested
        return self.backends[0]


PKG = "keras_mogrifier/"
MOGRIFIER = PKG + "layers/mogrifier.py"
LSTM_CELL = PKG + "layers/mogrifier_lstm_cell.py"
RLSTM_CELL = PKG + "layers/rlstm_cell.py"
MOGRIFIED_CELL = PKG + "layers/mogrified_cell.py"
DUAL = PKG + "layers/dual_output.py"
UPDATE_RULES = PKG + "evaluation/update_rules.py"
TORCH_BACKEND = PKG + "backend/torch.py"
ADAPTATION_STEP = PKG + "evaluation/_adaptation_step.py"
GRADIENT_STATISTICS = PKG + "evaluation/_gradient_statistics.py"
TOKEN_NLL = PKG + "losses/token_nll.py"
IWAE = PKG + "losses/iwae_dropout_loss.py"
OBJECTIVE = PKG + "models/_objective.py"
CHUNKED = PKG + "losses/chunked_log_softmax.py"
BATCHING = PKG + "data/batching.py"
RADAM = PKG + "optimizers/rectified_adam.py"
TTA = PKG + "optimizers/two_tailed_averaging_optimizer.py"
CONTROLLER = PKG + "optimizers/two_tailed_controller.py"
MOS = PKG + "layers/mixture_of_softmaxes.py"
PERPLEXITY = PKG + "metrics/perplexity.py"
BPC = PKG + "metrics/bits_per_character.py"
TOKEN_METRIC = PKG + "metrics/_token_nll_metric.py"
CACHE = PKG + "evaluation/neural_cache.py"
DECODER = PKG + "generation/decoder.py"

T_MOGRIFIER = ("tests/layers/mogrifier_test.py",)
T_FOLD = ("tests/layers/mogrifier_test.py", "tests/layers/cell_rnn_test.py")
T_LSTM = ("tests/layers/mogrifier_lstm_cell_test.py",)
T_RLSTM = ("tests/layers/rlstm_cell_test.py",)
T_CELL = ("tests/layers/mogrified_cell_test.py", "tests/layers/rlstm_cell_test.py")
T_CELL_RNN = ("tests/layers/cell_rnn_test.py", "tests/layers/mogrified_rnn_test.py")
T_DUAL = ("tests/layers/dual_output_test.py",)
T_DYNAMIC = ("tests/evaluation/dynamic_evaluator_test.py",)
T_SAFETY = (
    "tests/evaluation/dynamic_evaluation_safety_test.py",
    "tests/evaluation/dynamic_evaluator_test.py",
)
T_SPARSE = ("tests/evaluation/sparse_dynamic_evaluation_test.py",)
T_IWAE = ("tests/losses/iwae_dropout_loss_test.py", "tests/losses/token_nll_test.py")
T_MULTI_SAMPLE = ("tests/models/multi_sample_test.py",)
T_CHUNKED = ("tests/losses/chunked_log_softmax_test.py",)
T_BATCHING = ("tests/data/batching_test.py",)
T_CONTINUED = ("tests/data/continued_streams_test.py", "tests/data/batching_test.py")
T_RADAM = ("tests/optimizers/rectified_adam_test.py",)
T_TTA = ("tests/optimizers/two_tailed_averaging_optimizer_test.py",)
T_CONTROLLER = ("tests/optimizers/two_tailed_controller_test.py",)
T_MOS = ("tests/models/mixture_of_softmaxes_test.py",)
T_METRICS = ("tests/metrics/perplexity_test.py", "tests/metrics/bits_per_character_test.py")
T_CACHE = ("tests/evaluation/neural_cache_test.py",)
T_DECODING = ("tests/generation/decoding_step_test.py",)
T_HAND_BACKWARD = ("tests/evaluation/adaptation_gradients_test.py",)
RULE_BACKENDS = ("jax", "tensorflow")  # PyTorch runs its fused form instead

M = Mutant
MUTANTS = (
    # --- The Mogrifier rounds (layers/mogrifier.py) ---------------------------
    M("mogrifier-odd-round-gated-by-x", MOGRIFIER,
      "z = h if i % 2 == 1 else x",
      "z = x if i % 2 == 1 else h",
      "odd rounds read x instead of h (x gated by itself first)", T_MOGRIFIER),
    M("mogrifier-x-doubling-dropped", MOGRIFIER,
      "x = x + x",
      "x = x",
      "the factor 2 of 2σ(·) ⊙ x left out", T_MOGRIFIER),
    M("mogrifier-h-gate-negated", MOGRIFIER,
      "h = ops.sigmoid(z) * h",
      "h = ops.sigmoid(-z) * h",
      "even rounds gate h by σ(−z) instead of σ(z)", T_MOGRIFIER),
    M("mogrifier-one-round-fewer", MOGRIFIER,
      "for i in range(1, self.rounds + 1):",
      "for i in range(1, self.rounds):",
      "one round fewer built (and run) than `rounds`", T_MOGRIFIER),
    M("mogrifier-fold-scales-swapped", MOGRIFIER,
      'source, target = ("h", "x") if i % 2 == 1 else ("x", "h")',
      'source, target = ("x", "h") if i % 2 == 1 else ("h", "x")',
      "fold_doubling credits each round's doubling to the wrong vector", T_FOLD),
    M("mogrifier-lowrank-init-exponent", MOGRIFIER,
      "return (1.0 / (self.fan_in * self.rank)) ** 0.25",
      "return (1.0 / (self.fan_in * self.rank)) ** 0.5",
      "low-rank factor init stddev (1/(fan_in·k))^(1/2) instead of ^(1/4)", T_MOGRIFIER),
    M("mogrifier-init-fan-in-of-target", MOGRIFIER,
      "or MogrifierFactorInitializer(source, self.rank)",
      "or MogrifierFactorInitializer(target, self.rank)",
      "default initializer's fan-in is the target's size, not the source's",
      T_MOGRIFIER + ("tests/models/initialization_test.py",)),
    # --- Mogrifier LSTM cell (layers/mogrifier_lstm_cell.py) ------------------
    M("lstm-gates-i-f-swapped", LSTM_CELL,
      "z_i, z_f, z_j, z_o = ops.split(z, 4, axis=-1)",
      "z_f, z_i, z_j, z_o = ops.split(z, 4, axis=-1)",
      "input and forget gate blocks swapped (not Keras's i, f, j, o)", T_LSTM),
    M("lstm-input-cap-not-negated", LSTM_CELL,
      "i = ops.sigmoid(ops.minimum(z_i, ops.negative(z_f)))",
      "i = ops.sigmoid(ops.minimum(z_i, z_f))",
      "capped input gate min(i, f) instead of min(i, 1 − f)", T_LSTM),
    M("lstm-forget-gate-dropped", LSTM_CELL,
      "c = f * c_prev + i * ops.tanh(z_j)",
      "c = c_prev + i * ops.tanh(z_j)",
      "c = c_prev + i ⊙ j: the forget gate left out", T_LSTM),
    M("lstm-output-tanh-dropped", LSTM_CELL,
      "h = ops.sigmoid(z_o) * ops.tanh(c)",
      "h = ops.sigmoid(z_o) * c",
      "h = o ⊙ c instead of o ⊙ tanh(c)", T_LSTM),
    # --- RLSTM cell (layers/rlstm_cell.py) ------------------------------------
    M("rlstm-forget-gate-sign", RLSTM_CELL,
      'f = ops.sigmoid(ops.add(z_f, ops.matmul(i * j, weights["forget_kernel"])))',
      'f = ops.sigmoid(ops.subtract(z_f, ops.matmul(i * j, weights["forget_kernel"])))',
      "forget gate subtracts the (i ⊙ j) @ V_f term", T_RLSTM),
    M("rlstm-forget-reads-j-only", RLSTM_CELL,
      'f = ops.sigmoid(ops.add(z_f, ops.matmul(i * j, weights["forget_kernel"])))',
      'f = ops.sigmoid(ops.add(z_f, ops.matmul(j, weights["forget_kernel"])))',
      "forget gate sees j instead of the candidate update i ⊙ j", T_RLSTM),
    M("rlstm-input-cap-dropped", RLSTM_CELL,
      "c = f * c_prev + ops.minimum(i, 1.0 - f) * j",
      "c = f * c_prev + i * j",
      "input gate not capped at 1 − f (|c| ≤ 1 lost)", T_RLSTM),
    M("rlstm-output-gate-unmasked", RLSTM_CELL,
      "c_seen = c if state_mask is None else c * state_mask",
      "c_seen = c",
      "the state dropout mask not applied to c in the output gate", T_RLSTM),
    M("rlstm-padding-in-front", RLSTM_CELL,
      "return ops.concatenate([x, ops.zeros_like(x[..., :width])], axis=-1)",
      "return ops.concatenate([ops.zeros_like(x[..., :width]), x], axis=-1)",
      "the projected input padded before (i, j) instead of after: blocks shift",
      T_RLSTM + ("tests/layers/cell_rnn_test.py",)),
    # --- Shared cell machinery (layers/mogrified_cell.py) ---------------------
    M("cell-fold-kernel-wrong-scale", MOGRIFIED_CELL,
      'kernel=weights["kernel"] * x_scale,',
      'kernel=weights["kernel"] * h_scale,',
      "per-sequence weights: kernel takes h's folded doublings, not x's", T_CELL_RNN),
    M("cell-state-dropout-not-applied", MOGRIFIED_CELL,
      "h_prev = h_prev * state_mask",
      "h_prev = h_prev",
      "recurrent dropout mask not applied to h_prev", T_CELL),
    M("cell-adaptation-head-not-updated", MOGRIFIED_CELL,
      "return ops.concatenate([head + delta, h[:, size:]], axis=-1)",
      "return ops.concatenate([head, h[:, size:]], axis=-1)",
      "sparse adaptation h[:, :H] @ M not added when H < units", T_CELL),
    M("cell-unit-forget-bias-zero", MOGRIFIED_CELL,
      "blocks[forget] = ops.ones((units,), dtype=dtype)",
      "blocks[forget] = ops.zeros((units,), dtype=dtype)",
      "unit_forget_bias initialises the forget bias to 0, not 1", T_CELL),
    M("cell-chrono-input-bias-sign", MOGRIFIED_CELL,
      "blocks[gates.index(input_gate)] = -blocks[forget]",
      "blocks[gates.index(input_gate)] = blocks[forget]",
      "Chrono input bias b_i = b_f instead of −b_f", T_CELL + T_LSTM),
    # --- Dual output (layers/dual_output.py) ----------------------------------
    M("dual-state-path-subtracted", DUAL,
      "d = ops.matmul(e, self.embedding_kernel) + ops.matmul(",
      "d = ops.matmul(e, self.embedding_kernel) - ops.matmul(",
      "d = e @ W_de − h @ W_dh", T_DUAL),
    M("dual-bias-subtracted", DUAL,
      "d = d + self.bias",
      "d = d - self.bias",
      "the bias b_d subtracted", T_DUAL),
    M("dual-activation-skipped", DUAL,
      "return self._dropout(self.activation(d), self.output_dropout, training)",
      "return self._dropout(d, self.output_dropout, training)",
      "the activation (relu) not applied", T_DUAL),
    # --- Update rules, keras.ops form (evaluation/update_rules.py) ------------
    M("sgd-decay-sign", UPDATE_RULES,
      "return theta - learning_rate * g + decay_rate * (theta_g - theta)",
      "return theta - learning_rate * g + decay_rate * (theta - theta_g)",
      "sgd (eq. 4): the decay pushes away from θ_g", T_DYNAMIC, RULE_BACKENDS),
    M("rms-global-prior-epsilon-dropped", UPDATE_RULES,
      "return theta - learning_rate * g / (r + epsilon) + decay_rate * (theta_g - theta)",
      "return theta - learning_rate * g / r + decay_rate * (theta_g - theta)",
      "rms_global_prior (eq. 6): g / RMS without ε", T_DYNAMIC, RULE_BACKENDS),
    M("rms-rms-prior-min-to-max", UPDATE_RULES,
      "decay = ops.minimum(ops.ones((), theta.dtype), decay_rate * r / mean_rms)",
      "decay = ops.maximum(ops.ones((), theta.dtype), decay_rate * r / mean_rms)",
      "rms_rms_prior (eq. 8): max(1, λ RMS / mean RMS) instead of min", T_DYNAMIC,
      RULE_BACKENDS),
    M("update-rule-epsilon-lambda-swapped", UPDATE_RULES,
      "learning_rate, epsilon, decay_rate, mean_rms = (",
      "learning_rate, decay_rate, epsilon, mean_rms = (",
      "the hyperparameter vector [η, ε, λ, mean RMS] read with ε and λ swapped",
      T_DYNAMIC, RULE_BACKENDS),
    # --- Update rules, PyTorch's fused form (backend/torch.py) ----------------
    M("torch-rms-prior-min-to-max", TORCH_BACKEND,
      "decay = torch.minimum(",
      "decay = torch.maximum(",
      "fused rms_rms_prior: max(1, λ RMS / mean RMS) instead of min", T_DYNAMIC,
      ("torch",)),
    M("torch-rms-step-sign", TORCH_BACKEND,
      "theta.addcdiv_(g, scale, value=-learning_rate)",
      "theta.addcdiv_(g, scale, value=learning_rate)",
      "fused RMS rules step up the gradient (θ + η g / (RMS + ε))", T_DYNAMIC,
      ("torch",)),
    M("torch-sgd-step-sign", TORCH_BACKEND,
      "theta.add_(g, alpha=-learning_rate)",
      "theta.add_(g, alpha=learning_rate)",
      "fused sgd steps up the gradient", T_DYNAMIC, ("torch",)),
    # --- Generation: PyTorch's own decoding step (backend/torch.py), the
    # decoder's window reads (generation/decoder.py) -------------------------
    M("torch-decoding-greedy-plain-argmax", TORCH_BACKEND,
      "next_tokens = torch.argmax(torch.softmax(logits, dim=-1), dim=-1)",
      "next_tokens = torch.argmax(logits, dim=-1)",
      "greedy decoding takes the logits' argmax, not GreedySampler's (ties its rounding makes)",
      T_DECODING, ("torch",)),
    M("torch-decoding-no-model-temperature", TORCH_BACKEND,
      "logits = _output_logits_in_place(logits, bias, temperature)",
      "logits = _output_logits_in_place(logits, bias, None)",
      "the decoding step leaves out the model's softmax temperature", T_DECODING,
      ("torch",)),
    M("torch-decoding-state-not-written", TORCH_BACKEND,
      "                h_state.copy_(h)",
      "                pass",
      "the decoding step does not carry h to the next token", T_DECODING, ("torch",)),
    M("torch-decoding-read-stops-early", TORCH_BACKEND,
      "if sampler is None and k == last:",
      "if sampler is None and k == 0:",
      "a known token is read into the first layer only", T_DECODING, ("torch",)),
    # --- Dynamic evaluation's hand-written backward (backend/torch.py) -------
    M("torch-backward-tie-not-split", TORCH_BACKEND,
      "to_i = (i < one_f).to(i.dtype) + 0.5 * (i == one_f).to(i.dtype)",
      "to_i = (i < one_f).to(i.dtype)",
      "the RLSTM's min(i, 1 - f) gives a tie's gradient to 1 - f alone", T_HAND_BACKWARD,
      ("torch",)),
    M("torch-backward-no-cell-state-path", TORCH_BACKEND,
      "        d_c = dc * f[t]",
      "        d_c = dc * 0.0",
      "the gradient does not flow back through the cell state", T_HAND_BACKWARD,
      ("torch",)),
    M("torch-backward-lookup-rows-dropped", TORCH_BACKEND,
      "gradient_of[id(table)].index_add_(0, ids, d_embedded)",
      "gradient_of[id(table)].add_(0.0)",
      "the tied table's gradient leaves out the embedding lookup's rows", T_HAND_BACKWARD,
      ("torch",)),
    M("torch-backward-fused-lookup-rows-dropped", TORCH_BACKEND,
      "table.index_add_(0, ids, d_embedded, alpha=-update.learning_rate)",
      "table.add_(0.0)",
      "the fused table update leaves out the embedding lookup's rows", T_HAND_BACKWARD,
      ("torch",)),
    M("torch-backward-temperature-dropped", TORCH_BACKEND,
      "d_logits.mul_((weights_of * temperature)[:, None])",
      "d_logits.mul_(weights_of[:, None])",
      "the logits' gradient leaves out the softmax temperature", T_HAND_BACKWARD,
      ("torch",)),
    M("torch-backward-mogrifier-doubling-dropped", TORCH_BACKEND,
      "            gate = gate + gate\n",
      "            pass\n",
      "the mogrifier rounds' factor 2 left out of their gradient", T_HAND_BACKWARD,
      ("torch",)),
    M("decoder-window-state-not-written", DECODER,
      "_through_cache(model, inputs, model.backbone.call_with_state)",
      "model.backbone.call_with_state(inputs, [model._read_state(v, ops.shape(inputs)[0]) "
      "for v in model.recurrent_state_variables])",
      "a window of known tokens leaves the carried state as it was", T_DECODING),
    # --- RMS statistics (evaluation/_adaptation_step.py, _gradient_statistics.py)
    M("rms-sqrt-dropped", ADAPTATION_STEP,
      'raw = [np.sqrt(np.asarray(ops.convert_to_numpy(ms), "float64")) for ms in mean_squares]',
      'raw = [np.asarray(ops.convert_to_numpy(ms), "float64") for ms in mean_squares]',
      "RMS = MS_g, the square root not taken", T_DYNAMIC),
    M("rms-global-mean-divides-by-tensors", ADAPTATION_STEP,
      "mean_rms = float(sum(r.sum() for r in live) / sum(r.size for r in live))",
      "mean_rms = float(sum(r.sum() for r in live) / len(live))",
      "global_mean normaliser divided by the number of tensors, not elements",
      T_DYNAMIC),
    M("rms-unseen-fill-global-mean", ADAPTATION_STEP,
      "fill = r[seen].mean() if seen.any() else mean_rms",
      "fill = mean_rms",
      "elements without statistics take the global mean RMS, not their tensor's",
      T_SAFETY),
    M("rms-accumulates-abs", ADAPTATION_STEP,
      "out.append(acc + ops.square(g))",
      "out.append(acc + ops.abs(g))",
      "statistics accumulate |g| instead of g²", T_DYNAMIC),
    M("rms-per-stream-mean", ADAPTATION_STEP,
      "g = ops.sum(g, axis=0)",
      "g = ops.mean(g, axis=0)",
      "per-stream matrices: the streams' gradients averaged, not summed, before squaring",
      T_SPARSE),
    M("rms-statistics-targets-unshifted", GRADIENT_STATISTICS,
      "(streams[:, i * n : (i + 1) * n], streams[:, i * n + 1 : (i + 1) * n + 1])",
      "(streams[:, i * n : (i + 1) * n], streams[:, i * n : (i + 1) * n])",
      "statistics from a stream: targets not shifted by one", T_DYNAMIC),
    # --- IWAE loss (losses/token_nll.py, iwae_dropout_loss.py, models/_objective.py)
    M("iwae-log-d-added", TOKEN_NLL,
      "log_prob = ops.logsumexp(log_prob, axis=1) - ops.log(num)",
      "log_prob = ops.logsumexp(log_prob, axis=1) + ops.log(num)",
      "log-mean-exp over samples adds ln D instead of subtracting it", T_IWAE),
    M("iwae-mean-of-log-probabilities", TOKEN_NLL,
      "log_prob = ops.logsumexp(log_prob, axis=1) - ops.log(num)",
      "log_prob = ops.mean(log_prob, axis=1)",
      "samples combined as the mean of log-probabilities (plain dropout), not log-mean-exp",
      T_IWAE),
    M("iwae-sequence-weights-not-broadcast", IWAE,
      "            sample_weight = ops.broadcast_to(sample_weight, ops.shape(ids))\n",
      "",
      "per-sequence weights not broadcast over time: the mean divides by Σ w, not Σ w·T",
      T_IWAE),
    M("iwae-chunked-log-d-added", OBJECTIVE,
      "y_pred = ops.logsumexp(y_pred, axis=1) - ops.log(samples)",
      "y_pred = ops.logsumexp(y_pred, axis=1) + ops.log(samples)",
      "chunked-softmax IWAE loss adds ln D instead of subtracting it", T_MULTI_SAMPLE),
    # --- Chunked softmax (losses/chunked_log_softmax.py) ----------------------
    M("chunked-target-and-norm-swapped", CHUNKED,
      "results = ops.stack([target - norm, norm], axis=-1)",
      "results = ops.stack([norm - target, norm], axis=-1)",
      "log p = log Z − z_w instead of z_w − log Z", T_CHUNKED),
    M("chunked-normaliser-max", CHUNKED,
      "norm = ops.logsumexp(logits, axis=-1)",
      "norm = ops.max(logits, axis=-1)",
      "log-normaliser max_v z_v instead of logsumexp_v z_v", T_CHUNKED),
    M("chunked-gradient-target-sign", CHUNKED,
      "chunk_up * (1.0 - at_target)",
      "chunk_up * (1.0 + at_target)",
      "backward: the target's gradient g (1 + p_w) instead of g (1 − p_w)", T_CHUNKED),
    M("chunked-last-partial-chunk-dropped", CHUNKED,
      "chunks = (tokens + chunk_size - 1) // chunk_size",
      "chunks = tokens // chunk_size",
      "number of chunks rounded down: chunks larger than chunk_size, none when tokens < chunk_size",
      T_CHUNKED),
    # --- Stream batching (data/batching.py) -----------------------------------
    M("batching-targets-not-shifted", BATCHING,
      "y = self.streams[:, start + 1 : start + 1 + length]",
      "y = self.streams[:, start : start + length]",
      "targets are the inputs, not the inputs shifted by one", T_BATCHING),
    M("batching-remainder-kept", BATCHING,
      "num_windows = full + (1 if rest and not drop_remainder else 0)",
      "num_windows = full + (1 if rest else 0)",
      "the last partial window kept with drop_remainder=True", T_BATCHING),
    M("batching-padding-weight-off-by-one", BATCHING,
      "weights[:, length:] = 0.0",
      "weights[:, length + 1 :] = 0.0",
      "the first padded target of the last window gets weight 1", T_BATCHING),
    M("batchify-interleaved", BATCHING,
      "return ids[: batch_size * length].reshape(batch_size, length)",
      "return ids[: batch_size * length].reshape(length, batch_size).T",
      "batchify deals tokens round-robin instead of contiguous streams", T_BATCHING),
    M("continued-stream-starts-off-by-one", BATCHING,
      "starts = np.arange(self.batch_size, dtype=np.int64) * self.streams.shape[1]",
      "starts = np.arange(self.batch_size, dtype=np.int64) * (self.streams.shape[1] - 1)",
      "continued(): stream b starts at b·(L − 1) instead of b·L", T_CONTINUED),
    # --- Rectified Adam (optimizers/rectified_adam.py) ------------------------
    M("radam-threshold-4", RADAM,
      "rectified = rho > 5.0",
      "rectified = rho > 4.0",
      "rectified step from ρ_t > 4 instead of ρ_t > 5", T_RADAM),
    M("radam-first-moment-uncorrected", RADAM,
      "step_size = lr / ops.cast(bc1, dtype)",
      "step_size = lr",
      "m̂ = m: no bias correction 1 − β₁ᵗ", T_RADAM),
    M("radam-sqrt-v-dropped", RADAM,
      "denominator = ops.add(ops.sqrt(v), ops.cast(self.epsilon, dtype))",
      "denominator = ops.add(v, ops.cast(self.epsilon, dtype))",
      "adaptive step divides by v + ε instead of sqrt(v) + ε", T_RADAM),
    M("radam-second-moment-beta-1", RADAM,
      "v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2)",
      "v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_1)",
      "second moment decays with β₁ instead of β₂", T_RADAM),
    M("radam-series-sign", RADAM,
      "series = xs * 0.5 - x2 * (",
      "series = xs * 0.5 + x2 * (",
      "ρ_t's small-x series 1 − x/expm1(x) with the x² terms' sign flipped", T_RADAM),
    # --- Two-tailed averaging (optimizers/two_tailed_*.py) --------------------
    M("tta-rate-off-by-one", TTA,
      "rate = took / ops.cast(ops.maximum(count, 1), dtype)",
      "rate = took / ops.cast(count + 1, dtype)",
      "running mean step 1/(n + 1) instead of 1/n", T_TTA),
    M("tta-switch-keeps-long-count", TTA,
      "self.long_count.assign(ops.copy(self.short_count))",
      "self.long_count.assign(ops.copy(self.long_count))",
      "switch: L is not set to S", T_TTA),
    M("tta-restart-keeps-long", TTA,
      "        self.restart_short()\n"
      "        self.long_count.assign(ops.zeros((), self.long_count.dtype))",
      "        self.restart_short()",
      "restart(): the long average is not restarted", T_TTA),
    M("controller-switch-strict", CONTROLLER,
      "if has_short and short_loss <= long_loss:",
      "if has_short and short_loss < long_loss:",
      "switch only when Fˢ < Fᴸ, not Fˢ ≤ Fᴸ", T_CONTROLLER),
    M("controller-restart-both-strict", CONTROLLER,
      "if long_length <= evaluation_frequency:",
      "if long_length < evaluation_frequency:",
      "raw weights restart both averages only when L < E, not L ≤ E", T_CONTROLLER),
    M("controller-long-stagnation-late", CONTROLLER,
      "elif stagnation and has_short and self.long_stale >= self.patience:",
      "elif stagnation and has_short and self.long_stale > self.patience:",
      "long-average stagnation one evaluation late", T_CONTROLLER),
    # --- Mixture of softmaxes (layers/mixture_of_softmaxes.py) ----------------
    M("mos-mix-max", MOS,
      "return ops.logsumexp(log_p + log_weights, axis=-2)",
      "return ops.max(log_p + log_weights, axis=-2)",
      "components combined by max instead of logsumexp", T_MOS),
    M("mos-weights-softmax-over-batch", MOS,
      'ops.cast(ops.matmul(inputs, self.weights_kernel), "float32"), axis=-1',
      'ops.cast(ops.matmul(inputs, self.weights_kernel), "float32"), axis=0',
      "mixture weights normalised over the batch axis, not the components", T_MOS),
    M("mos-component-logits-unnormalised", MOS,
      'log_p = ops.log_softmax(ops.cast(component_logits, "float32"), axis=-1)',
      'log_p = ops.cast(component_logits, "float32")',
      "components' logits mixed without their log-softmax", T_MOS),
    # --- Metrics (metrics/*.py) -----------------------------------------------
    M("perplexity-base-2", PERPLEXITY,
      "return ops.exp(self.mean_nats())",
      "return ops.power(2.0, self.mean_nats())",
      "perplexity 2^nats instead of e^nats", T_METRICS),
    M("bpc-times-ln2", BPC,
      "return self.mean_nats() / math.log(2.0)",
      "return self.mean_nats() * math.log(2.0)",
      "bits = nats · ln 2 instead of nats / ln 2", T_METRICS),
    M("token-metric-counts-zero-weight-tokens", TOKEN_METRIC,
      "self.total_tokens.assign_add(ops.sum(weights))",
      "self.total_tokens.assign_add(ops.sum(ops.ones_like(weights)))",
      "the token count includes tokens of weight 0", T_METRICS),
    # --- Neural cache (evaluation/neural_cache.py) ----------------------------
    M("cache-window-includes-current", CACHE,
      "window = ops.logical_and(k >= t, k < t + cache_size)",
      "window = ops.logical_and(k >= t, k <= t + cache_size)",
      "the cache window includes position t itself (its own target)", T_CACHE),
    M("cache-model-weight-not-discounted", CACHE,
      "mixed = ops.logaddexp(ops.log1p(-lam) + log_p_model, log_lam + log_p_cache)",
      "mixed = ops.logaddexp(log_p_model, log_lam + log_p_cache)",
      "p = p_model + λ p_cache: the (1 − λ) factor left out", T_CACHE),
    M("cache-flatness-ignored", CACHE,
      'scores = theta * ops.einsum("btd,bkd->btk", features, all_keys)',
      'scores = ops.einsum("btd,bkd->btk", features, all_keys)',
      "cache scores h_tᵀ h_i without the flatness θ", T_CACHE),
)
del M


def _check_table():
    ids = [m.id for m in MUTANTS]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"Duplicate mutant ids: {duplicates}")
    for m in MUTANTS:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", m.id):
            raise ValueError(f"Mutant id {m.id!r} is not a lowercase slug")
        if m.old == m.new:
            raise ValueError(f"Mutant {m.id}: `old` and `new` are the same")
        if not m.tests or not all(t.startswith("tests/") for t in m.tests):
            raise ValueError(f"Mutant {m.id}: test files must be under tests/")
        if m.backends is not None and not set(m.backends) <= set(BACKENDS):
            raise ValueError(f"Mutant {m.id}: unknown backends {m.backends}")


_check_table()


class MutantError(ValueError):
    """A mutant that cannot be applied as written."""


def mutate(source, mutant):
    """`source` with the mutant applied; its `old` must occur exactly once."""
    count = source.count(mutant.old)
    if count != 1:
        raise MutantError(
            f"Mutant {mutant.id}: expected its `old` snippet exactly once in "
            f"{mutant.file}, found it {count} times: {mutant.old!r}"
        )
    return source.replace(mutant.old, mutant.new)


def check_mutant(mutant, root):
    """Problems of a mutant against the files under `root` (empty: none).

    The `old` snippet must occur exactly once; the mutated file must compile
    and differ from the original in its syntax tree (not only in layout);
    the test files must exist.
    """
    path = root / mutant.file
    if not path.is_file():
        return [f"{mutant.file} does not exist"]
    source = path.read_text(encoding="utf-8")
    try:
        mutated = mutate(source, mutant)
    except MutantError as error:
        return [str(error)]
    problems = []
    try:
        tree = compile(mutated, str(path), "exec", ast.PyCF_ONLY_AST)
        compile(tree, str(path), "exec")
    except SyntaxError as error:
        problems.append(f"the mutated {mutant.file} does not compile: {error}")
    else:
        if ast.dump(tree) == ast.dump(ast.parse(source)):
            problems.append("the mutation does not change the syntax tree")
    missing = [t for t in mutant.tests if not (root / t).is_file()]
    if missing:
        problems.append(f"test files missing: {missing}")
    return problems


def select(ids):
    """The mutants named in `ids` (a comma-separated string), in table order."""
    if not ids:
        return list(MUTANTS)
    wanted = [i.strip() for i in ids.split(",") if i.strip()]
    known = {m.id for m in MUTANTS}
    unknown = [i for i in wanted if i not in known]
    if unknown:
        raise ValueError(
            f"Unknown mutant ids: {', '.join(unknown)} (`--list` shows them)"
        )
    return [m for m in MUTANTS if m.id in wanted]


# === Repository information ===================================================


def git(*args, root=ROOT, binary=False):
    out = subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True
    ).stdout
    return out if binary else out.decode().strip()


def package_digest(root=ROOT):
    """SHA-256 of the package's Python sources as they are on disk: the
    library a run tested, committed or not."""
    digest = hashlib.sha256()
    for path in sorted((root / "keras_mogrifier").rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def library_info():
    status = git("status", "--porcelain", "--untracked-files=no")
    package = git("status", "--porcelain", "--", "keras_mogrifier")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status),
        "package_changes": package.splitlines(),
        "package_sha256": package_digest(),
    }


def tests_info(tests_from):
    if tests_from is None:
        return {
            "source": "working tree",
            "commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--", "tests")),
        }
    try:
        commit = git("rev-parse", "--verify", f"{tests_from}^{{commit}}")
    except subprocess.CalledProcessError:
        raise ValueError(f"Unknown commit for --tests-from: {tests_from!r}")
    return {"source": "commit", "commit": commit, "dirty": False}


def versions():
    from importlib import metadata

    found = {}
    for name in ("keras", "torch", "jax", "jaxlib", "tensorflow", "numpy", "pytest"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


# === Copies and pytest runs ===================================================


class Workspace:
    """A pristine copy of the repository, from which every run is copied."""

    def __init__(self, tests_commit, keep=False):
        self.directory = Path(tempfile.mkdtemp(prefix="mutation_check_"))
        self.keep = keep
        self.base = self.directory / "base"
        self.base.mkdir()
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, self.base / name, ignore=IGNORED)
            elif source.is_file():
                shutil.copy2(source, self.base / name)
        if tests_commit is not None:
            shutil.rmtree(self.base / "tests", ignore_errors=True)
            archive = git("archive", "--format=tar", tests_commit, "tests", binary=True)
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                try:
                    tar.extractall(self.base, filter="data")
                except TypeError:  # a Python without extraction filters
                    tar.extractall(self.base)
        self.cache = self.directory / "compile_cache"
        self._counter = 0
        self._lock = threading.Lock()

    def copy(self, label):
        with self._lock:
            self._counter += 1
            target = self.directory / f"{self._counter:03d}-{label}"
        shutil.copytree(self.base, target, symlinks=True)
        return target

    def remove(self, path):
        if not self.keep:
            shutil.rmtree(path, ignore_errors=True)

    def close(self):
        if not self.keep:
            shutil.rmtree(self.directory, ignore_errors=True)


def child_env(copy, backend, cache):
    env = dict(os.environ)
    env.update(
        KERAS_BACKEND=backend,
        PYTHONPATH=str(copy),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
        TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "3"),
        MPLBACKEND="Agg",
        # As scripts/test.sh: compiled programs kept on disk for this run
        # only. The key of an entry is the program and the compiler's flags,
        # so a mutated program is compiled afresh; unchanged ones (the rest
        # of the model) are not compiled again for every mutant.
        JAX_COMPILATION_CACHE_DIR=str(cache / "jax"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    (cache / "tensorflow").mkdir(parents=True, exist_ok=True)
    env["TF_XLA_FLAGS"] = (
        env.get("TF_XLA_FLAGS", "")
        + f" --tf_xla_persistent_cache_directory={cache / 'tensorflow'}"
    ).strip()
    return env


def run_process(command, cwd, env, timeout):
    """`(returncode or None on timeout, output, seconds)`; the whole process
    group is killed on a timeout (pytest may start workers of its own)."""
    start = time.monotonic()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        _kill_group(process)
        output, _ = process.communicate()
        code = None
    except BaseException:
        _kill_group(process)
        process.communicate()
        raise
    return code, output.decode(errors="replace"), time.monotonic() - start


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def imported_package(python, copy, env, full=False):
    """Where `keras_mogrifier` is imported from in `copy` (the path of its
    `__init__.py`). `full=True` imports it; otherwise the import system only
    finds it (no package code runs, a fraction of a second)."""
    if full:
        code = "import keras_mogrifier; print(keras_mogrifier.__file__)"
    else:
        code = (
            "import importlib.util; "
            "print(importlib.util.find_spec('keras_mogrifier').origin)"
        )
    result = subprocess.run(
        [python, "-c", code], cwd=copy, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"Importing keras_mogrifier in {copy} failed:\n{result.stderr[-3000:]}"
        )
    return Path(result.stdout.strip().splitlines()[-1])


def check_import(python, copy, env, full=False):
    origin = imported_package(python, copy, env, full=full).resolve()
    expected = (copy / "keras_mogrifier" / "__init__.py").resolve()
    if origin != expected:
        raise RuntimeError(
            f"keras_mogrifier imported from {origin}, not from the copy under "
            f"test {expected}: the mutant would not be the code tested"
        )
    return origin


def outcome_of(code):
    if code is None:
        return "timeout"
    if code in OUTCOMES_OF_EXIT:
        return OUTCOMES_OF_EXIT[code]
    if code < 0:
        return f"signal-{-code}"
    return f"exit-{code}"


def first_failure(output):
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line[:300]
    return None


def pytest_run(python, copy, tests, backend, timeout, cache):
    env = child_env(copy, backend, cache)
    check_import(python, copy, env)
    # `-rfE`: the failing tests named in the summary (pyproject asks only `-rs`).
    command = [
        python, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *tests
    ]
    code, output, seconds = run_process(command, copy, env, timeout)
    result = {
        "outcome": outcome_of(code),
        "returncode": code,
        "seconds": round(seconds, 1),
    }
    failure = first_failure(output)
    if failure:
        result["first_failure"] = failure
    if result["outcome"] not in ("killed", "survived"):
        result["output_tail"] = output[-4000:]
    return result


# === The run ==================================================================


def default_output(tests, backend):
    label = "worktree" if tests["source"] == "working tree" else tests["commit"][:10]
    return ROOT / "runs" / "mutation_check" / f"tests-{label}-{backend}.json"


def baseline_key(backend, tests):
    return f"{backend}: {' '.join(tests)}"


class Results:
    """The JSON file, rewritten (atomically) after every change."""

    def __init__(self, path, header, resume):
        self.path = path
        self.lock = threading.Lock()
        self.data = dict(header, baselines={}, mutants={})
        if resume and path.exists():
            previous = json.loads(path.read_text())
            for key, value in same_run(header).items():
                if same_run(previous).get(key) != value:
                    raise ValueError(
                        f"--resume: {path} was written with {key}="
                        f"{same_run(previous).get(key)!r}, this run has "
                        f"{value!r}; use another --output"
                    )
            self.data["baselines"] = previous.get("baselines", {})
            self.data["mutants"] = previous.get("mutants", {})
        path.parent.mkdir(parents=True, exist_ok=True)

    def done(self, mutant_id):
        return mutant_id in self.data["mutants"]

    def baseline(self, key):
        return self.data["baselines"].get(key)

    def set_baseline(self, key, value):
        with self.lock:
            self.data["baselines"][key] = value
            self._write()

    def set_mutant(self, mutant_id, value):
        with self.lock:
            self.data["mutants"][mutant_id] = value
            self._write()

    def _write(self):
        self.data["counts"] = counts(self.data["mutants"].values())
        self.data["updated"] = now()
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(self.data, indent=1, ensure_ascii=False) + "\n")
        os.replace(temporary, self.path)


def same_run(data):
    """What a resumed run must share with the file it goes on: the backend,
    the tests, the library's commit and sources (not the rest of the tree)."""
    library = data.get("library", {})
    return {
        "backend": data.get("backend"),
        "tests": data.get("tests"),
        "library": (library.get("commit"), library.get("package_sha256")),
    }


def counts(entries):
    found = {}
    for entry in entries:
        found[entry["outcome"]] = found.get(entry["outcome"], 0) + 1
    return dict(sorted(found.items()))


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def log(message):
    print(message, flush=True)


def run(args):
    mutants = select(args.only)
    tests = tests_info(args.tests_from)
    library = library_info()
    header = {
        "tool": "scripts/mutation_check.py",
        "date": now(),
        "backend": args.backend,
        "library": library,
        "tests": tests,
        "python": sys.version.split()[0],
        "versions": versions(),
        "command": "pytest -x -q -rfE -p no:cacheprovider <test files>",
        "timeout_s": args.timeout,
    }
    output = Path(args.output) if args.output else default_output(tests, args.backend)
    results = Results(output, header, args.resume)
    todo = [m for m in mutants if not results.done(m.id)]
    log(
        f"Library {library['commit'][:10]}{' (dirty)' if library['dirty'] else ''}, "
        f"tests from {tests['source']} {tests['commit'][:10]}, backend "
        f"{args.backend}: {len(todo)} mutants to run "
        f"({len(mutants) - len(todo)} already in {output})"
    )
    if not todo:
        summarize(results.data)
        return 0
    workspace = Workspace(args.tests_from and tests["commit"], keep=args.keep)
    try:
        for m in todo:  # every snippet applies to this library (fail loudly)
            problems = check_mutant(m, workspace.base)
            problems = [p for p in problems if not p.startswith("test files missing")]
            if problems:
                raise MutantError(f"{m.id}: {'; '.join(problems)}")
        env = child_env(workspace.base, args.backend, workspace.cache)
        origin = check_import(args.python, workspace.base, env, full=True)
        log(f"keras_mogrifier is imported from the copy under test ({origin.parent.parent})")
        groups = {}
        for m in todo:
            backend = m.backend_for(args.backend)
            groups.setdefault(baseline_key(backend, m.tests), (backend, m.tests))
        run_baselines(args, workspace, results, groups)
        run_mutants(args, workspace, results, todo)
    finally:
        workspace.close()
    summarize(results.data)
    return 0


def run_baselines(args, workspace, results, groups):
    def one(key, backend, tests):
        previous = results.baseline(key)
        if previous is not None and previous["outcome"] == "passed":
            return key, previous, True
        missing = [t for t in tests if not (workspace.base / t).is_file()]
        if missing:
            value = {"outcome": "tests-missing", "missing": missing}
        else:
            copy = workspace.copy("baseline")
            try:
                value = pytest_run(
                    args.python, copy, tests, backend, args.timeout, workspace.cache
                )
            finally:
                workspace.remove(copy)
            value["outcome"] = "passed" if value["outcome"] == "survived" else value["outcome"]
        value.update(backend=backend, tests=list(tests))
        results.set_baseline(key, value)
        return key, value, False

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one, key, *group) for key, group in groups.items()]
        for future in concurrent.futures.as_completed(futures):
            key, value, reused = future.result()
            note = " (from the earlier run)" if reused else f" in {value.get('seconds', 0)} s"
            log(f"baseline [{key}]: {value['outcome']}{note}")
            if value["outcome"] != "passed":
                detail = (
                    value.get("first_failure")
                    or (value.get("missing") and f"missing: {value['missing']}")
                    or value.get("output_tail", "")[-1500:]
                    or "(no output)"
                )
                log(f"  its mutants cannot be judged: {detail}")


def run_mutants(args, workspace, results, todo):
    def one(m):
        backend = m.backend_for(args.backend)
        entry = {
            "file": m.file,
            "description": m.description,
            "tests": list(m.tests),
            "backend": backend,
        }
        baseline = results.baseline(baseline_key(backend, m.tests))
        if baseline["outcome"] != "passed":
            entry.update(outcome="baseline-failed", baseline=baseline["outcome"])
        else:
            copy = workspace.copy(m.id)
            try:
                path = copy / m.file
                path.write_text(
                    mutate(path.read_text(encoding="utf-8"), m), encoding="utf-8"
                )
                entry.update(
                    pytest_run(args.python, copy, m.tests, backend, args.timeout,
                               workspace.cache)
                )
            finally:
                workspace.remove(copy)
        results.set_mutant(m.id, entry)
        return m, entry

    total = len(todo)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one, m) for m in todo]
        for index, future in enumerate(concurrent.futures.as_completed(futures), 1):
            m, entry = future.result()
            line = (
                f"[{index}/{total}] {m.id}: {entry['outcome']}"
                + (f" in {entry['seconds']} s" if "seconds" in entry else "")
                + (f" ({entry['backend']})" if entry["backend"] != args.backend else "")
            )
            log(line)
            if entry["outcome"] == "killed" and entry.get("first_failure"):
                log(f"    by {entry['first_failure'][:160]}")
            elif entry.get("output_tail"):
                log("    " + entry["output_tail"][-1500:].replace("\n", "\n    "))


def summarize(data):
    entries = data["mutants"]
    log(f"Counts: {json.dumps(counts(entries.values()))} (of {len(entries)} mutants)")
    survivors = [i for i, e in entries.items() if e["outcome"] == "survived"]
    if survivors:
        log("Survived: " + ", ".join(survivors))
    other = [f"{i} ({e['outcome']})" for i, e in entries.items()
             if e["outcome"] not in ("killed", "survived")]
    if other:
        log("Not judged: " + ", ".join(other))


# === --list and --compare =====================================================


def list_mutants():
    problems = 0
    modules = {}
    for m in MUTANTS:
        found = check_mutant(m, ROOT)
        status = "ok" if not found else "PROBLEM: " + "; ".join(found)
        problems += bool(found)
        modules[m.file] = modules.get(m.file, 0) + 1
        where = f" [runs on {'/'.join(m.backends)}]" if m.backends else ""
        print(f"{m.id}  {m.file}{where}\n    {m.description}\n    tests: "
              f"{' '.join(m.tests)}\n    {status}")
    print(f"\n{len(MUTANTS)} mutants:")
    for file, n in modules.items():
        print(f"  {n:2d}  {file}")
    if problems:
        print(f"{problems} mutants have problems")
        return 1
    print("Every `old` snippet occurs exactly once and every mutated file compiles.")
    return 0


def compare(old_path, new_path):
    old, new = (json.loads(Path(p).read_text()) for p in (old_path, new_path))
    order = [m.id for m in MUTANTS]
    ids = [i for i in order if i in old["mutants"] or i in new["mutants"]]
    ids += sorted((set(old["mutants"]) | set(new["mutants"])) - set(ids))

    def describe(data):
        t = data["tests"]
        return (f"tests {t['source']} {t['commit'][:10]}{' (dirty)' if t.get('dirty') else ''}, "
                f"library {data['library']['commit'][:10]}"
                f"{' (dirty)' if data['library']['dirty'] else ''}, {data['backend']}")

    print(f"Old: {old_path} ({describe(old)})  ")
    print(f"New: {new_path} ({describe(new)})\n")
    # The package's sources decide (commits may differ in other files).
    if old["library"].get("package_sha256") != new["library"].get("package_sha256"):
        print("Warning: the two runs tested different package sources.\n")
    print("| mutant | module | old | new |")
    print("| --- | --- | --- | --- |")
    lost, unconfirmed = [], []
    per_module = {}
    for i in ids:
        a = old["mutants"].get(i, {}).get("outcome", "—")
        b = new["mutants"].get(i, {}).get("outcome", "—")
        file = (old["mutants"].get(i) or new["mutants"].get(i))["file"]
        module = file.removeprefix(PKG)
        mark = ""
        if a == "killed" and b != "killed":
            if b == "survived":
                lost.append(i)
                mark = " **lost**"
            else:
                unconfirmed.append(i)
                mark = " **not confirmed**"
        print(f"| `{i}` | {module} | {a} | {b}{mark} |")
        row = per_module.setdefault(module, [0, 0, 0])
        row[0] += 1
        row[1] += a == "killed"
        row[2] += b == "killed"
    print("\n| module | mutants | killed (old) | killed (new) |")
    print("| --- | --- | --- | --- |")
    for module, (n, ka, kb) in per_module.items():
        print(f"| {module} | {n} | {ka} | {kb} |")
    ca, cb = counts(old["mutants"].values()), counts(new["mutants"].values())
    print(f"\nOld: {len(old['mutants'])} mutants, {json.dumps(ca)}  ")
    print(f"New: {len(new['mutants'])} mutants, {json.dumps(cb)}  ")
    both = [i for i in ids if old["mutants"].get(i, {}).get("outcome") == "killed"
            and new["mutants"].get(i, {}).get("outcome") == "killed"]
    print(f"Killed by both: {len(both)}; killed by the old suite and survived by "
          f"the new one: {len(lost)}; killed by the old suite, not judged by the "
          f"new one: {len(unconfirmed)}")
    if lost or unconfirmed:
        print("\nFAIL: " + ", ".join(lost + unconfirmed))
        return 1
    print("\nOK: every mutant the old suite killed, the new one kills too.")
    return 0


# === Command line =============================================================


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring (scripts/mutation_check.py) for the method.",
    )
    parser.add_argument("--tests-from", metavar="COMMIT",
                        help="take tests/ from this commit (default: the working tree)")
    parser.add_argument("--backend", default="torch", choices=BACKENDS,
                        help="Keras backend of the runs (default: torch, the fastest)")
    parser.add_argument("--only", metavar="ID,ID",
                        help="run only these mutants (comma-separated ids)")
    parser.add_argument("--output", metavar="FILE.json",
                        help="results file (default: runs/mutation_check/"
                             "tests-<commit or worktree>-<backend>.json)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the results already in --output, skip their ids")
    parser.add_argument("--jobs", type=int, default=1,
                        help="pytest runs at once (default: 1)")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds per pytest run (default: 900)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the runs (default: this one)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary copies (for inspection)")
    parser.add_argument("--list", action="store_true",
                        help="print the mutants and check them; run nothing")
    parser.add_argument("--compare", nargs=2, metavar=("OLD.json", "NEW.json"),
                        help="compare two results files (Markdown); exit status 1 "
                             "if a mutant killed in OLD is not killed in NEW")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, not {args.timeout}")
    if args.only is not None:
        try:
            select(args.only)
        except ValueError as error:
            parser.error(str(error))
    return parser, args


def main(argv=None):
    parser, args = parse_args(argv)
    if args.list:
        return list_mutants()
    if args.compare:
        return compare(*args.compare)
    try:
        return run(args)
    except KeyboardInterrupt:
        log("Interrupted: the results so far are in the output file.")
        return 130
    except (MutantError, ValueError) as error:
        parser.error(str(error))


if __name__ == "__main__":
    sys.exit(main())
