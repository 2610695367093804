"""Text generation from a stateful language model."""

import numbers

import numpy as np
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier import samplers as samplers_lib
from keras_mogrifier.generation import text as text_lib
from keras_mogrifier.generation.decoder import check_model
from keras_mogrifier.generation.decoder import decoder_for

# New tokens after the longest prompt when `max_length` is not given.
DEFAULT_NEW_TOKENS = 100


def generate(
    model,
    prompts,
    max_length=None,
    sampler="greedy",
    *,
    k=None,
    p=None,
    num_beams=None,
    temperature=None,
    seed=None,
    stop_token_ids="auto",
    vocabulary=None,
    strip_prompt=False,
    jit_compile="auto",
):
    """Continues each prompt, one token at a time through the carried state.

    Each prompt is read once — in windows of known tokens, then one step per
    token — and each new token costs one compiled step (`Decoder.step`):
    the recurrent state is carried, the prefix is never re-run. Prompts of
    different lengths run together: a row still inside its prompt is fed
    its next prompt token, the others their sampled token. Every prompt
    starts from a zero recurrent state; the model's carried state, weights
    and temperature are as they were afterwards. More prompts than the
    model's state has rows run in groups.

    Args:
        model: a built, stateful `LanguageModel`.
        prompts: a string, a list of strings (read with the vocabulary), a
            1-D sequence of token ids, or a list / 2-D array of them.
        max_length: int or `None`. Length of each output, prompt included
            (as in keras-hub); must exceed the longest prompt. `None`: the
            longest prompt plus 100 tokens (`DEFAULT_NEW_TOKENS`; keras-hub
            takes its preprocessor's `sequence_length`, which a recurrent
            model does not have). Defaults to `None`.
        sampler: `"greedy"`, `"top_k"`, `"top_p"`, `"random"`, `"beam"`
            or a `keras_mogrifier.samplers.Sampler`. Defaults to `"greedy"`.
        k: int or `None`. `k` of `"top_k"` (default 5) or `"top_p"`.
        p: float or `None`. `p` of `"top_p"` (default 0.1).
        num_beams: int or `None`. `num_beams` of `"beam"` (default 5); each
            beam takes a row of the model's state.
        temperature: float or `None`. The sampler's temperature (logits
            divided by it, after the model's own softmax temperature);
            `None` is 1.
        seed: int or `None`. Seed of the random numbers of the samplers: the
            same seed gives the same text. Defaults to `None` (fresh).
        stop_token_ids: `"auto"`, `None` or a sequence of ids. A row stops
            after producing one of them (it is kept in the output).
            `"auto"` is the vocabulary's `<eos>` when there is a
            vocabulary, else no stop. Defaults to `"auto"`.
        vocabulary: a `keras_mogrifier.data.Vocabulary` or `None`. For text
            prompts and outputs; defaults to the model's `vocabulary`.
        strip_prompt: bool. Return only the new tokens, without the prompt
            (as keras-hub's `strip_prompt`). Defaults to `False`.
        jit_compile: bool or `"auto"`. Defaults to `"auto"`.

    Returns:
        For text prompts strings, for id prompts int32 arrays (prompt and
        continuation, or the continuation only with `strip_prompt=True`);
        one result for one prompt, else a list.
    """
    check_model(model)
    if max_length is not None:
        max_length = _validation.positive_int("max_length", max_length)
    if not isinstance(strip_prompt, (bool, np.bool_)):
        raise ValueError(
            f"Expected `strip_prompt` to be True or False. Received: "
            f"strip_prompt={strip_prompt!r}"
        )
    sampler = samplers_lib.get(
        sampler, k=k, p=p, num_beams=num_beams, temperature=temperature
    )
    if seed is not None and not (
        isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed >= 0
    ):
        raise ValueError(
            f"Expected `seed` to be a non-negative integer or None. Received: seed={seed!r}"
        )
    vocabulary = text_lib.resolve_vocabulary(model, vocabulary)
    stop = stop_ids(stop_token_ids, vocabulary, model.vocabulary_size)
    sequences, single, as_text = text_lib.as_sequences(
        prompts, vocabulary, model.vocabulary_size, "prompt", min_tokens=1
    )
    beams = sampler.num_beams if isinstance(sampler, samplers_lib.BeamSampler) else None
    longest = max(len(s) for s in sequences)
    if max_length is None:
        max_length = longest + DEFAULT_NEW_TOKENS
    if max_length <= longest:
        raise ValueError(
            "Expected `max_length` (the output length, prompt included) to "
            f"exceed the longest prompt, {longest} tokens. Received: "
            f"max_length={max_length}"
        )
    decoder = decoder_for(model, jit_compile)
    if beams is not None and beams > decoder.capacity:
        raise ValueError(
            f"Expected `num_beams` to be at most the rows of the model's "
            f"recurrent state ({decoder.capacity}): each beam is a row. "
            f"Received: num_beams={beams}"
        )
    rng = np.random.default_rng(seed)
    outputs = []
    group_size = decoder.capacity // (beams or 1)
    with decoder.fresh_state():
        for start in range(0, len(sequences), group_size):
            group = sequences[start : start + group_size]
            if start:
                decoder.reset_state()
            if beams is None:
                outputs.extend(_decode(decoder, group, max_length, sampler, stop, rng))
            else:
                outputs.extend(_beam_decode(decoder, group, max_length, sampler, stop))
    if strip_prompt:
        outputs = [ids[len(prompt):] for ids, prompt in zip(outputs, sequences)]
    if as_text:
        outputs = [text_lib.decode(vocabulary, ids) for ids in outputs]
    return outputs[0] if single else outputs


def _decode(decoder, prompts, max_length, sampler, stop, rng):
    rows = len(prompts)
    lengths = np.array([len(p) for p in prompts])
    tokens = np.zeros((rows, max_length), "int32")
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    ends = np.full(rows, max_length)
    finished = np.zeros(rows, bool)
    # Tokens known in every row are read first (in windows where the model
    # is compiled); from there on, one step per position: the next prompt
    # token where a row has one, else the sampled one. The ids are the
    # prompts' (checked) and the sampler's own, the uniforms `rng`'s:
    # nothing to check again at every token (see
    # `Decoder.generation_steps`; `generate` runs inside `fresh_state()`).
    read, step = decoder.generation_steps(sampler)
    position = read(tokens, int(lengths.min()) - 1)
    for position in range(position, max_length - 1):
        uniform = rng.random(rows, dtype=np.float32)
        sampled = step(tokens[:, position], uniform)
        generating = (position + 1 >= lengths) & ~finished
        tokens[generating, position + 1] = sampled[generating]
        if stop is not None:
            stopped = generating & np.isin(sampled, stop)
            ends[stopped] = position + 2
            finished |= stopped
            if finished.all():
                break
    return [tokens[row, : ends[row]].copy() for row in range(rows)]


def _beam_decode(decoder, prompts, max_length, sampler, stop):
    beams = sampler.num_beams
    rows = len(prompts)
    lengths = np.array([len(p) for p in prompts])
    tokens = np.zeros((rows, beams, max_length), "int32")
    for row, prompt in enumerate(prompts):
        tokens[row, :, : len(prompt)] = prompt
    scores = np.full((rows, beams), -1e9, "float32")
    scores[:, 0] = 0.0  # one beam to start from: the others are copies
    finished = np.zeros((rows, beams), bool)
    pad = 0 if stop is None else int(stop[0])
    position = decoder.read_known(
        tokens.reshape(rows * beams, max_length), int(lengths.min()) - 1
    )
    for position in range(position, max_length - 1):
        generating = position + 1 >= lengths
        forced = tokens[:, 0, position + 1]
        next_tokens, scores, parents = decoder.beam_step(
            tokens[:, :, position].reshape(-1), scores, generating, forced,
            finished.reshape(-1), pad, sampler,
        )
        next_tokens, scores, parents = (
            np.asarray(ops.convert_to_numpy(t)) for t in (next_tokens, scores, parents)
        )
        tokens = np.take_along_axis(tokens, parents[:, :, None], axis=1)
        finished = np.take_along_axis(finished, parents, axis=1)
        tokens[:, :, position + 1] = next_tokens.reshape(rows, beams)
        if stop is not None:
            finished |= generating[:, None] & np.isin(tokens[:, :, position + 1], stop)
            if finished.all():
                break
    outputs = []
    for row in range(rows):
        best = tokens[row, int(np.argmax(scores[row]))]
        end = position + 2
        if stop is not None:
            stops = np.flatnonzero(np.isin(best[lengths[row] : end], stop))
            if stops.size:
                end = lengths[row] + stops[0] + 1
        outputs.append(best[:end].copy())
    return outputs


def stop_ids(stop_token_ids, vocabulary, vocabulary_size):
    if isinstance(stop_token_ids, str):
        if stop_token_ids != "auto":
            raise ValueError(
                "Expected `stop_token_ids` to be 'auto', None or a sequence of "
                f"token ids. Received: stop_token_ids={stop_token_ids!r}"
            )
        return None if vocabulary is None else np.array([vocabulary.eos_id])
    if stop_token_ids is None:
        return None
    ids = np.asarray(stop_token_ids).reshape(-1)
    if ids.size == 0 or not np.issubdtype(ids.dtype, np.integer) or (
        ids.min() < 0 or ids.max() >= vocabulary_size
    ):
        raise ValueError(
            f"Expected `stop_token_ids` to be token ids in [0, {vocabulary_size}). "
            f"Received: stop_token_ids={stop_token_ids!r}"
        )
    return ids
