"""Reading language-modelling corpora in the Penn Treebank format.

The format (Mikolov's preprocessing of the Penn Treebank, also used by
WikiText and many others): plain UTF-8 text, one sentence per line, tokens
separated by whitespace. Each line is followed by an end-of-sentence token
`<eos>`. Files may be gzip-compressed (`.gz`).

Two tokenisations:
- `level="word"`: a line's tokens are its whitespace-separated words.
- `level="char"`: a line's tokens are its characters after its words are
  re-joined with single spaces (leading, trailing and repeated whitespace
  is dropped); the space between two words is the token `" "`. So
  `" the cat \\n"` gives `t h e ␣ c a t <eos>`. Multi-character words such as
  `<unk>` are spelled out character by character. (Mikolov's character-level
  PTB files, `ptb.char.*.txt`, which already separate characters by spaces
  and mark word boundaries with `_`, are read with `level="word"`.)
"""

import bisect
import gzip
import os
import zlib

import numpy as np

from keras_mogrifier._validation import one_of
from keras_mogrifier.data.vocabulary import EOS_TOKEN
from keras_mogrifier.data.vocabulary import UNK_TOKEN
from keras_mogrifier.data.vocabulary import Vocabulary

LEVELS = ("word", "char")
SPLITS = ("train", "valid", "test")
SPACE_TOKEN = " "
DEFAULT_FILE_PATTERN = "ptb.{split}.txt"


def tokenize_line(line, level="word"):
    """The tokens of one line of text, without the `<eos>` that follows it.

    Args:
        line: str. One line (a trailing newline is ignored).
        level: str. `"word"` or `"char"` (see the module docstring).

    Returns:
        A list of str.
    """
    one_of("level", level, LEVELS)
    words = line.split()
    if level == "word":
        return words
    return list(SPACE_TOKEN.join(words))


def read_lines(path):
    """The lines of a UTF-8 text file, plain or gzip-compressed (`.gz`).

    Raises:
        FileNotFoundError: if there is no such file.
        ValueError: naming the file, if it cannot be read to its end as
            UTF-8 text (a truncated or corrupt `.gz`, another encoding).
    """
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline=None) as f:
            text = f.read()
    except (EOFError, UnicodeDecodeError, gzip.BadGzipFile, zlib.error) as error:
        kind = "gzip-compressed UTF-8 text" if path.endswith(".gz") else "UTF-8 text"
        raise ValueError(
            f"Expected {path!r} to be a complete file of {kind}. Received: a "
            f"file that cannot be read to its end ({type(error).__name__}: "
            f"{error}); it may be truncated or corrupt: download it again"
        ) from error
    # Only "\n" (after universal-newline translation) ends a line; Unicode
    # line separators inside a sentence are whitespace, as for `str.split`.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _tokenize_lines(lines, level, eos_token):
    """Flat token list (an `<eos>` after every line) and each line's start."""
    tokens = []
    starts = []
    for line in lines:
        starts.append(len(tokens))
        tokens.extend(tokenize_line(line, level))
        tokens.append(eos_token)
    return tokens, starts


def _locator(split, source, starts):
    def where(position):
        line = bisect.bisect_right(starts, position)
        origin = f", {source}" if source else ""
        return f"{split} split{origin}, line {line}"

    return where


class Corpus:
    """A tokenised corpus: token-id arrays per split and their vocabulary.

    Usually made by `load_corpus`, `load_ptb` or `synthetic_corpus`.

    Args:
        splits: dict of str to 1-D int array. The id stream of each split
            (`"train"`, `"valid"`, `"test"`, ...), `<eos>` included.
        vocabulary: `Vocabulary`. Maps the ids to tokens.
        level: str. `"word"` or `"char"`.
        source: str. Where the text came from: `"directory"`, `"download"`,
            `"synthetic"` or `"memory"`.
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

    def __init__(self, splits, vocabulary, level="word", source="memory", paths=None):
        if not isinstance(vocabulary, Vocabulary):
            raise ValueError(
                "Expected `vocabulary` to be a `Vocabulary`. "
                f"Received: vocabulary={vocabulary!r}"
            )
        one_of("level", level, LEVELS)
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
            arrays[name] = ids.astype(np.int32, copy=False)
        self.splits = arrays
        self.vocabulary = vocabulary
        self.level = level
        self.source = source
        self.paths = dict(paths or {})

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
    ):
        """Tokenises lines of text per split into a `Corpus`.

        Every line is followed by `eos_token`. Without `vocabulary`, it is
        built from the `"train"` split (`Vocabulary.build`); tokens of other
        splits that it lacks map to `unk_token` when the vocabulary has it,
        else raise a `ValueError` naming the token, split and line.

        Args:
            lines: dict of str to list of str. The lines of each split.
            level: str. `"word"` or `"char"`. Defaults to `"word"`.
            vocabulary: `Vocabulary` or `None`. A fixed vocabulary (e.g. the
                one a model was trained with). Defaults to `None`.
            eos_token: str. Defaults to `"<eos>"`.
            unk_token: str. Defaults to `"<unk>"`.
            source: str. Stored as `Corpus.source`. Defaults to `"memory"`.
            paths: dict or `None`. Stored as `Corpus.paths`, and used in
                error messages. Defaults to `None`.

        Returns:
            A `Corpus`.
        """
        one_of("level", level, LEVELS)
        if not isinstance(lines, dict) or not lines:
            raise ValueError(
                "Expected `lines` to be a non-empty dict of split name to lines. "
                f"Received: lines={lines!r}"
            )
        if vocabulary is None and "train" not in lines:
            raise ValueError(
                "Expected a 'train' split to build the vocabulary from, or a "
                f"`vocabulary`. Received splits: {sorted(lines)}"
            )
        if vocabulary is not None and not isinstance(vocabulary, Vocabulary):
            raise ValueError(
                "Expected `vocabulary` to be a `Vocabulary` or None. "
                f"Received: vocabulary={vocabulary!r}"
            )
        paths = dict(paths or {})
        tokenized = {}
        for split, split_lines in lines.items():
            if isinstance(split_lines, str):
                raise ValueError(
                    f"Expected the lines of split {split!r} to be a list of "
                    "strings, not one string"
                )
            tokens, starts = _tokenize_lines(split_lines, level, eos_token)
            if all(token == eos_token for token in tokens):
                origin = f" ({paths[split]})" if split in paths else ""
                raise ValueError(
                    f"Expected the {split!r} split{origin} to contain tokens. "
                    f"Received: {len(starts)} line(s) without any token"
                )
            tokenized[split] = (tokens, starts)
        if vocabulary is None:
            vocabulary = Vocabulary.build(
                tokenized["train"][0], eos_token=eos_token, unk_token=unk_token
            )
        elif vocabulary.eos_token != eos_token:
            raise ValueError(
                f"Expected `vocabulary.eos_token` to be {eos_token!r} (the "
                f"`eos_token`). Received: {vocabulary.eos_token!r}"
            )
        ids = {
            split: vocabulary.to_ids(
                tokens, where=_locator(split, paths.get(split), starts)
            )
            for split, (tokens, starts) in tokenized.items()
        }
        return cls(ids, vocabulary, level=level, source=source, paths=paths)

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
):
    """Reads a corpus in the PTB format from a directory.

    Split `s` is read from `file_pattern.format(split=s)` in `data_dir`, or
    from the same name with `.gz` appended (gzip). The vocabulary is built
    from the training split (by count, then lexicographically); tokens of the
    other splits that it lacks map to `unk_token` when the training split has
    it, else raise a `ValueError` naming the token, the file and the line.

    Args:
        data_dir: str or path. The directory of the files.
        level: str. `"word"` or `"char"` (see this module's docstring).
            Defaults to `"word"`.
        file_pattern: str. File name with a `{split}` field. Defaults to
            `"ptb.{split}.txt"`.
        splits: tuple of str. The splits to read. Defaults to
            `("train", "valid", "test")`.
        vocabulary: `Vocabulary` or `None`. Use this vocabulary instead of
            building one (e.g. `Vocabulary.load(path)` of a trained model).
            Defaults to `None`.
        eos_token: str. Appended to every line. Defaults to `"<eos>"`.
        unk_token: str. Defaults to `"<unk>"`.

    Returns:
        A `Corpus` with `source="directory"`.

    Raises:
        FileNotFoundError: `data_dir` or a split's file does not exist.
        ValueError: a split has no tokens, or holds a token the vocabulary
            lacks when it has no `unk_token`.

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
    one_of("level", level, LEVELS)
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
    lines = {split: read_lines(path) for split, path in paths.items()}
    return Corpus.from_lines(
        lines,
        level=level,
        vocabulary=vocabulary,
        eos_token=eos_token,
        unk_token=unk_token,
        source="directory",
        paths=paths,
    )
