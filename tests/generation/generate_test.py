"""LanguageModel.generate: recurrent decoding through the carried state."""

import keras
import numpy as np
import pytest
from testing import to_numpy

from keras_mogrifier import backend
from keras_mogrifier.data import Vocabulary
from keras_mogrifier.generation import Decoder
from keras_mogrifier.generation import decoder as decoder_lib
from keras_mogrifier.models import LanguageModel
from keras_mogrifier.models.language_model import CELLS

V = 17
WORDS = Vocabulary(
    ["the", "<eos>", "company", "said", "stock", "fell", "in", "first", "quarter",
     "<unk>", "a", "rose", "N", "shares", "of", "and", "to"]
)


def make_model(batch_size=3, seed=0, scale=0.5, vocabulary=WORDS, **options):
    keras.utils.set_random_seed(seed)
    options = {"units": 8, "num_layers": 2, "cell": "lstm", "mogrifier_rounds": 2, **options}
    model = LanguageModel(V, batch_size=batch_size, vocabulary=vocabulary, **options)
    model.build((batch_size, None))
    # Spread-out logits: no ties between the most probable tokens.
    rng = np.random.default_rng(seed)
    for w in model.trainable_weights:
        w.assign(rng.normal(scale=scale, size=w.shape).astype("float32"))
    return model


_STATELESS = {}  # id -> (model, its stateless copy): one copy per model


def full_pass_log_probs(model, texts):
    """log-softmax of full-sequence passes over `texts` (equal lengths).

    A stateless copy of the model reads each whole text from a zero state.
    The model is causal, so position `t - 1` of this pass is the last
    position of a full pass over the text's first `t` tokens: one pass gives
    the passes over the growing text.
    """
    cached = _STATELESS.get(id(model))
    if cached is None or cached[0] is not model:
        cached = _STATELESS[id(model)] = (model, model.with_options(stateful=False))
    reference = cached[1]
    logits = to_numpy(reference(np.asarray(texts, "int32"))).astype("float64")
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


PROMPTS = [[3, 4, 5, 6, 7, 8, 9], [2], [10, 11, 12]]


@pytest.mark.parametrize(
    "options",
    [{"cell": cell} for cell in CELLS]
    + [{"cell": "mogrifier_rlstm", "dual": True, "mogrifier_rank": 3}, {"samples": 3}],
    ids=list(CELLS) + ["dual", "samples_3"],
)
def test_greedy_is_the_argmax_of_a_full_pass_over_the_growing_text(options):
    model = make_model(**options)
    outputs = model.generate(PROMPTS, max_length=12, stop_token_ids=None)
    log_probs = full_pass_log_probs(model, outputs)
    for prompt, output, row in zip(PROMPTS, outputs, log_probs):
        assert len(output) == 12
        np.testing.assert_array_equal(output[: len(prompt)], prompt)
        for t in range(len(prompt), 12):
            assert output[t] == row[t - 1].argmax(), (prompt, t)


def test_step_log_probabilities_equal_the_full_pass():
    model = make_model(cell="mogrifier_lstm", mogrifier_rounds=3)
    text = np.array([[3, 4, 5, 6, 7, 8, 9, 2], [2, 1, 0, 16, 15, 14, 13, 12]], "int32")
    decoder = Decoder(model)
    steps = []
    with decoder.fresh_state():
        for t in range(text.shape[1]):
            _, log_probs = decoder.step(text[:, t], np.zeros(2, "float32"))
            steps.append(to_numpy(log_probs))
    np.testing.assert_allclose(np.stack(steps, 1), full_pass_log_probs(model, text), atol=1e-5)


def test_prompt_read_once_then_one_step_per_token():
    model = make_model(batch_size=2)
    calls = []
    # The decoder `generate` uses: its window reads (compiled models), its
    # reads of known tokens and its steps recorded.
    decoder = decoder_lib.decoder_for(model)
    advance, generation_steps = decoder._advance, decoder.generation_steps

    def recorded_advance(ids):
        calls.append(("window", tuple(ids.shape)))
        return advance(ids)

    def recorded_generation_steps(sampler):
        read, step = generation_steps(sampler)

        def recorded_read(tokens, length):
            calls.append(("read", length))
            return read(tokens, length)

        return recorded_read, lambda t, u: calls.append(("step", np.shape(t))) or step(t, u)

    decoder._advance, decoder.generation_steps = recorded_advance, recorded_generation_steps
    prompts = [[i % V for i in range(23)], [i % V for i in range(21)]]
    model.generate(prompts, max_length=30, stop_token_ids=None)
    # The 20 tokens known in both rows are read at once: compiled, in
    # windows (16 + 4); PyTorch's own decoding step reads them one by one
    # without the output layer. Then one step per position, the last 3
    # prompt tokens of the longer row forced.
    windows = [] if backend.decoding_step(model) else [("window", (2, 16)), ("window", (2, 4))]
    assert calls == [("read", 20)] + windows + [("step", (2,))] * (30 - 1 - 20)


def test_top_k_and_top_p_never_leave_their_sets():
    model = make_model(batch_size=8, scale=0.3)
    prompts = [[i] for i in range(8)]
    outputs = model.generate(
        prompts * 4, max_length=10, sampler="top_k", k=3, temperature=2.0,
        seed=0, stop_token_ids=None,
    )
    drawn = set()
    for output, log_probs in zip(outputs, full_pass_log_probs(model, outputs)):
        for t in range(1, 10):
            top = np.argsort(-log_probs[t - 1])[:3]
            assert output[t] in top
            drawn.add(int(np.where(top == output[t])[0][0]))
    assert drawn == {0, 1, 2}  # not greedy in disguise
    outputs = model.generate(
        prompts * 4, max_length=10, sampler="top_p", p=0.5, seed=1, stop_token_ids=None
    )
    sizes = set()
    for output, log_probs in zip(outputs, full_pass_log_probs(model, outputs)):
        for t in range(1, 10):
            probs = np.exp(log_probs[t - 1])
            order = np.argsort(-probs)
            before = np.cumsum(probs[order]) - probs[order]
            nucleus = order[before < 0.5 + 1e-5]
            assert output[t] in nucleus
            sizes.add(len(nucleus))
    assert max(sizes) > 1


def test_seed_reproducible_and_temperature_towards_zero_is_greedy():
    model = make_model(scale=0.3)
    kwargs = dict(max_length=12, stop_token_ids=None)
    first = model.generate(PROMPTS, sampler="random", seed=3, **kwargs)
    again = model.generate(PROMPTS, sampler="random", seed=3, **kwargs)
    other = model.generate(PROMPTS, sampler="random", seed=4, **kwargs)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))
    greedy = model.generate(PROMPTS, **kwargs)
    for name in ("random", "top_k", "top_p"):
        cold = model.generate(PROMPTS, sampler=name, temperature=1e-6, seed=5, **kwargs)
        for a, b in zip(cold, greedy):
            np.testing.assert_array_equal(a, b)


def test_text_in_text_out_and_stop_at_eos():
    model = make_model()
    text = model.generate("the company said", max_length=8, stop_token_ids=None)
    assert isinstance(text, str) and text.startswith("the company said ")
    assert len(text.split()) == 8
    ids = model.generate(WORDS.to_ids("the company said".split()), max_length=8, stop_token_ids=None)
    assert WORDS.to_tokens(ids) == text.split()
    # Unknown words become <unk>.
    assert model.generate(["zebra said"], max_length=3, stop_token_ids=None)[0].startswith("<unk> said")
    # With <eos> most probable after "said", generation stops there.
    model.output_bias.assign(np.where(np.arange(V) == WORDS.eos_id, 50.0, 0.0).astype("float32"))
    assert model.generate(["the company said", "the"], max_length=10) == [
        "the company said <eos>", "the <eos>",
    ]
    assert model.generate("the", max_length=4, stop_token_ids=None) == "the <eos> <eos> <eos>"


def test_more_prompts_than_state_rows_run_in_groups():
    model = make_model(batch_size=2)
    prompts = [[i, (i * 5) % V] for i in range(5)]
    together = model.generate(prompts, max_length=7, stop_token_ids=None)
    for prompt, output in zip(prompts, together):
        np.testing.assert_array_equal(model.generate(prompt, max_length=7, stop_token_ids=None), output)


def test_state_weights_and_temperature_untouched():
    model = make_model()
    model.set_temperature(0.8)
    rng = np.random.default_rng(0)
    for v in model.recurrent_state_variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    before = [to_numpy(v).copy() for v in model.variables]
    model.generate(PROMPTS, max_length=9, sampler="top_k", seed=0)
    model.score(["the company said", "the stock fell"])
    with pytest.raises(ValueError):
        model.generate([[1, 2], []], max_length=5)
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)
    assert model.temperature == 0.8


def test_model_temperature_applies():
    # The model's softmax temperature scales the logits the sampler sees.
    model = make_model()
    decoder = Decoder(model)
    tokens = np.array([1, 2, 3])
    with decoder.fresh_state():
        _, plain = decoder.step(tokens, np.zeros(3, "float32"))
    model.set_temperature(0.5)
    with decoder.fresh_state():
        _, cooled = decoder.step(tokens, np.zeros(3, "float32"))
    plain = to_numpy(plain)
    expected = 0.5 * plain - np.log(np.exp(0.5 * plain).sum(-1, keepdims=True))
    np.testing.assert_allclose(to_numpy(cooled), expected, atol=1e-5)


def test_save_and_reload_keeps_the_vocabulary_and_the_text(tmp_path):
    model = make_model(cell="mogrifier_rlstm", mogrifier_rounds=2, dual=True)
    expected = model.generate(["the stock", "in the first"], max_length=9, stop_token_ids=None)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.vocabulary == WORDS
    assert loaded.generate(["the stock", "in the first"], max_length=9, stop_token_ids=None) == expected


def test_bad_input_is_a_clear_error_before_anything_runs(monkeypatch):
    model = make_model()
    called = []
    monkeypatch.setattr(decoder_lib.Decoder, "step", lambda *a, **k: called.append(1))
    cases = [
        (dict(prompts="", max_length=5), "Expected every prompt to hold at least one token"),
        (dict(prompts=["the", ""], max_length=5), "prompt 1 with 0 token"),
        (dict(prompts=[], max_length=5), "Expected at least one prompt"),
        (dict(prompts="the", max_length=0), "Expected `max_length` to be a positive integer"),
        (dict(prompts="the", max_length=-3), "Expected `max_length` to be a positive integer"),
        (dict(prompts="the company said", max_length=3), "exceed the longest prompt, 3 tokens"),
        (dict(prompts=[[1, 2], [3, V]], max_length=5), rf"token ids in \[0, {V}\) in prompt 1. Received: id {V}"),
        (dict(prompts=[-1, 2], max_length=5), "Received: id -1"),
        (dict(prompts=[[1.5, 2.0]], max_length=5), "integer token ids"),
        (dict(prompts="the", max_length=5, sampler="top_k", p=0.5), "Expected only"),
        (dict(prompts="the", max_length=5, seed=-1), "Expected `seed`"),
        (dict(prompts="the", max_length=5, stop_token_ids=[V]), "Expected `stop_token_ids`"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model.generate(**kwargs)
    # Without `<unk>`, an unknown word is an error that names it.
    no_unk = make_model(vocabulary=Vocabulary([t for t in WORDS.tokens if t != "<unk>"] + ["cat"]))
    with pytest.raises(ValueError, match=r"Token 'zebra' \(position 1 of prompt 0\) is not in the vocabulary"):
        no_unk.generate(["the zebra"], max_length=5)
    # Text needs a vocabulary.
    bare = make_model(vocabulary=None)
    with pytest.raises(ValueError, match="Expected a vocabulary to read text prompts"):
        bare.generate("the", max_length=5)
    with pytest.raises(ValueError, match="Expected a stateful LanguageModel"):
        model.with_options(stateful=False).generate([1], max_length=5)
    assert not called


def test_vocabulary_argument_and_config():
    model = make_model(vocabulary=None)
    assert model.generate("the company", max_length=4, vocabulary=WORDS, stop_token_ids=None).startswith("the company")
    config = make_model().get_config()
    assert config["vocabulary"]["tokens"] == WORDS.tokens
    assert LanguageModel.from_config(config).vocabulary == WORDS
    assert LanguageModel(V, vocabulary=WORDS.tokens).vocabulary == WORDS
    with pytest.raises(ValueError, match=f"Expected a vocabulary of `vocabulary_size` = {V + 1} tokens"):
        LanguageModel(V + 1, vocabulary=WORDS)
    with pytest.raises(ValueError, match="Expected a vocabulary of the model's"):
        model.generate("the", max_length=4, vocabulary=Vocabulary(["a", "<eos>"]))
