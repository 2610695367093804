"""Adaptive generation (Krause et al. §7.4): a model adapted to a document,
and sampling the document's continuation while adapting.

`adapt_to` is `DynamicEvaluator.adapt_to` and `continue_document` is
`DynamicEvaluator.generate` (see there).
"""

import contextlib
import numbers

import numpy as np
from keras import ops

from keras_mogrifier import samplers as samplers_lib
from keras_mogrifier.evaluation import _dynamic_checks as checks
from keras_mogrifier.evaluation import _recurrent_state
from keras_mogrifier.generation import text as text_lib
from keras_mogrifier.generation.decoder import decoder_for
from keras_mogrifier.generation.generate import stop_ids


@contextlib.contextmanager
def adapt_to(evaluator, document, vocabulary, verbose):
    """`DynamicEvaluator.adapt_to`: see there."""
    model = evaluator._require_model()
    vocab = None
    if isinstance(document, str):
        vocab = text_lib.resolve_vocabulary(model, vocabulary)
        if vocab is None:
            raise ValueError(
                "Expected a vocabulary to read a text `document`: build "
                "the model with `vocabulary=` or pass `vocabulary=`. "
                "Received: a string and no vocabulary"
            )
        document = text_lib.encode(vocab, document, where="document")
    streams = checks.as_streams(document, "document", evaluator._vocabulary_limit(model))
    if streams.shape[0] != 1:
        raise ValueError(
            "Expected one document (a 1-D stream of token ids). Received: "
            f"{streams.shape[0]} streams"
        )
    variables = evaluator.adapted_variables()
    theta_g = _recurrent_state.snapshot(variables)
    states = _recurrent_state.state_variables(model)
    saved_states = _recurrent_state.snapshot(states)
    documents = evaluator._adapted_documents
    depth = len(documents)
    try:
        evaluator.adaptation_results = evaluator._evaluate(
            streams, None, None, verbose, True, False, True, keep_adapted=True
        )
        documents.append(
            {"ids": streams[0], "prior": theta_g, "variables": variables,
             "vocabulary": vocab}
        )
        yield evaluator._model  # the user's model (not its keras-hub wrapper)
    finally:
        del documents[depth:]
        _recurrent_state.assign(variables, theta_g)
        _recurrent_state.assign(states, saved_states)


def continue_document(
    evaluator, max_length, prompt, sampler, *, k, p, temperature, seed,
    stop_token_ids, keep_adapting, vocabulary, jit_compile,
):
    """`DynamicEvaluator.generate`: see there. Every check before any step."""
    model = evaluator._require_model()
    if not evaluator._adapted_documents:
        raise ValueError(
            "Expected `generate` inside `with evaluator.adapt_to(document):` "
            "(it continues that document from its state). Received: no "
            "enclosing `adapt_to` block"
        )
    block = evaluator._adapted_documents[-1]
    if not isinstance(max_length, numbers.Integral) or isinstance(max_length, bool) or (
        max_length < 1
    ):
        raise ValueError(
            "Expected `max_length` to be a positive integer. Received: "
            f"max_length={max_length!r}"
        )
    if not isinstance(keep_adapting, bool):
        raise ValueError(
            "Expected `keep_adapting` to be a bool. Received: "
            f"keep_adapting={keep_adapting!r}"
        )
    if seed is not None and not (
        isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed >= 0
    ):
        raise ValueError(
            f"Expected `seed` to be a non-negative integer or None. Received: seed={seed!r}"
        )
    sampler = samplers_lib.get(sampler, k=k, p=p, temperature=temperature)
    if isinstance(sampler, samplers_lib.BeamSampler):
        raise ValueError(
            "Expected a sampler that picks one token per step (greedy, top_k, "
            "top_p, random): a document is continued along one path. "
            f"Received: sampler={sampler!r}"
        )
    vocabulary = text_lib.resolve_vocabulary(model, vocabulary) or block["vocabulary"]
    as_text = vocabulary is not None and (
        isinstance(prompt, str) or (prompt is None and block["vocabulary"] is not None)
    )
    if prompt is None:
        prompt_ids = np.zeros((0,), "int32")
    else:
        (prompt_ids,), _, _ = text_lib.as_sequences(
            prompt, vocabulary, model.vocabulary_size, "prompt", min_tokens=1
        )
    if max_length <= len(prompt_ids):
        raise ValueError(
            "Expected `max_length` (the output length, prompt included) to "
            f"exceed the prompt, {len(prompt_ids)} tokens. Received: "
            f"max_length={max_length}"
        )
    stop = stop_ids(stop_token_ids, vocabulary, model.vocabulary_size)
    variables = block["variables"]
    rms = hyperparameters = None
    if keep_adapting:
        rms, hyperparameters = evaluator._update_inputs(variables)
    decoder = decoder_for(model, jit_compile)

    # tokens[0] is the document's last token (its next input); the output
    # is tokens[1:].
    tokens = np.zeros(1 + max_length, "int32")
    tokens[0] = block["ids"][-1]
    tokens[1 : 1 + len(prompt_ids)] = prompt_ids
    rng = np.random.default_rng(seed)
    n = evaluator.segment_length
    states = _recurrent_state.state_variables(model)
    saved_states = _recurrent_state.snapshot(states)
    saved_weights = _recurrent_state.snapshot(variables)
    end = max_length
    try:
        segment_start, start_state = 0, _recurrent_state.snapshot(states)
        for position in range(max_length):
            uniform = rng.random(1, dtype=np.float32)
            sampled, _ = decoder.step(tokens[position : position + 1], uniform, sampler)
            if position >= len(prompt_ids):
                token = int(np.asarray(ops.convert_to_numpy(sampled))[0])
                tokens[position + 1] = token
                if stop is not None and token in stop:
                    end = position + 1
                    break
            if keep_adapting and position + 1 - segment_start == n:
                # Krause §3: the segment was sampled with fixed weights; now
                # the update on its loss, from the state it started in (the
                # same pass, so the state ends where sampling left it).
                _recurrent_state.assign(states, start_state)
                x = tokens[None, segment_start : position + 1]
                y = tokens[None, segment_start + 1 : position + 2]
                # One segment of the adaptation loop: its loss, gradient and
                # update (toward the block's prior) in one compiled call.
                evaluator._step("adaptation_loop", variables)(
                    (block["prior"], rms, hyperparameters),
                    ops.convert_to_tensor(x[None]), ops.convert_to_tensor(y[None]),
                    ops.convert_to_tensor(np.full((1, 1, n), 1.0 / n, "float32")),
                )
                segment_start = position + 1
                start_state = _recurrent_state.snapshot(states)
    finally:
        _recurrent_state.assign(variables, saved_weights)
        _recurrent_state.assign(states, saved_states)
    output = tokens[1 : 1 + end].copy()
    return text_lib.decode(vocabulary, output) if as_text else output
