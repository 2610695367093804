"""A sweep of bad inputs to the public APIs: none may lose state, pass silently or fail inside a framework.

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

import json
import os
import tempfile
import traceback
import warnings
import zipfile

import _harness

_harness.environment()

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
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
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
    _round_four(sweep)
    return sweep.rows


def _round_four(sweep):
    """Issue 42: `call_with_cache` and keras-hub's sampler route, and the
    entry points of the training-loop and house issues (fit across epochs,
    `TrainingCheckpoint`, `compile(sampler=)`, `generate`'s keras-hub
    arguments, `score`)."""
    ops = keras.ops
    model = _model()
    ids = np.array([[1, 2], [3, 4], [5, 6]], "int32")
    _, _, cache = model.call_with_cache(ids)

    def column(value, dtype="int32"):
        return ops.convert_to_tensor(np.full((3, 1), value, dtype))

    for what, call in [
        ("cache: one array (stacked h, c)", lambda: model.call_with_cache(column(1), ops.stack(cache))),
        ("cache: one (rows, units) array", lambda: model.call_with_cache(
            column(1)[:2], ops.convert_to_numpy(cache[0])[:2])),
        ("cache: 3 entries for 1 layer", lambda: model.call_with_cache(column(1), list(cache) + [cache[0]])),
        ("cache: wrong width", lambda: model.call_with_cache(column(1), [c[:, :4] for c in cache])),
        ("cache: 3 rows for 2 rows of ids", lambda: model.call_with_cache(column(1)[:2], cache)),
        ("cache: int32", lambda: model.call_with_cache(column(1), [ops.cast(c, "int32") for c in cache])),
        ("ids: id V (tensor)", lambda: model.call_with_cache(column(V), cache)),
        ("ids: id V (list), no cache", lambda: model.call_with_cache([[V], [1], [1]])),
        ("ids: id -1", lambda: model.call_with_cache(column(-1), cache)),
        ("ids: float 1.5", lambda: model.call_with_cache(column(1.5, "float32"), cache)),
        ("ids: 1-D", lambda: model.call_with_cache(np.array([1, 2, 3], "int32"), cache)),
    ]:
        sweep.case("LanguageModel.call_with_cache", what, call, model=model)

    # keras-hub's samplers drive the model through `call_with_cache`
    # (docs/generation.md, "keras-hub's samplers"). On JAX their loop is a
    # traced `lax.while_loop`: the ids read inside it are checked by the
    # documented `model.check_token_ids(padded_prompts)` before the loop,
    # so the route without that line is swept on TensorFlow and PyTorch only.
    try:
        import keras_hub
    except ImportError:  # the optional extra
        keras_hub = None
    if keras_hub is not None:
        def keras_hub_route(prompts, cache, check_prompts=True):
            padded = np.zeros((3, 5), "int32")
            padded[:, : prompts.shape[1]] = prompts
            mask = np.zeros((3, 5), bool)
            mask[:, : prompts.shape[1]] = True
            if check_prompts:
                model.check_token_ids(padded, "padded_prompts")

            def next(prompt, cache, index):
                tokens = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
                logits, hidden, cache = model.call_with_cache(tokens, cache, index - 1)
                return logits[:, 0], hidden[:, 0], cache

            return keras_hub.samplers.GreedySampler()(
                next, ops.convert_to_tensor(padded), cache=cache, index=prompts.shape[1],
                mask=ops.convert_to_tensor(mask), model=model)

        seed_cache = model.call_with_cache(ids[:, :1])[2]
        bad_prompt = ids.copy()
        bad_prompt[0, -1] = V
        route = "keras_hub sampler → call_with_cache"
        sweep.case(route, "cache of the wrong width",
                   lambda: keras_hub_route(ids, [c[:, :4] for c in seed_cache]), model=model)
        sweep.case(route, "cache as one array",
                   lambda: keras_hub_route(ids, ops.stack(seed_cache)), model=model)
        sweep.case(route, "prompt id V (documented recipe)",
                   lambda: keras_hub_route(bad_prompt, seed_cache), model=model)
        if keras.backend.backend() != "jax":
            sweep.case(route, "prompt id V read inside the loop (no prompt check)",
                       lambda: keras_hub_route(bad_prompt, seed_cache, check_prompts=False),
                       model=model)

    # --- compile(sampler=), generate's keras-hub arguments, score ---
    compiled = _model()
    sweep.case("LanguageModel.compile", "sampler='topk' (unknown name)",
               lambda: compiled.compile(optimizer="adam", sampler="topk"), model=compiled)
    sweep.case("LanguageModel.compile", "sampler=3",
               lambda: compiled.compile(optimizer="adam", sampler=3), model=compiled)
    sweep.case("LanguageModel.compile", "refused sampler leaves no optimizer",
               lambda: getattr(compiled, "optimizer", None), None, model=compiled,
               check=lambda r, w: r is None)
    prompts = [[2, 3], [4], [5, 6]]
    sweep.case("LanguageModel.generate", "max_length=None: longest prompt + 100",
               lambda: model.generate(prompts, stop_token_ids=None), None, model=model,
               check=lambda r, w: [len(x) for x in r] == [102, 102, 102])
    sweep.case("LanguageModel.generate", "strip_prompt='yes'",
               lambda: model.generate(prompts, max_length=5, strip_prompt="yes"), model=model)
    sweep.case("LanguageModel.generate", "max_length equal to the longest prompt",
               lambda: model.generate(prompts, max_length=2), model=model)
    sweep.case("LanguageModel.generate", "prompt id V",
               lambda: model.generate([[2, V]], max_length=5), model=model)
    sweep.case("LanguageModel.generate", "float prompt ids",
               lambda: model.generate(np.array([[2.0, 3.5]]), max_length=5), model=model)
    sweep.case("LanguageModel.score", "text with id V",
               lambda: model.score([[1, 2, V]]), model=model)
    sweep.case("LanguageModel.score", "no texts",
               lambda: model.score([]), model=model)
    sweep.case("LanguageModel.score", "a one-token text (nothing to score)",
               lambda: model.score([[3]]), model=model)

    # --- the main job's flags for a user's own file (the house issue) ---
    import importlib.util
    import sys

    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    sys.path.insert(0, examples)
    spec = importlib.util.spec_from_file_location(
        "ptb_word", os.path.join(examples, "ptb_word.py"))
    ptb_word = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ptb_word)
    with tempfile.TemporaryDirectory() as directory:
        good = os.path.join(directory, "good.txt")
        with open(good, "w") as f:
            f.write("the cat sat on the mat\n" * 50)
        empty = os.path.join(directory, "empty.txt")
        open(empty, "w").close()
        for what, argv, error in [
            ("--text of a missing file", ["--text", os.path.join(directory, "no.txt")],
             FileNotFoundError),
            ("--text of an empty file", ["--text", empty], ValueError),
            ("--max-size -5", ["--text", good, "--max-size", "-5"], ValueError),
            ("--min-count 0", ["--text", good, "--min-count", "0"], ValueError),
            ("--encoding nope", ["--text", good, "--encoding", "nope"], ValueError),
        ]:
            sweep.case("examples/ptb_word.py (main job)", what,
                       lambda a=argv: ptb_word.load(ptb_word.parse_args(a, "word", "tiny")),
                       error)

    # --- the text hooks: a user's tokenizer, decode ---
    from keras_mogrifier.data import load_text

    def raising(line):
        raise RuntimeError("tokenizer failure")

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "notes.txt")
        with open(path, "w") as f:
            f.write("the cat sat\non the mat\n" * 20)
        for what, tokenizer in [
            ("tokenizer returns None", lambda line: None),
            ("tokenizer raises", raising),
            ("tokenizer returns a str", lambda line: line),
            ("tokenizer returns ints", lambda line: [len(w) for w in line.split()]),
        ]:
            sweep.case("data.load_text", what,
                       lambda t=tokenizer: load_text(path, "word", tokenizer=t))
    for what, ids in [
        ("strings", ["the", "cat"]),
        ("floats", [1.5, 2.0]),
        ("id V", [1, V]),
        ("id -1", [1, -1]),
        ("None", [None, None]),
    ]:
        sweep.case("Vocabulary.decode", what, lambda i=ids: WORDS.decode(i))

    # --- fit across epochs and TrainingCheckpoint (the training-loop issue) ---
    from keras_mogrifier.callbacks import TrainingCheckpoint
    from keras_mogrifier.data import StreamDataset

    text = np.random.default_rng(2).integers(0, V, 400)
    trained = _model()
    trained.compile(optimizer="adam", loss=LOSS)
    data = StreamDataset(text, 3, 5)
    sweep.case("LanguageModel.fit", "reset_state_each_epoch='yes'",
               lambda: trained.fit(data, epochs=1, verbose=0, reset_state_each_epoch="yes"),
               model=trained)
    sweep.case("StreamDataset.continued", "start_window=-1",
               lambda: data.continued(start_window=-1))
    sweep.case("StreamDataset.continued", "an evaluation dataset (drop_remainder=False)",
               lambda: StreamDataset(text, 3, 5, drop_remainder=False).continued())
    sweep.case("TrainingCheckpoint", "save_every_steps=0",
               lambda: TrainingCheckpoint("ckpt", save_every_steps=0))
    sweep.case("TrainingCheckpoint", "resume='yes'",
               lambda: TrainingCheckpoint("ckpt", resume="yes"))
    sweep.case("TrainingCheckpoint", "config not JSON-serializable",
               lambda: TrainingCheckpoint("ckpt", config={"f": object()}))
    with tempfile.TemporaryDirectory() as directory:
        sweep.case("LanguageModel.fit", "two TrainingCheckpoints",
                   lambda: trained.fit(data, epochs=1, verbose=0, callbacks=[
                       TrainingCheckpoint(os.path.join(directory, "a")),
                       TrainingCheckpoint(os.path.join(directory, "b"))]),
                   model=trained)
        other = LanguageModel(V, units=6, num_layers=1, cell="lstm", batch_size=3,
                              vocabulary=WORDS)
        other.build((3, None))
        other.compile(optimizer="adam", loss=LOSS)
        saved_at = os.path.join(directory, "other")
        other.fit(data, epochs=1, verbose=0, callbacks=[TrainingCheckpoint(saved_at)])
        sweep.case("LanguageModel.fit", "resume=True from another model's checkpoint",
                   lambda: trained.fit(data, epochs=2, verbose=0, callbacks=[
                       TrainingCheckpoint(saved_at, resume=True)]),
                   model=trained)
        sweep.case("LanguageModel.fit", "resume=True, another batch size",
                   lambda: other.fit(StreamDataset(text, 2, 5), epochs=2, verbose=0,
                                     callbacks=[TrainingCheckpoint(saved_at, resume=True)]),
                   model=other)


def main():
    args = _harness.argument_parser(__doc__).parse_args()
    rows = run()
    width = max(len(r["api"]) + len(r["input"]) for r in rows) + 3
    for r in rows:
        print(f"{(r['api'] + ' | ' + r['input']):<{width}} {r['outcome']:<11} {r['detail'][:90]}")
    worst = max(r["severity"] for r in rows)
    bad = [r for r in rows if r["severity"] >= 3]
    not_ok = [r for r in rows if r["severity"] >= 2]
    print(f"{len(rows)} cases on {keras.backend.backend()}: {len(bad)} lose state or pass "
          f"silently (severity ≥ 3), {len(not_ok) - len(bad)} answer with an internal "
          f"error; worst severity {worst}")
    if args.json:
        _harness.write_json(args.json, {
            "command": _harness.command_line(__file__, backend=keras.backend.backend()),
            "backend": keras.backend.backend(), "cases": len(rows),
            "severity_3_or_more": len(bad), "internal_errors": len(not_ok) - len(bad),
            "rows": rows})
    return rows


if __name__ == "__main__":
    main()
