"""Beam search through the carried state: each beam a row, reordered with its beam."""

import itertools

import numpy as np
import pytest
from generate_test import V
from generate_test import WORDS
from generate_test import full_pass_log_probs
from generate_test import make_model


def _total(log_probs, text, start):
    return sum(log_probs[t - 1, text[t]] for t in range(start, len(text)))


def test_enough_beams_find_the_most_probable_continuation():
    # With V beams, every first token is kept: the best 2-token continuation
    # is then found exactly (checked against all V² of them).
    model = make_model(batch_size=V, cell="mogrifier_lstm", scale=0.3)
    prompt = [3, 4]
    found = model.generate(prompt, max_length=4, sampler="beam", num_beams=V, stop_token_ids=None)
    candidates = [prompt + list(c) for c in itertools.product(range(V), repeat=2)]
    log_probs = full_pass_log_probs(model, candidates)
    totals = [_total(lp, c, 2) for lp, c in zip(log_probs, candidates)]
    assert list(found) == candidates[int(np.argmax(totals))]
    # Three beams over three new tokens: no worse than greedy here, and
    # every kept beam's state row followed its beam (checked by the full
    # passes agreeing with the returned text's score).
    greedy = model.generate(prompt, max_length=5, stop_token_ids=None)
    beam = model.generate(prompt, max_length=5, sampler="beam", num_beams=3, stop_token_ids=None)
    log_probs = full_pass_log_probs(model, [greedy, beam])
    assert _total(log_probs[1], beam, 2) >= _total(log_probs[0], greedy, 2) - 1e-6


def reference_beam_search(model, prompt, new_tokens, beams):
    """Beam search with full passes over every beam's text (no carried state)."""
    texts, scores = [list(prompt)], [0.0]
    length = len(prompt) + new_tokens
    for _ in range(new_tokens):
        # Padded to one length (one compiled shape): the pass is causal.
        padded = [text + [0] * (length - len(text)) for text in texts]
        log_probs = full_pass_log_probs(model, padded)[:, len(texts[0]) - 1]
        candidates = [
            (score + log_probs[i, token], i, token)
            for i, score in enumerate(scores)
            for token in range(V)
        ]
        candidates.sort(key=lambda c: -c[0])
        texts = [texts[i] + [token] for _, i, token in candidates[:beams]]
        scores = [score for score, _, _ in candidates[:beams]]
    return texts[int(np.argmax(scores))]


def test_beam_search_equals_a_reference_without_carried_state():
    # From the third new token on, a beam's state row must have followed it.
    model = make_model(batch_size=6, cell="rlstm", scale=0.4)
    for prompt in ([3, 4], [5]):
        expected = reference_beam_search(model, prompt, new_tokens=5, beams=3)
        found = model.generate(
            prompt, max_length=len(prompt) + 5, sampler="beam", num_beams=3, stop_token_ids=None
        )
        assert list(found) == expected


def test_one_beam_is_greedy_and_prompts_of_different_lengths():
    model = make_model(batch_size=6)
    prompts = [[3, 4, 5, 6, 7], [2], [10, 11, 12]]
    greedy = model.generate(prompts, max_length=9, stop_token_ids=None)
    one = model.generate(prompts, max_length=9, sampler="beam", num_beams=1, stop_token_ids=None)
    for a, b in zip(greedy, one):
        np.testing.assert_array_equal(a, b)
    # Two beams each: 3 prompts need 6 rows; a batch gives what each alone gives.
    together = model.generate(prompts, max_length=9, sampler="beam", num_beams=2, stop_token_ids=None)
    for prompt, output in zip(prompts, together):
        np.testing.assert_array_equal(output[: len(prompt)], prompt)
        alone = model.generate(prompt, max_length=9, sampler="beam", num_beams=2, stop_token_ids=None)
        np.testing.assert_array_equal(alone, output)


def test_beam_stops_at_eos_and_errors():
    model = make_model(batch_size=4)
    model.output_bias.assign(np.where(np.arange(V) == WORDS.eos_id, 50.0, 0.0).astype("float32"))
    assert model.generate(["the company said", "the"], max_length=10, sampler="beam", num_beams=2) == [
        "the company said <eos>", "the <eos>",
    ]
    with pytest.raises(ValueError, match=r"Expected `num_beams` to be at most the rows .* \(4\)"):
        model.generate("the", max_length=5, sampler="beam", num_beams=5)
    with pytest.raises(ValueError, match="Expected `num_beams` to be a positive integer"):
        model.generate("the", max_length=5, sampler="beam", num_beams=0)
