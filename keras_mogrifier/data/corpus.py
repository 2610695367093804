"""A tokenised corpus, and reading one from a directory in the PTB format.

The format (Mikolov's preprocessing of the Penn Treebank, also used by
WikiText and many others): plain text, one sentence per line, tokens
separated by whitespace. Each line is followed by an end-of-sentence token
`<eos>`. Files may be gzip-compressed (`.gz`). The levels (`"word"`,
`"char"`, `"byte"`) are those of `keras_mogrifier.data.reader`, which every
loader shares: `load_text` (any file or files), `load_corpus` (a directory
named by a pattern), `load_ptb`, `load_wikitext2`, `load_enwik8`,
`load_text8`. (Mikolov's character-level PTB files, `ptb.char.*.txt`, which
already separate characters by spaces and mark word boundaries with `_`,
are read with `level="word"`.)
"""

import os

import numpy as np

from keras_mogrifier import _validation
from keras_mogrifier.data import reader
from keras_mogrifier.data.reader import LEVELS
from keras_mogrifier.data.reader import SPACE_TOKEN  # noqa: F401  (re-exported)
from keras_mogrifier.data.reader import read_lines  # noqa: F401  (re-exported)
from keras_mogrifier.data.reader import tokenize_line  # noqa: F401  (re-exported)
from keras_mogrifier.data.vocabulary import EOS_TOKEN
from keras_mogrifier.data.vocabulary import UNK_TOKEN
from keras_mogrifier.data.vocabulary import Vocabulary

SPLITS = ("train", "valid", "test")
DEFAULT_FILE_PATTERN = "ptb.{split}.txt"


class Corpus:
    """A tokenised corpus: token-id arrays per split and their vocabulary.

    Usually made by `load_text`, `load_corpus`, `load_ptb` or
    `synthetic_corpus`. The id arrays are checked once, here (every id in
    `[0, len(vocabulary))`), and are read-only: the consumers of the
    library (`StreamDataset`, `search_temperature`, `LanguageModel.fit` /
    `evaluate`, `DynamicEvaluator`) know them, and their slices, as checked
    and do not scan them again.

    Args:
        splits: dict of str to 1-D int array. The id stream of each split
            (`"train"`, `"valid"`, `"test"`, ...), `<eos>` included. They
            are copied into read-only int32 arrays.
        vocabulary: `Vocabulary`. Maps the ids to tokens.
        level: str or `None`. `"word"`, `"char"` or `"byte"`; must be the
            vocabulary's level. Defaults to `None` (the vocabulary's).
        source: str. Where the text came from: `"file"`, `"directory"`,
            `"download"`, `"synthetic"` or `"memory"`.
        paths: dict of str to str, or `None`. The file each split was read
            from. Defaults to `None`.

    Example:

    >>> corpus = Corpus.from_lines(
    ...     {"train": ["a b a", "b c"], "valid": ["c a"]}, level="word"
    ... )
    >>> corpus.vocabulary.tokens
    ['<eos>', 'a', 'b', 'c']
    >>> corpus.valid.tolist()
    [3, 1, 0]
    """

    def __init__(self, splits, vocabulary, level=None, source="memory", paths=None, *, _owned=False):
        if not isinstance(vocabulary, Vocabulary):
            raise ValueError(
                "Expected `vocabulary` to be a `Vocabulary`. "
                f"Received: vocabulary={vocabulary!r}"
            )
        if level is None:
            level = vocabulary.level
        _validation.one_of("level", level, LEVELS)
        if level != vocabulary.level:
            raise ValueError(
                f"Expected `level` to be the vocabulary's level "
                f"({vocabulary.level!r}). Received: level={level!r}"
            )
        if not isinstance(splits, dict) or not splits:
            raise ValueError(
                "Expected `splits` to be a non-empty dict of split name to ids. "
                f"Received: splits={splits!r}"
            )
        arrays = {}
        for name, ids in splits.items():
            ids = np.asarray(ids)
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(
                    f"Expected split {name!r} to be a 1-D integer array. "
                    f"Received: shape {ids.shape}, dtype {ids.dtype}"
                )
            if ids.size and (ids.min() < 0 or ids.max() >= len(vocabulary)):
                raise ValueError(
                    f"Expected the ids of split {name!r} in [0, {len(vocabulary)})"
                    f". Received: min {ids.min()}, max {ids.max()}"
                )
            # Our own arrays (from the reader) are kept as they are; a
            # caller's are copied, so that making them read-only changes
            # nothing the caller holds.
            ids = ids.astype(np.int32, copy=not _owned)
            arrays[name] = _validation.mark_token_ids(ids, len(vocabulary))
        self.splits = arrays
        self.vocabulary = vocabulary
        self.level = level
        self.source = source
        self.paths = dict(paths or {})

    @classmethod
    def from_texts(
        cls,
        texts,
        level="word",
        vocabulary=None,
        *,
        min_count=1,
        max_size=None,
        tokenizer=None,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        source="memory",
        paths=None,
    ):
        """Tokenises the text of each split into a `Corpus`.

        Every line is followed by `eos_token` (a last line without `"\\n"`
        too; at byte level the newline byte is the `eos_token`). Without
        `vocabulary`, it is built from the `"train"` split: tokens seen
        fewer than `min_count` times there, or beyond the `max_size` most
        frequent (`eos_token` and `unk_token` not counted), map to
        `unk_token`, and so do the tokens of other splits that training
        lacks; `unk_token` is in the vocabulary exactly when something maps
        to it (or training holds it). With a `vocabulary`, tokens it lacks
        map to its `unk_token` when it has one, else raise a `ValueError`
        naming the token, split, file and line.

        Args:
            texts: dict of str to str (bytes too at byte level). The text of
                each split.
            level: str. `"word"`, `"char"` or `"byte"`. Defaults to `"word"`.
            vocabulary: `Vocabulary` or `None`. A fixed vocabulary (e.g. the
                one a model was trained with). Defaults to `None`.
            min_count: int. Defaults to 1 (keep every token).
            max_size: int or `None`. Defaults to `None` (no limit).
            tokenizer: callable or `None`. Word level: a line → its tokens,
                an iterable of non-empty str, as for `load_text` (what it
                raises or returns otherwise is a `ValueError` naming it, the
                file or split, and the line). Defaults to `None`
                (whitespace).
            eos_token: str. Defaults to `"<eos>"`.
            unk_token: str. Defaults to `"<unk>"`.
            source: str. Stored as `Corpus.source`. Defaults to `"memory"`.
            paths: dict or `None`. Stored as `Corpus.paths`, and used in
                error messages. Defaults to `None`.

        Returns:
            A `Corpus`.

        Raises:
            ValueError: a split without any token; a token a given
                `vocabulary` lacks when it has no `unk_token`; the
                `tokenizer` raises or returns something other than an
                iterable of non-empty strings; at char level, a lone
                surrogate (half of a UTF-16 pair: no character) in a text.
        """
        table, codes = _codes_of(
            texts, level, vocabulary, min_count, max_size, tokenizer, eos_token, paths
        )
        return cls._from_codes(
            table, codes, vocabulary, min_count, max_size, unk_token, source, paths,
            empty={split: "no text" for split in texts},
        )

    @classmethod
    def from_lines(
        cls,
        lines,
        level="word",
        vocabulary=None,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        source="memory",
        paths=None,
        **kwargs,
    ):
        """`from_texts` of lines: a dict of split name to a list of lines.

        Each line is followed by `eos_token`. Other keyword arguments
        (`min_count`, `max_size`, `tokenizer`) go to `from_texts`.
        """
        if not isinstance(lines, dict) or not lines:
            raise ValueError(
                "Expected `lines` to be a non-empty dict of split name to lines. "
                f"Received: lines={lines!r}"
            )
        texts = {}
        for split, split_lines in lines.items():
            if isinstance(split_lines, str):
                raise ValueError(
                    f"Expected the lines of split {split!r} to be a list of "
                    "strings, not one string"
                )
            split_lines = list(split_lines)
            texts[split] = "".join(line + "\n" for line in split_lines)
        return cls.from_texts(
            texts, level, vocabulary, eos_token=eos_token, unk_token=unk_token,
            source=source, paths=paths, **kwargs,
        )

    @classmethod
    def from_files(
        cls,
        paths,
        level="word",
        vocabulary=None,
        *,
        min_count=1,
        max_size=None,
        tokenizer=None,
        encoding="utf-8",
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        source="file",
    ):
        """`from_texts` of files: a dict of split name to a file (plain or `.gz`).

        Raises:
            FileNotFoundError: a file does not exist.
            ValueError: a file is empty or has no token, cannot be decoded
                in `encoding` (the message suggests `encoding=` or
                `level="byte"`), or holds a token a given vocabulary lacks
                when it has no `unk_token`; the `tokenizer` fails on a line
                (the message names it, the file and the line).
        """
        reader.check_level(level)
        check_reading_options(level, min_count, max_size, tokenizer)
        if not isinstance(paths, dict) or not paths:
            raise ValueError(
                "Expected `paths` to be a non-empty dict of split name to file. "
                f"Received: paths={paths!r}"
            )
        paths = {split: os.fspath(path) for split, path in paths.items()}
        texts = {}
        for split, path in paths.items():
            data = reader.read_bytes(path)
            texts[split] = data if level == "byte" else reader.decode_text(data, path, encoding)
            del data
        table, codes = _codes_of(
            texts, level, vocabulary, min_count, max_size, tokenizer, eos_token, paths
        )
        empty = {split: "an empty file" for split, text in texts.items() if len(text) == 0}
        del texts
        return cls._from_codes(
            table, codes, vocabulary, min_count, max_size, unk_token, source, paths,
            empty=empty, encoding=encoding,
        )

    @classmethod
    def _from_codes(
        cls, table, codes, vocabulary, min_count, max_size, unk_token, source, paths,
        empty=None, encoding="utf-8",
    ):
        if vocabulary is None and "train" not in codes:
            raise ValueError(
                "Expected a 'train' split to build the vocabulary from, or a "
                f"`vocabulary`. Received splits: {sorted(codes)}"
            )
        ids, vocabulary = reader.encode_codes(
            table, codes, vocabulary=vocabulary, min_count=min_count,
            max_size=max_size, unk_token=unk_token, paths=paths, empty=empty,
        )
        if table.level == "byte" and vocabulary.encoding != encoding:
            vocabulary = Vocabulary.bytes(encoding, eos_token=vocabulary.eos_token)
        return cls(ids, vocabulary, source=source, paths=paths, _owned=True)

    def __getitem__(self, split):
        try:
            return self.splits[split]
        except KeyError:
            raise KeyError(
                f"This corpus has no {split!r} split. Its splits: {sorted(self.splits)}"
            ) from None

    @property
    def train(self):
        """Ids of the training split."""
        return self["train"]

    @property
    def valid(self):
        """Ids of the validation split."""
        return self["valid"]

    @property
    def test(self):
        """Ids of the test split."""
        return self["test"]

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return (
            f"Corpus(level={self.level!r}, source={self.source!r}, "
            f"vocabulary_size={len(self.vocabulary)}, tokens: {sizes})"
        )


def _codes_of(texts, level, vocabulary, min_count, max_size, tokenizer, eos_token, paths=None):
    """Checks the reading arguments; the symbol table and codes of each text.

    `paths` (split → file) name the text in a tokenizer's errors.
    """
    reader.check_level(level)
    if not isinstance(texts, dict) or not texts:
        raise ValueError(
            "Expected `texts` to be a non-empty dict of split name to text. "
            f"Received: texts={texts!r}"
        )
    if vocabulary is not None and not isinstance(vocabulary, Vocabulary):
        raise ValueError(
            "Expected `vocabulary` to be a `Vocabulary` or None. "
            f"Received: vocabulary={vocabulary!r}"
        )
    check_reading_options(level, min_count, max_size, tokenizer)
    table = reader.SymbolTable(level, tokenizer, eos_token)
    codes = {}
    for split, text in texts.items():
        expected = (str, bytes, bytearray) if level == "byte" else (str,)
        if not isinstance(text, expected):
            raise ValueError(
                f"Expected the text of split {split!r} to be a string"
                + (" or bytes" if level == "byte" else "")
                + f". Received: {type(text).__name__}"
            )
        if level == "byte" and isinstance(text, str):
            text = text.encode("utf-8")
        path = (paths or {}).get(split)
        is_path = isinstance(path, (str, os.PathLike))
        where = repr(os.fspath(path)) if is_path else f"the {split!r} split"
        codes[split] = table.codes(text, where)
    return table, codes


def check_reading_options(level, min_count, max_size, tokenizer):
    """The checks of `min_count`, `max_size` and `tokenizer` at a level."""
    _validation.positive_int("min_count", min_count)
    _validation.optional_positive_int("max_size", max_size)
    if tokenizer is not None and not callable(tokenizer):
        raise ValueError(
            "Expected `tokenizer` to be a callable (a line → its tokens) or "
            f"None. Received: tokenizer={tokenizer!r}"
        )
    if tokenizer is not None and level != "word":
        raise ValueError(
            "Expected `tokenizer` only with level='word' (characters and "
            f"bytes are their own tokens). Received: level={level!r} and a tokenizer"
        )
    if level == "byte" and (min_count != 1 or max_size is not None):
        raise ValueError(
            "Expected min_count=1 and max_size=None at level='byte': its "
            "vocabulary is always the 256 byte values and <eos>, with no "
            f"<unk>. Received: min_count={min_count!r}, max_size={max_size!r}"
        )


def find_split_file(data_dir, split, file_pattern=DEFAULT_FILE_PATTERN):
    """The file of one split: `file_pattern` with `{split}`, plain or `.gz`.

    The plain file wins when both exist.

    Raises:
        FileNotFoundError: neither exists.
    """
    name = file_pattern.format(split=split)
    candidates = [name] if name.endswith(".gz") else [name, name + ".gz"]
    for candidate in candidates:
        path = os.path.join(os.fspath(data_dir), candidate)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"No file for the {split!r} split in {os.fspath(data_dir)!r}: tried "
        + " and ".join(repr(c) for c in candidates)
    )


def load_corpus(
    data_dir,
    level="word",
    file_pattern=DEFAULT_FILE_PATTERN,
    splits=SPLITS,
    vocabulary=None,
    eos_token=EOS_TOKEN,
    unk_token=UNK_TOKEN,
    *,
    min_count=1,
    max_size=None,
    tokenizer=None,
    encoding="utf-8",
):
    """Reads a corpus in the PTB format from a directory.

    Split `s` is read from `file_pattern.format(split=s)` in `data_dir`, or
    from the same name with `.gz` appended (gzip), by `Corpus.from_files`:
    the vocabulary is built from the training split (by count, then
    lexicographically; `min_count`, `max_size`), and tokens of the other
    splits that it lacks map to `unk_token`. (`load_text` finds the usual
    file names by itself.)

    Args:
        data_dir: str or path. The directory of the files.
        level: str. `"word"`, `"char"` or `"byte"` (see
            `keras_mogrifier.data.reader`). Defaults to `"word"`.
        file_pattern: str. File name with a `{split}` field. Defaults to
            `"ptb.{split}.txt"`.
        splits: tuple of str. The splits to read. Defaults to
            `("train", "valid", "test")`.
        vocabulary: `Vocabulary` or `None`. Use this vocabulary instead of
            building one (e.g. `Vocabulary.load(path)` of a trained model).
            Defaults to `None`.
        eos_token: str. Appended to every line. Defaults to `"<eos>"`.
        unk_token: str. Defaults to `"<unk>"`.
        min_count, max_size, tokenizer, encoding: as for `load_text`.

    Returns:
        A `Corpus` with `source="directory"`.

    Raises:
        FileNotFoundError: `data_dir` or a split's file does not exist.
        ValueError: a split has no tokens, cannot be decoded, or holds a
            token a given vocabulary lacks when it has no `unk_token`.

    Example:

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for split in ("train", "valid", "test"):
    ...     with open(os.path.join(d, f"ptb.{split}.txt"), "w") as f:
    ...         _ = f.write(" the cat sat \\n the dog \\n")
    >>> corpus = load_corpus(d)
    >>> corpus.vocabulary.to_tokens(corpus.valid[:4])
    ['the', 'cat', 'sat', '<eos>']
    """
    reader.check_level(level)
    if not isinstance(file_pattern, str) or "{split}" not in file_pattern:
        raise ValueError(
            "Expected `file_pattern` to be a file name containing '{split}'. "
            f"Received: file_pattern={file_pattern!r}"
        )
    if isinstance(splits, str) or not splits:
        raise ValueError(
            "Expected `splits` to be a non-empty tuple of split names. "
            f"Received: splits={splits!r}"
        )
    if not os.path.isdir(os.fspath(data_dir)):
        raise FileNotFoundError(
            f"Expected `data_dir` to be a directory. Received: {os.fspath(data_dir)!r}"
        )
    paths = {split: find_split_file(data_dir, split, file_pattern) for split in splits}
    return Corpus.from_files(
        paths, level, vocabulary, min_count=min_count, max_size=max_size,
        tokenizer=tokenizer, encoding=encoding, eos_token=eos_token,
        unk_token=unk_token, source="directory",
    )
