"""The reverse copy task (Mogrifier LSTM paper, §4.3): encoder-decoder in Keras.

An encoder reads L random tokens and an end-of-sequence token; a decoder,
started from the encoder's last state, emits them in reverse and then the
end-of-sequence token (teacher forcing: it reads that token, then its own
previous targets). The paper's model, as deepmind/lamb's copy configuration
builds it (`lamb/experiment/mogrifier/tune_copy.sh`, `lamb/lm.py`):
independent unidirectional encoder and decoder with their own embeddings
(`share_input_and_output_embeddings=false`), both with the capped input gate
(`cap_input_gate=true`, the LSTM baseline too), an output down-projection to
the embedding size before the softmax (`lm.py` 245-253), no dropout; Adam
with β₁ = 0 (`optimizer_type="rmsprop"`, `lamb/utils.py` 279-282), gradient
norm clipped at 10 and ε 1e-8 on lamb's loss summed over the sequence
(converted to our per-token mean: ÷ (L + 1)); tuned learning rate, L2 and
embedding size. Written with `keras.layers.RNN` and the library's cells as
a user of the library would:

    python examples/reverse_copy.py --cell mogrifier_lstm --length 50
    python examples/reverse_copy.py --cell lstm --length 5 --vocabulary-size 10 \\
        --train-examples 20000 --epochs 3 --results-json runs/reverse_copy.json

The paper's data sizes are the defaults (500,000 training, 10,000 validation
and test examples, vocabulary 1,000); `--parameters N` sets the hidden size so
that the model has about N parameters (the paper compares cells at equal
parameter counts).
"""

import argparse
import json
import math
import os
import time

import _quiet  # noqa: F401  (first: a quiet TensorFlow start)

import keras  # noqa: E402

import keras_mogrifier as km  # noqa: E402
from keras_mogrifier.data import reverse_copy  # noqa: E402
from keras_mogrifier.pipeline import units as lamb_units  # noqa: E402
from keras_mogrifier.data.reverse_copy import PAPER_EVALUATION_EXAMPLES  # noqa: E402
from keras_mogrifier.data.reverse_copy import PAPER_TRAIN_EXAMPLES  # noqa: E402
from keras_mogrifier.data.reverse_copy import PAPER_VOCABULARY_SIZE  # noqa: E402

CELLS = ("lstm", "mogrifier_lstm", "rlstm", "mogrifier_rlstm")
# lamb's copy configuration (tune_copy.sh): max_grad_norm 10 and Adam's
# epsilon 1e-8 (lamb_flags.py 150), both on the loss summed over a sequence.
LAMB_MAX_GRAD_NORM = 10.0
LAMB_EPSILON = 1e-8


def make_cell(cell, units, rounds, rank, **initializers):
    # Every cell with the capped input gate, the LSTM too (lamb caps both:
    # `cap_input_gate=true`); "lstm" is the Mogrifier LSTM cell with 0 rounds.
    kwargs = dict(initializers)
    if cell.startswith("mogrifier"):
        kwargs.update(mogrifier_rounds=rounds, mogrifier_rank=rank)
        if initializers:
            kwargs["mogrifier_initializer"] = initializers["kernel_initializer"]
    if cell.endswith("rlstm"):
        return km.RLSTMCell(units, **kwargs)
    return km.MogrifierLSTMCell(
        units, **({"mogrifier_rounds": 0, "capped_input_gate": True} | kwargs)
    )


def build_model(cell, vocabulary_size, embedding_size, units, rounds=5, rank=None,
                l2=0.0, learning_rate=3e-3, length=None):
    """The encoder-decoder, compiled (Adam β₁ = 0, cross-entropy from logits).

    With `length` (L), Adam's ε and the gradient clip are lamb's (1e-8 and
    10 on its loss summed over the L + 1 target tokens), converted to the
    per-token mean (`keras_mogrifier.pipeline.units`); without, Keras's
    defaults and no clip.
    """
    regularizer = keras.regularizers.L2(l2) if l2 > 0 else None
    encoder_ids = keras.Input((None,), dtype="int32", name="encoder_inputs")
    decoder_ids = keras.Input((None,), dtype="int32", name="decoder_inputs")
    # +1 row: the end-of-sequence token (ends the input, starts the decoder).
    encoder_embedded = keras.layers.Embedding(
        vocabulary_size + 1, embedding_size, embeddings_regularizer=regularizer,
        name="encoder_embedding")(encoder_ids)
    decoder_embedded = keras.layers.Embedding(
        vocabulary_size + 1, embedding_size, embeddings_regularizer=regularizer,
        name="decoder_embedding")(decoder_ids)
    encoder = keras.layers.RNN(make_cell(cell, units, rounds, rank), return_state=True,
                               name="encoder")
    _, *state = encoder(encoder_embedded)
    decoder = keras.layers.RNN(make_cell(cell, units, rounds, rank), return_sequences=True,
                               name="decoder")
    outputs = decoder(decoder_embedded, initial_state=state)
    if embedding_size != units:
        # lamb's output down-projection to the output embedding size (the
        # input embedding size: `output_embedding_ratio` -1), orthogonal,
        # no bias (lm.py 245-253).
        outputs = keras.layers.Dense(
            embedding_size, use_bias=False, kernel_initializer="orthogonal",
            kernel_regularizer=regularizer, name="projection")(outputs)
    # The tokens and the end-of-sequence token.
    logits = keras.layers.Dense(vocabulary_size + 1, kernel_regularizer=regularizer,
                                name="output")(outputs)
    model = keras.Model([encoder_ids, decoder_ids], logits)
    optimizer = {"learning_rate": learning_rate, "beta_1": 0.0}
    if length is not None:
        optimizer.update(
            epsilon=lamb_units.summed_loss_epsilon(LAMB_EPSILON, length + 1),
            global_clipnorm=lamb_units.summed_loss_clipnorm(LAMB_MAX_GRAD_NORM, length + 1),
        )
    model.compile(
        optimizer=keras.optimizers.Adam(**optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # The cross-entropy alone (the loss also holds the L2 penalty).
        metrics=[
            keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy"),
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
        ],
    )
    return model


def units_for_parameters(cell, parameters, vocabulary_size, embedding_size, rounds=5, rank=None):
    """The hidden size whose model has the parameter count closest to `parameters`."""

    def count(units):
        # Two cells (encoder, decoder) built alone — quick on every backend —
        # plus two embeddings of V + 1 rows, the down-projection and the
        # output layer of V + 1 classes.
        r = rank if rank is None else min(rank, units, embedding_size)
        cells = 0
        # (Zero initialisers: counting needs no random draws or QR.)
        zeros = {"kernel_initializer": "zeros", "recurrent_initializer": "zeros"}
        for _ in range(2):
            c = make_cell(cell, units, rounds, r, **zeros)
            c.build((None, embedding_size))
            cells += c.count_params()
        projection = units * embedding_size if units != embedding_size else 0
        return (
            cells + 2 * (vocabulary_size + 1) * embedding_size + projection
            + (embedding_size + 1) * (vocabulary_size + 1)
        )

    low, high = 1, 8
    while count(high) < parameters:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if count(middle) < parameters:
            low = middle
        else:
            high = middle
    return min((low, high), key=lambda u: abs(count(u) - parameters))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--cell", choices=CELLS, default="mogrifier_lstm")
    parser.add_argument("--length", type=int, default=50, help="tokens per sequence (L)")
    parser.add_argument("--vocabulary-size", type=int, default=PAPER_VOCABULARY_SIZE)
    parser.add_argument("--train-examples", type=int, default=PAPER_TRAIN_EXAMPLES)
    parser.add_argument("--evaluation-examples", type=int, default=PAPER_EVALUATION_EXAMPLES,
                        help="validation and test examples each")
    parser.add_argument("--embedding-size", type=int, default=64)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--units", type=int, help="hidden size")
    size.add_argument("--parameters", type=int,
                      help="set the hidden size for about this many parameters")
    parser.add_argument("--mogrifier-rounds", type=int, default=5)
    parser.add_argument("--mogrifier-rank", type=int, help="default: full rank")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--l2", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-json")
    parser.add_argument("--verbose", type=int, default=2, choices=(0, 1, 2))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    size = args.vocabulary_size
    train = reverse_copy(args.train_examples, args.length, size, seed=args.seed)
    valid = reverse_copy(args.evaluation_examples, args.length, size, seed=args.seed + 1)
    test = reverse_copy(args.evaluation_examples, args.length, size, seed=args.seed + 2)
    units = args.units or 256
    if args.parameters:
        units = units_for_parameters(args.cell, args.parameters, size, args.embedding_size,
                                     args.mogrifier_rounds, args.mogrifier_rank)
    rank = args.mogrifier_rank
    if rank is not None:
        rank = min(rank, units, args.embedding_size)
    model = build_model(args.cell, size, args.embedding_size, units, args.mogrifier_rounds,
                        rank, args.l2, args.learning_rate, length=args.length)
    print(f"{args.cell}: embedding {args.embedding_size}, {units} units, "
          f"{model.count_params():,} parameters; L = {args.length}, vocabulary {size}, "
          f"{args.train_examples:,} training examples")
    start = time.time()
    history = model.fit(
        *train, validation_data=valid, batch_size=args.batch_size, epochs=args.epochs,
        verbose=args.verbose,
    )
    seconds = time.time() - start
    logs = model.evaluate(*test, batch_size=256, verbose=0, return_dict=True)
    test_cross_entropy, test_accuracy = logs["cross_entropy"], logs["accuracy"]
    results = {
        "cell": args.cell,
        "length": args.length,
        "vocabulary_size": size,
        "embedding_size": args.embedding_size,
        "units": units,
        "parameters": int(model.count_params()),
        "learning_rate": args.learning_rate,
        "l2": args.l2,
        "train_examples": args.train_examples,
        "epochs": args.epochs,
        "valid_cross_entropy_curve": [
            float(v) for v in history.history["val_cross_entropy"]
        ],
        "test_cross_entropy": float(test_cross_entropy),
        "test_accuracy": float(test_accuracy),
        # A uniform guess over the tokens and the end-of-sequence token.
        "uniform_cross_entropy": math.log(size + 1),
        "train_seconds": seconds,
        "backend": keras.backend.backend(),
    }
    print(f"test cross-entropy {results['test_cross_entropy']:.4f} nats per token "
          f"(uniform guess: {results['uniform_cross_entropy']:.4f}), token accuracy "
          f"{test_accuracy:.3f}; {seconds:.0f} s of training")
    if args.results_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.results_json)), exist_ok=True)
        with open(args.results_json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
