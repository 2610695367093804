"""text8 (Mahoney's cleaned Wikipedia text), character level, standard split."""

from keras_mogrifier.data import reader
from keras_mogrifier.data.corpus import Corpus
from keras_mogrifier.data.hutter import find_file
from keras_mogrifier.data.hutter import read_hutter_file
from keras_mogrifier.data.hutter import split_bytes

TEXT8_TEST_CHARACTERS = 5_000_000


def load_text8(
    path, *, valid_characters=TEXT8_TEST_CHARACTERS, test_characters=TEXT8_TEST_CHARACTERS
):
    """Loads text8 at character level: 90M characters train, 5M valid, 5M test.

    text8 is enwik8 with the XML removed, lower-cased to the 26 letters and
    the space: 10⁸ characters on one line. The standard split (Mikolov et
    al. 2014; Krause et al. 2018 §7.2: "the standard 90:5:5 split"; the
    Transformer-XL and *Circling Back* character-level tables) takes the
    last 10M characters for validation and test, 5M each. The characters
    are the tokens exactly as they are in the file (it is already one line
    of single-spaced words, so no space is dropped and no `<eos>` is added:
    bits per token are the papers' bits per character); the vocabulary is
    the 27 characters, by count, and `<eos>` (unused, for generation). The
    vocabulary is built by the same reader as every corpus's
    (`keras_mogrifier.data.reader`). Nothing is downloaded: get `text8.zip`
    from http://mattmahoney.net/dc/text8.zip.

    Args:
        path: str or path. The file `text8`, `text8.gz` or `text8.zip`, or a
            directory holding one of them.
        valid_characters: int. Characters of the validation split. Defaults
            to 5,000,000.
        test_characters: int. Characters of the test split, the last ones.
            Defaults to 5,000,000.

    Returns:
        A character-level `Corpus` (`source="file"`).

    Raises:
        FileNotFoundError: no such file (or none of those names in the
            directory).
        ValueError: the file is too short for the split, or is not text.

    Example:

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "text8")
    >>> with open(path, "w") as f:
    ...     _ = f.write(" anarchism originated as a term of abuse" * 5)
    >>> corpus = load_text8(path, valid_characters=40, test_characters=40)
    >>> len(corpus.train), len(corpus.vocabulary)
    (120, 18)
    >>> corpus.vocabulary.decode(corpus.test)
    ' anarchism originated as a term of abuse'

    Reference:
        Mahoney, "About the Test Data", http://mattmahoney.net/dc/textdata.
        Mikolov, Joulin, Chopra, Mathieu, Ranzato, "Learning Longer Memory
        in Recurrent Neural Networks", arXiv:1412.7753, 2014.
    """
    path = find_file(path, "text8")
    text = reader.decode_text(read_hutter_file(path), path, "utf-8")
    table = reader.SymbolTable("char")
    codes = reader.code_points(text)
    del text
    splits = split_bytes(codes, valid_characters, test_characters, path, "characters")
    return Corpus._from_codes(
        table, splits, None, 1, None, "<unk>", "file", {s: path for s in splits}
    )
