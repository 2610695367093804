"""The reverse copy task of the Mogrifier paper (§4.3, Figure 4)."""

import numpy as np

from keras_mogrifier._validation import positive_int

# The paper's sizes (§4.3): 500,000 training and 10,000 validation and test
# examples over a vocabulary of 1,000 tokens.
PAPER_TRAIN_EXAMPLES = 500_000
PAPER_EVALUATION_EXAMPLES = 10_000
PAPER_VOCABULARY_SIZE = 1_000


def reverse_copy(num_examples, length, vocabulary_size, seed=None):
    """Examples of the reverse copy task: read `length` tokens, emit them reversed.

    Each example is `length` tokens drawn uniformly from
    `[0, vocabulary_size)`, laid out as deepmind/lamb lays out a
    conditioned example (`lamb/corpus.py` `get_episodic_batches`, lines
    283-298, with `conditioning_separator` set as in its copy configuration,
    `lamb/lib/config/copy.sh`): one end-of-sequence token, id
    `vocabulary_size`, closes the encoder's input, starts the decoder's
    input and closes its targets, so the decoder also learns where the copy
    ends. An encoder reads the tokens; a decoder, started from the encoder's
    last state, reads the end-of-sequence token and then its own previous
    targets (teacher forcing):

    ```
    encoder_inputs  a b c d ⏹        (⏹ = end of sequence, id `vocabulary_size`)
    decoder_inputs  ⏹ d c b a
    targets         d c b a ⏹
    ```

    so embeddings and the output layer need `vocabulary_size + 1` rows and
    classes. Melis et al. (2020, §4.3) use it to test their hypothesis that
    the Mogrifier enriches the input embedding: the LSTM and the Mogrifier
    both solve lengths 50 and 100, and at 150 and 200 the Mogrifier has a
    large advantage, with a much smaller embedding. Their sizes: 500,000
    training and 10,000 validation and test examples, a vocabulary of 1,000
    (`PAPER_TRAIN_EXAMPLES`, `PAPER_EVALUATION_EXAMPLES`,
    `PAPER_VOCABULARY_SIZE`).

    Args:
        num_examples: int. Number of examples.
        length: int. Tokens per sequence (L).
        vocabulary_size: int. Tokens are drawn from `[0, vocabulary_size)`;
            the end-of-sequence token is `vocabulary_size`.
        seed: int ≥ 0 or None. Seed of NumPy's generator (`None`: fresh
            entropy). The same seed gives the same examples. Defaults to
            `None`.

    Returns:
        `((encoder_inputs, decoder_inputs), targets)`: three int32 arrays of
        shape `(num_examples, length + 1)`, as `keras.Model.fit(x, y)` takes
        them for a two-input model.

    Example:

    >>> (enc, dec), targets = reverse_copy(2, 4, vocabulary_size=10, seed=0)
    >>> enc.shape, bool((targets[:, :4] == enc[:, 3::-1]).all())
    ((2, 5), True)
    >>> bool((enc[:, 4] == 10).all() and (dec[:, 0] == 10).all()
    ...      and (targets[:, 4] == 10).all())
    True
    >>> bool((dec[:, 1:] == targets[:, :-1]).all())
    True
    """
    num_examples = positive_int("num_examples", num_examples)
    length = positive_int("length", length)
    vocabulary_size = positive_int("vocabulary_size", vocabulary_size)
    if vocabulary_size < 2:
        raise ValueError(
            "Expected `vocabulary_size` of at least 2 (one token is no task). "
            f"Received: vocabulary_size={vocabulary_size}"
        )
    int32_max = np.iinfo(np.int32).max
    if vocabulary_size >= int32_max:
        raise ValueError(
            f"Expected `vocabulary_size` below {int32_max} (the ids and the "
            f"end-of-sequence id {vocabulary_size} are int32). Received: "
            f"vocabulary_size={vocabulary_size}"
        )
    if num_examples * (length + 1) > int32_max:
        raise ValueError(
            f"Expected at most {int32_max} tokens per array (`num_examples` × "
            f"(`length` + 1), int32-indexed). Received: num_examples="
            f"{num_examples}, length={length}: {num_examples * (length + 1)} tokens"
        )
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
    ):
        raise ValueError(
            f"Expected `seed` to be a non-negative int or None. Received: seed={seed!r}"
        )
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocabulary_size, (num_examples, length), dtype=np.int32)
    end = np.full((num_examples, 1), vocabulary_size, np.int32)
    encoder_inputs = np.concatenate([tokens, end], axis=1)
    targets = np.concatenate([tokens[:, ::-1], end], axis=1)
    decoder_inputs = np.concatenate([end, targets[:, :-1]], axis=1)
    return (encoder_inputs, decoder_inputs), targets
