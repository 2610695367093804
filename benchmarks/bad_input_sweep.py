"""A sweep of bad inputs to the APIs of issue 26: none may lose state or pass silently.

Each case calls one public API with one bad input (or one input that used
to lose something) on the active backend and records what happened:

- `ok`: the expected error was raised (a `ValueError` naming what was
  expected, or the documented error: `DivergenceError`, the custom
  sampler's own error, `NotImplementedError` saying what to override), or
  the documented behaviour was observed; and no weight, carried state or
  file of the user changed;
- `silent` (severity 3): no error where one was expected, or a wrong result
  without a word;
- `lost state` (severity 4): a weight or the carried recurrent state changed;
- `wrong error` (severity 2): an error of another kind (a framework's
  `RuntimeError`, `InvalidArgumentError`, `IndexError`, ...).

Prints a table and writes it as JSON:

    KERAS_BACKEND=torch python benchmarks/bad_input_sweep.py \\
        --json benchmarks/results/bad_input_sweep_torch.json
"""

import argparse
import json
import os
import tempfile
import traceback
import warnings
import zipfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mogrifier import samplers  # noqa: E402
from keras_mogrifier.data import Vocabulary  # noqa: E402
from keras_mogrifier.data import reverse_copy  # noqa: E402
from keras_mogrifier.evaluation import DivergenceError  # noqa: E402
from keras_mogrifier.evaluation import DynamicEvaluator  # noqa: E402
from keras_mogrifier.evaluation import mc_dropout_evaluate  # noqa: E402
from keras_mogrifier.generation import Decoder  # noqa: E402
from keras_mogrifier.metrics import Perplexity  # noqa: E402
from keras_mogrifier.models import LanguageModel  # noqa: E402

V = 12
WORDS = Vocabulary(["the", "<eos>", "a", "cat", "dog", "sat", "ran", "on", "mat", "<unk>",
                    "big", "red"])
SEVERITY = {"ok": 0, "wrong error": 2, "silent": 3, "lost state": 4}


def _model(**options):
    keras.utils.set_random_seed(0)
    model = LanguageModel(V, units=8, num_layers=1, cell="lstm", batch_size=3,
                          vocabulary=WORDS, **options)
    model.build((3, None))
    rng = np.random.default_rng(0)
    for v in model.trainable_weights:
        v.assign(rng.normal(scale=0.5, size=v.shape).astype("float32"))
    for v in model.recurrent_state_variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    return model


def _values(model):
    return [np.array(keras.ops.convert_to_numpy(v), copy=True) for v in model.variables]


def _changed(model, before):
    return [v.path for v, b in zip(model.variables, before)
            if not np.array_equal(keras.ops.convert_to_numpy(v), b, equal_nan=True)]


class Sweep:
    def __init__(self):
        self.rows = []

    def case(self, api, what, call, expected=ValueError, model=None, check=None):
        """Runs `call()`; `expected` is an exception class (or None: no error,
        then `check(result)` must return True)."""
        before = None if model is None else _values(model)
        outcome, detail = "ok", ""
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = call()
            if expected is not None:
                outcome, detail = "silent", f"no error; returned {str(result)[:80]}"
            elif check is not None and not check(result, caught):
                outcome, detail = "silent", f"unexpected result {str(result)[:80]}"
            else:
                detail = "; ".join(str(w.message)[:80] for w in caught) or "as documented"
        except Exception as error:  # noqa: BLE001  (recorded, classified)
            detail = f"{type(error).__name__}: {str(error)[:160]}"
            if expected is None or not isinstance(error, expected):
                outcome = "wrong error"
                detail += " | " + traceback.format_exc(limit=2).splitlines()[-1][:80]
        if model is not None:
            changed = _changed(model, before)
            if changed:
                outcome, detail = "lost state", f"changed {changed[:3]}; {detail}"
        self.rows.append({"api": api, "input": what, "outcome": outcome,
                          "severity": SEVERITY[outcome], "detail": detail})


def run():
    sweep = Sweep()
    model = _model()
    decoder = Decoder(model)
    u = np.full(3, 0.5, "float32")
    # --- Decoder.read / step / beam_step ---
    for what, inputs, targets in [
        ("read: input id V", [[1, V]], [[1, 2]]),
        ("read: input id -1", [[1, -1]], [[1, 2]]),
        ("read: target id V", [[1, 2]], [[1, V]]),
        ("read: target id -1", [[1, 2]], [[-1, 2]]),
        ("read: float ids", np.array([[1.0, 2.7]]), [[1, 2]]),
    ]:
        sweep.case("Decoder.read", what, lambda i=inputs, t=targets: decoder.read(i, t),
                   model=model)
    for what, tokens, uniform, sampler in [
        ("step: id V", [1, V, 2], u, None),
        ("step: id -1", [1, -1, 2], u, None),
        ("step: float ids", np.array([1.0, 2.5, 3.0]), u, None),
        ("step: uniform 1.0", [1, 2, 3], np.array([0.5, 1.0, 0.1], "float32"), None),
        ("step: uniform NaN", [1, 2, 3], np.array([0.5, np.nan, 0.1], "float32"), None),
        ("step: uniform -0.5", [1, 2, 3], np.array([0.5, -0.5, 0.1], "float32"), None),
        ("step: 2 uniforms for 3 rows", [1, 2, 3], u[:2], None),
        ("step: BeamSampler", [1, 2, 3], u, samplers.BeamSampler(num_beams=3)),
    ]:
        sweep.case("Decoder.step", what,
                   lambda t=tokens, un=uniform, s=sampler: decoder.step(np.asarray(t), un, s),
                   model=model)

    class Raising(samplers.Sampler):
        def get_next_token(self, probabilities, uniform):
            raise KeyError("custom sampler failure")

    class NoNextToken(samplers.Sampler):
        pass

    sweep.case("Decoder.step", "custom sampler that raises",
               lambda: decoder.step(np.array([1, 2, 3]), u, Raising()), KeyError, model=model)
    sweep.case("Decoder.step", "Sampler subclass without get_next_token",
               lambda: decoder.step(np.array([1, 2, 3]), u, NoNextToken()),
               NotImplementedError, model=model)
    beam = samplers.BeamSampler(num_beams=3)
    beam_args = (np.array([1, 2, 3]), np.array([[0.0, -1e9, -1e9]], "float32"),
                 np.ones(1, bool), np.array([1]), np.zeros(3, bool), 0)

    def beam_after_refused_step():
        fresh = Decoder(model)
        try:
            fresh.step(np.array([1, 2, 3]), u, beam)
        except ValueError:
            pass
        with fresh.fresh_state():
            return fresh.beam_step(*beam_args, beam)

    sweep.case("Decoder.beam_step", "valid beam_step after a refused step",
               beam_after_refused_step, None, model=model,
               check=lambda r, w: keras.ops.convert_to_numpy(r[0]).shape == (3,))
    sweep.case("Decoder.beam_step", "pad id V",
               lambda: decoder.beam_step(*beam_args[:-1], V, beam), model=model)
    # --- generate: tiny temperatures ---
    prompts = [[2, 3], [4], [5, 6]]
    greedy = model.generate(prompts, max_length=10, stop_token_ids=None, jit_compile=True)
    sweep.case("generate", "temperature=1e-30, jit_compile=True (random)",
               lambda: model.generate(prompts, max_length=10, sampler="random",
                                      temperature=1e-30, stop_token_ids=None, seed=1,
                                      jit_compile=True),
               None, model=model,
               check=lambda r, w: all(np.array_equal(a, b) for a, b in zip(r, greedy)))
    sweep.case("generate", "temperature=1e-31",
               lambda: model.generate(prompts, max_length=10, sampler="random",
                                      temperature=1e-31), model=model)
    # --- samplers called directly ---
    for what, logits, uniform in [
        ("NaN logits", np.array([[0.0, np.nan, 1.0]], "float32"), np.zeros(1, "float32")),
        ("1-D logits", np.zeros(3, "float32"), np.zeros(1, "float32")),
        ("3-D logits", np.zeros((1, 2, 3), "float32"), np.zeros(1, "float32")),
        ("uniform 1.0", np.zeros((1, 3), "float32"), np.ones(1, "float32")),
        ("uniform -1", np.zeros((1, 3), "float32"), -np.ones(1, "float32")),
        ("uniform of another batch", np.zeros((2, 3), "float32"), np.zeros(3, "float32")),
    ]:
        for name in ("greedy", "random", "top_k", "top_p"):
            sweep.case(f"samplers.get({name!r})(...)", what,
                       lambda n=name, lo=logits, un=uniform: samplers.get(n)(lo, un))
    sweep.case("Sampler subclass", "no get_next_token, called directly",
               lambda: NoNextToken()(np.zeros((1, 3), "float32"), np.zeros(1, "float32")),
               NotImplementedError)
    # --- saving: a config that does not match the weights ---
    with tempfile.TemporaryDirectory() as directory:
        mos = LanguageModel(V, units=6, num_layers=1, batch_size=2, mixture_of_softmaxes=2,
                            cell="lstm")
        mos.build((2, None))
        path = os.path.join(directory, "mos.keras")
        mos.save(path)
        edited = os.path.join(directory, "edited.keras")
        with zipfile.ZipFile(path) as archive, zipfile.ZipFile(edited, "w") as out:
            for item in archive.infolist():
                data = archive.read(item.filename)
                if item.filename == "config.json":
                    config = json.loads(data)
                    config["config"]["mixture_of_softmaxes"] = 0
                    data = json.dumps(config).encode()
                out.writestr(item, data)
        sweep.case("keras.saving.load_model", "config K=0, weights saved with K=2",
                   lambda: keras.saving.load_model(edited))
        weights = os.path.join(directory, "mos.weights.h5")
        mos.save_weights(weights)
        other = LanguageModel(V, units=6, num_layers=1, batch_size=2, cell="lstm")
        other.build((2, None))
        sweep.case("LanguageModel.load_weights", "weights of a K=2 model into K=0",
                   lambda: other.load_weights(weights), model=other)
    # --- dynamic evaluation ---
    stream = np.random.default_rng(1).integers(0, V, 31)
    one = model.with_options(batch_size=1)
    sgd = DynamicEvaluator(one, update_rule="sgd", learning_rate=1e20, decay_rate=0.0)
    sweep.case("DynamicEvaluator.evaluate", "SGD learning_rate=1e20",
               lambda: sgd.evaluate(stream, verbose=0), DivergenceError, model=one)
    sweep.case("DynamicEvaluator", "vocabulary_size larger than the model's",
               lambda: DynamicEvaluator(one, vocabulary_size=V + 5), model=one)
    late = DynamicEvaluator(one, learning_rate=1e-3)
    late.vocabulary_size = V + 5
    sweep.case("DynamicEvaluator.evaluate", "vocabulary_size set larger, then ids ≥ V",
               lambda: late.evaluate(np.array([1, V + 2, 3]), adapt=False, verbose=0),
               model=one)
    evaluator = DynamicEvaluator(one, learning_rate=1e-2, segment_length=4)
    evaluator.collect_gradient_statistics(np.tile(stream, 4), batch_size=1)

    def adapt_then_move_state():
        with evaluator.adapt_to(stream):
            one(np.zeros((1, 3), "int32"))  # the block moves the state

    sweep.case("DynamicEvaluator.adapt_to", "state moved inside the block", adapt_then_move_state,
               None, model=one)
    sweep.case("DynamicEvaluator.adapt_to", "document with id V",
               lambda: evaluator.adapt_to(np.array([1, V, 2])).__enter__(), model=one)
    sweep.case("DynamicEvaluator.generate", "outside an adapt_to block",
               lambda: evaluator.generate(max_length=4), model=one)

    def generate_with(**kwargs):
        with evaluator.adapt_to(stream):
            return evaluator.generate(**kwargs)

    sweep.case("DynamicEvaluator.generate", "prompt id V",
               lambda: generate_with(max_length=4, prompt=[1, V]), model=one)
    sweep.case("DynamicEvaluator.generate", "beam sampler",
               lambda: generate_with(max_length=4, sampler="beam"), model=one)
    sweep.case("DynamicEvaluator.generate", "keep_adapting=True, weights and state after",
               lambda: generate_with(max_length=6, sampler="greedy"), None, model=one,
               check=lambda r, w: len(r) == 6)
    # --- MC dropout ---
    dropped = _model(input_dropout=0.4, output_dropout=0.3)
    sweep.case("mc_dropout_evaluate", "dropout_scale making a rate ≥ 1",
               lambda: mc_dropout_evaluate(dropped, stream, passes=2, dropout_scale=3.0),
               model=dropped)
    sweep.case("mc_dropout_evaluate", "dropout_scale=-1",
               lambda: mc_dropout_evaluate(dropped, stream, passes=2, dropout_scale=-1.0),
               model=dropped)
    # --- reverse_copy ---
    sweep.case("data.reverse_copy", "vocabulary_size=2**31", lambda: reverse_copy(2, 3, 2**31))
    sweep.case("data.reverse_copy", "num_examples × length over int32",
               lambda: reverse_copy(2**20, 2**12, 10))
    sweep.case("data.reverse_copy", "seed=-1", lambda: reverse_copy(2, 3, 10, seed=-1))
    # --- with_options, Perplexity ---
    ids = np.array([[1, 2, 3]] * 3)

    def hot_logits():
        plain = model.with_options(temperature=1.0, stateful=False)
        hot = model.with_options(temperature=0.5, stateful=False)
        return keras.ops.convert_to_numpy(hot(ids)), keras.ops.convert_to_numpy(plain(ids))

    sweep.case("LanguageModel.with_options", "temperature=0.5 computes with 0.5",
               hot_logits, None, model=model,
               check=lambda r, w: np.allclose(r[0], 0.5 * r[1], rtol=1e-5, atol=1e-6))
    sweep.case("LanguageModel.with_options", "temperature=-1",
               lambda: model.with_options(temperature=-1.0), model=model)
    sweep.case("Perplexity", "result over zero tokens",
               lambda: float(Perplexity().result()), None,
               check=lambda r, w: np.isnan(r) and any("zero tokens" in str(x.message)
                                                     for x in w))
    sweep.case("Perplexity", "negative sample weight",
               lambda: Perplexity().update_state(np.array([[1, 2]]), np.zeros((1, 2, V)),
                                                 sample_weight=np.array([-1.0])))
    sweep.case("Perplexity", "NaN sample weight",
               lambda: Perplexity().update_state(np.array([[1, 2]]), np.zeros((1, 2, V)),
                                                 sample_weight=np.array([[1.0, np.nan]])))
    return sweep.rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = run()
    width = max(len(r["api"]) + len(r["input"]) for r in rows) + 3
    for r in rows:
        print(f"{(r['api'] + ' | ' + r['input']):<{width}} {r['outcome']:<11} {r['detail'][:90]}")
    worst = max(r["severity"] for r in rows)
    bad = [r for r in rows if r["severity"] >= 3]
    print(f"{len(rows)} cases on {keras.backend.backend()}: {len(bad)} lose state or pass "
          f"silently (severity ≥ 3); worst severity {worst}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": "KERAS_BACKEND=" + keras.backend.backend()
                       + " python benchmarks/bad_input_sweep.py --json " + args.json,
                       "backend": keras.backend.backend(), "cases": len(rows),
                       "severity_3_or_more": len(bad), "rows": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
