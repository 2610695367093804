"""enwik8 (the Hutter Prize data set), byte level, with the standard split."""

from keras_mogrifier.data.corpus import Corpus
from keras_mogrifier.data.hutter import find_file
from keras_mogrifier.data.hutter import read_hutter_file
from keras_mogrifier.data.hutter import split_bytes
from keras_mogrifier.data.reader import SymbolTable

ENWIK8_TEST_BYTES = 5_000_000


def load_enwik8(path, *, valid_bytes=ENWIK8_TEST_BYTES, test_bytes=ENWIK8_TEST_BYTES):
    """Loads enwik8 at byte level: the first 90M bytes train, 5M valid, 5M test.

    enwik8 is the first 10⁸ bytes of an English Wikipedia XML dump (the
    Hutter Prize data set; 205 distinct byte values, UTF-8 with non-Latin
    scripts). The standard split, used by Krause et al. (2018), the
    Mogrifier paper and *Circling Back* alike, takes the last 10M bytes for
    validation and test, 5M each (Transformer-XL's `prep_enwik8.py`:
    `data[: -2 * 5000000]`, `data[-2 * 5000000 : -5000000]`,
    `data[-5000000:]`). Every byte is a token (`Vocabulary.bytes()`, the
    newline byte read as `<eos>`), so bits per token are the bits per
    character those papers report. The authors' code (deepmind/lamb
    `lib/config/enwik8.sh` line 20) reads the file as CP437, a one-to-one
    map of the 256 bytes, which is the same thing. Nothing is downloaded:
    get `enwik8.zip` from http://mattmahoney.net/dc/enwik8.zip.

    The read goes straight into arrays (no Python object per byte): about
    0.5 GB of memory and seconds for the whole file
    (`benchmarks/read_text.py`).

    Args:
        path: str or path. The file `enwik8`, `enwik8.gz` or `enwik8.zip`,
            or a directory holding one of them.
        valid_bytes: int. Bytes of the validation split. Defaults to
            5,000,000.
        test_bytes: int. Bytes of the test split, the last ones. Defaults
            to 5,000,000.

    Returns:
        A byte-level `Corpus` (`source="file"`).

    Raises:
        FileNotFoundError: no such file (or none of those names in the
            directory).
        ValueError: the file is too short for the split.

    Example:

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "enwik8")
    >>> with open(path, "wb") as f:
    ...     _ = f.write("<page>Zürich\\n</page>\\n".encode() * 10)
    >>> corpus = load_enwik8(path, valid_bytes=22, test_bytes=22)
    >>> len(corpus.train), len(corpus.valid), len(corpus.test)
    (176, 22, 22)
    >>> corpus.vocabulary.decode(corpus.test)
    '<page>Zürich\\n</page>\\n'

    Reference:
        Hutter, "The Human Knowledge Compression Prize", 2006,
        http://prize.hutter1.net. Krause, Kahembwe, Murray, Renals,
        "Dynamic Evaluation of Neural Sequence Models", ICML 2018.
    """
    path = find_file(path, "enwik8")
    data = read_hutter_file(path)
    table = SymbolTable("byte")
    codes = table.codes(data)
    del data
    splits = split_bytes(codes, valid_bytes, test_bytes, path)
    return Corpus._from_codes(
        table, splits, None, 1, None, "<unk>", "file", {s: path for s in splits}
    )

