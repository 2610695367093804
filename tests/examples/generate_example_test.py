"""examples/generate.py: generation, scoring and adaptation from the command line."""

import keras
import numpy as np
from ptb_word_test import _load_example

from keras_mogrifier.data import Vocabulary
from keras_mogrifier.models import LanguageModel

WORDS = Vocabulary(["the", "<eos>", "a", "cat", "dog", "sat", "ran", "on", "mat", "<unk>"])


def test_generate_score_and_adapt(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    model = LanguageModel(len(WORDS), units=8, num_layers=1, cell="lstm", batch_size=2, vocabulary=WORDS)
    model.build((2, None))
    path = str(tmp_path / "model.keras")
    model.save(path)
    article = tmp_path / "article.txt"
    article.write_text("the dog ran on the mat\n" * 8)
    example = _load_example("generate")
    example.main([
        "--model", path, "--prompt", "the dog", "--prompt", "a", "--max-length", "6",
        "--sampler", "greedy", "--no-stop", "--score", "the cat sat on the mat <eos>",
        "--adapt-to", str(article), "--learning-rate", "1e-3",
    ])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "trained model:"
    assert lines[1].startswith("  the dog ") and len(lines[1].split()) == 6
    assert lines[2].startswith("  a ") and len(lines[2].split()) == 6
    assert lines[3].startswith("  score 'the cat sat on the mat <eos>': log-probability")
    assert lines[4].startswith(f"adapted to {article} (56 tokens, perplexity")
    assert len(lines) == 8
    # The saved model is unchanged by adapting.
    np.testing.assert_array_equal(
        keras.saving.load_model(path).get_weights()[0], model.get_weights()[0]
    )
