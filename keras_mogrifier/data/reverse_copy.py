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
    `[0, vocabulary_size)`. An encoder reads them; a decoder, started from
    the encoder's last state, reads a marker token and then its own previous
    targets (teacher forcing) and must predict the encoder's tokens in
    reverse order:

    ```
    encoder_inputs  a b c d
    decoder_inputs  ▷ d c b        (▷ = the marker, id `vocabulary_size`)
    targets         d c b a
    ```

    so embeddings need `vocabulary_size + 1` rows and the output layer
    `vocabulary_size` classes. Melis et al. (2020, §4.3) use it to test their
    hypothesis that the Mogrifier enriches the input embedding: the LSTM and
    the Mogrifier both solve lengths 50 and 100, and at 150 and 200 the
    Mogrifier has a large advantage, with a much smaller embedding. Their
    sizes: 500,000 training and 10,000 validation and test examples, a
    vocabulary of 1,000 (`PAPER_TRAIN_EXAMPLES`,
    `PAPER_EVALUATION_EXAMPLES`, `PAPER_VOCABULARY_SIZE`).

    Args:
        num_examples: int. Number of examples.
        length: int. Tokens per sequence (L).
        vocabulary_size: int. Tokens are drawn from `[0, vocabulary_size)`;
            the marker is `vocabulary_size`.
        seed: int or None. Seed of NumPy's generator (`None`: fresh entropy).
            The same seed gives the same examples. Defaults to `None`.

    Returns:
        `((encoder_inputs, decoder_inputs), targets)`: three int32 arrays of
        shape `(num_examples, length)`, as `keras.Model.fit(x, y)` takes them
        for a two-input model.

    Example:

    >>> (enc, dec), targets = reverse_copy(2, 4, vocabulary_size=10, seed=0)
    >>> bool((targets == enc[:, ::-1]).all()), bool((dec[:, 0] == 10).all())
    (True, True)
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
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ValueError(f"Expected `seed` to be an int or None. Received: seed={seed!r}")
    rng = np.random.default_rng(seed)
    encoder_inputs = rng.integers(0, vocabulary_size, (num_examples, length), dtype=np.int32)
    targets = np.ascontiguousarray(encoder_inputs[:, ::-1])
    decoder_inputs = np.empty_like(targets)
    decoder_inputs[:, 0] = vocabulary_size
    decoder_inputs[:, 1:] = targets[:, :-1]
    return (encoder_inputs, decoder_inputs), targets
