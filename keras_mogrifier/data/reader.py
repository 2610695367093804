"""The one reader behind every corpus loader: text → token-id arrays.

`load_text`, `load_corpus`, `load_ptb`, `load_wikitext2`, `load_enwik8`,
`load_text8` and `Corpus.from_lines` all come through here. Three levels:

- `"word"`: a line's tokens are `tokenizer(line)` (default: its
  whitespace-separated words), each line followed by `<eos>`.
- `"char"`: a line's tokens are its characters after its words are
  re-joined with single spaces (leading, trailing and repeated whitespace is
  dropped); the space between two words is the token `" "`; each line is
  followed by `<eos>`. So `" the cat \\n"` gives `t h e ␣ c a t <eos>`.
- `"byte"`: the file's bytes, with the newline byte read as `<eos>` (so a
  byte-level stream has exactly as many tokens as the file has bytes, and
  any file reads: no decoding, no `<unk>`). The vocabulary is always the 256
  byte values and `<eos>` (`Vocabulary.bytes`).

Only `"\\n"` ends a line (`"\\r\\n"` and `"\\r"` are translated first, at
word and char level). The text is never held as a Python list of tokens:
characters and bytes go straight into NumPy arrays, and words are read a
chunk of lines at a time into int32 codes; the vocabulary and the final ids
come from array operations on those codes (see `benchmarks/read_text.py`).
"""

import bisect
import gzip
import os
import re
import zlib

import numpy as np

from keras_mogrifier._validation import one_of
from keras_mogrifier.data import vocabulary as vocabulary_lib
from keras_mogrifier.data.vocabulary import BYTE_EOS_ID
from keras_mogrifier.data.vocabulary import EOS_TOKEN
from keras_mogrifier.data.vocabulary import UNK_TOKEN
from keras_mogrifier.data.vocabulary import Vocabulary

LEVELS = ("word", "char", "byte")
SPACE_TOKEN = " "
_NEWLINE = 10
_WORD_CHUNK_CHARACTERS = 4_000_000
# Whitespace other than the newline, as `str.split` sees it (`\s` of a str
# pattern is `str.isspace`).
_SPACES = re.compile(r"[^\S\n]+")
_SPACES_AT_LINE_ENDS = re.compile(r" ?\n ?")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_level(level):
    return one_of("level", level, LEVELS)


# === Files ===


def read_bytes(path):
    """The bytes of a file, plain or gzip-compressed (`.gz`).

    Raises:
        FileNotFoundError: if there is no such file.
        ValueError: naming the file, for a truncated or corrupt `.gz`.
    """
    path = os.fspath(path)
    if not path.endswith(".gz"):
        with open(path, "rb") as f:
            return f.read()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ValueError(
            f"Expected {path!r} to be a complete gzip-compressed file. "
            f"Received: a file that cannot be read to its end "
            f"({type(error).__name__}: {error}); it may be truncated or "
            "corrupt: download it again"
        ) from error


def decode_text(data, path, encoding="utf-8"):
    """`data` (bytes of `path`) as text with `"\\n"` line ends.

    Raises:
        ValueError: naming the file and the first undecodable byte, and
            suggesting `encoding=` or `level="byte"`.
    """
    try:
        text = data.decode(encoding)
    except LookupError as error:
        raise ValueError(
            f"Expected `encoding` to be a text encoding Python knows (e.g. "
            f"'utf-8', 'latin-1'). Received: encoding={encoding!r}"
        ) from error
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"Expected {os.fspath(path)!r} to be text in the encoding "
            f"{encoding!r}. Received: bytes that are not (at byte "
            f"{error.start}, line {line}: {error.reason}). Pass the file's "
            "encoding (`encoding='latin-1'`, say), or read it with "
            "`level='byte'`, which reads any file"
        ) from None
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_lines(path, encoding="utf-8"):
    """The lines of a text file, plain or gzip-compressed (`.gz`).

    Only `"\\n"` ends a line (after `"\\r\\n"` and `"\\r"` are translated);
    a last line without one counts.

    Raises:
        FileNotFoundError: if there is no such file.
        ValueError: naming the file, if it cannot be read to its end in
            `encoding` (a truncated or corrupt `.gz`, another encoding).
    """
    text = decode_text(read_bytes(path), path, encoding)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


# === Text → codes (a per-corpus code space, before the vocabulary) ===


class SymbolTable:
    """Codes of the symbols of one corpus, shared by its splits.

    Byte level: code = byte value, `<eos>` = 256. Char level: code = code
    point, `"\\n"` = `<eos>`. Word level: codes in order of first
    appearance, `<eos>` = 0.
    """

    def __init__(self, level, tokenizer=None, eos_token=EOS_TOKEN):
        self.level = check_level(level)
        self.tokenizer = tokenizer
        self.eos_token = eos_token
        self.words = {eos_token: 0} if level == "word" else None

    @property
    def eos_code(self):
        return {"word": 0, "char": _NEWLINE, "byte": BYTE_EOS_ID}[self.level]

    def size(self, *codes):
        if self.level == "word":
            return len(self.words)
        if self.level == "byte":
            return BYTE_EOS_ID + 1
        top = max((int(c.max()) for c in codes if c.size), default=_NEWLINE)
        return max(top, _NEWLINE) + 1

    def token(self, code):
        if self.level == "word":
            return self._word_list()[code]
        if code == self.eos_code:
            return self.eos_token
        return chr(code)

    def _word_list(self):
        if len(getattr(self, "_list", ())) != len(self.words):
            self._list = list(self.words)
        return self._list

    def codes(self, source, where=None):
        """The int32 codes of `source`: bytes (byte level) or text.

        `where` names the text (a file, a split) in the errors of a
        tokenizer, with the line.
        """
        if self.level == "byte":
            codes = np.frombuffer(source, np.uint8).astype(np.int32)
            codes[codes == _NEWLINE] = BYTE_EOS_ID
            return codes
        if self.level == "char":
            return _char_codes(source, where or "the text")
        return self._word_codes(source, where or "the text")

    def _word_codes(self, text, where):
        # A chunk of whole lines at a time: the token list of one chunk is
        # the only Python list, and everything per token runs in C (split,
        # set difference, dict lookups through `map`). A tokenizer's result
        # is checked per line (an iterable, not a string), its strings per
        # chunk (only the new ones, unless one is bad).
        eos = self.eos_token
        words = self.words
        plain = self.tokenizer is None and len(eos.split()) == 1
        tokenize = self.tokenizer or str.split
        chunks = []
        first_line = 1
        for chunk in _line_chunks(text, _WORD_CHUNK_CHARACTERS):
            ends = []  # token count after each line of the chunk, its <eos> included
            if plain:
                tokens = chunk.replace("\n", f" {eos} ").split()
            else:
                tokens = []
                for number, line in enumerate(chunk.split("\n")[:-1], first_line):
                    # `vocabulary_lib.call_tokenizer`, written out: one call
                    # less per line on the usual path (a list).
                    # (A bad string on an earlier line is the first error.)
                    try:
                        line_tokens = tokenize(line)
                    except Exception as error:
                        self._check_tokens(tokens, ends, first_line, where)
                        raise vocabulary_lib.tokenizer_error(
                            tokenize, line, number, where, error
                        ) from error
                    if line_tokens.__class__ is not list:
                        try:
                            line_tokens = vocabulary_lib.token_list(
                                line_tokens, tokenize, line, number, where
                            )
                        except ValueError:
                            self._check_tokens(tokens, ends, first_line, where)
                            raise
                    tokens += line_tokens
                    tokens.append(eos)
                    ends.append(len(tokens))
            try:
                new = set(tokens).difference(words)
            except TypeError:  # an unhashable token from a tokenizer
                new = None
            if new is None or vocabulary_lib.first_bad_token(new) is not None:
                self._check_tokens(tokens, ends, first_line, where)
            for token in sorted(new):
                words[token] = len(words)
            chunks.append(
                np.fromiter(map(words.__getitem__, tokens), np.int32, len(tokens))
            )
            first_line += len(ends)
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int32)

    def _check_tokens(self, tokens, ends, first_line, where):
        """A ValueError naming the line of the first token that is not a non-empty str."""
        position = vocabulary_lib.first_bad_token(tokens)
        if position is not None:
            line = first_line + bisect.bisect_right(ends, position)
            raise vocabulary_lib.bad_token_error(
                self.tokenizer, tokens[position], line, where
            )


def _line_chunks(text, size):
    """Pieces of about `size` characters of `text`, each ending with a `"\n"`."""
    if text and not text.endswith("\n"):
        text += "\n"  # a last line without "\n" still ends with <eos>
    start = 0
    while start < len(text):
        end = text.find("\n", min(start + size, len(text) - 1)) + 1
        yield text[start:end]
        start = end


def code_points(text):
    """The code points of `text` as int32, through bytes (no object per character)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int32)
    return np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.int32)


def _char_codes(text, where):
    """Code points of the char-level text: words re-joined by single spaces."""
    original = text
    if text and not text.endswith("\n"):
        # A last line without "\n" still ends with <eos>, even a blank one:
        # added before the spaces go, which would take the line with them.
        text += "\n"
    text = _SPACES.sub(" ", text)
    text = _SPACES_AT_LINE_ENDS.sub("\n", text)
    if text.startswith(" "):
        text = text[1:]
    try:
        return code_points(text)
    except UnicodeEncodeError:
        # Only a lone surrogate (half of a UTF-16 pair) has no code in UTF-32.
        position = _SURROGATE.search(original).start()
        line = original.count("\n", 0, position) + 1
        raise ValueError(
            f"Expected {where} to be text of whole characters. Received: a "
            f"lone surrogate {original[position]!r} (half of a UTF-16 pair, "
            f"which no encoding writes) at character {position}, line {line}"
        ) from None


def tokenize_line(line, level="word"):
    """The tokens of one line of text, without the `<eos>` that follows it.

    Args:
        line: str. One line (a trailing newline is ignored).
        level: str. `"word"` or `"char"` (see this module's docstring).

    Returns:
        A list of str.
    """
    one_of("level", level, ("word", "char"))
    words = line.split()
    if level == "word":
        return words
    return list(SPACE_TOKEN.join(words))


# === Codes → vocabulary and ids ===


def build_vocabulary(table, train_codes, min_count=1, max_size=None, unk_token=UNK_TOKEN):
    """The vocabulary of the training codes, and the codes it drops.

    Tokens are ordered by decreasing count, ties in code point order of
    the token (`Vocabulary.build`'s order). Tokens seen fewer than
    `min_count` times, or beyond the `max_size` most frequent (`<eos>` and
    `unk_token` not counted), are dropped: they map to `unk_token`, which
    then takes their summed count.
    """
    if table.level == "byte":
        return Vocabulary.bytes(), False
    counts = np.bincount(train_codes, minlength=table.size(train_codes))
    present = np.flatnonzero(counts)
    tokens = [table.token(c) for c in present.tolist()]
    present_counts = counts[present].tolist()
    order = sorted(range(len(present)), key=lambda i: (-present_counts[i], tokens[i]))
    kept, regular, dropped_count, unk_count = [], 0, 0, 0
    for i in order:
        token, count = tokens[i], present_counts[i]
        if token == unk_token:
            unk_count += count
        elif token == table.eos_token:
            kept.append((token, count))
        elif count < min_count or (max_size is not None and regular >= max_size):
            dropped_count += count
        else:
            kept.append((token, count))
            regular += 1
    unk_count += dropped_count
    if unk_count:
        kept.append((unk_token, unk_count))
        kept.sort(key=lambda kv: (-kv[1], kv[0]))
    ordered = [token for token, _ in kept]
    if table.eos_token not in ordered:
        ordered.append(table.eos_token)
    vocabulary = Vocabulary(
        ordered, eos_token=table.eos_token, unk_token=unk_token, level=table.level
    )
    return vocabulary, dropped_count > 0


def lookup_table(table, vocabulary, size):
    """int32 array: code → id in `vocabulary`, -1 where it lacks the token."""
    lut = np.full(size, -1, np.int32)
    if table.level == "word":
        index = {token: i for i, token in enumerate(vocabulary.tokens)}
        for token, code in table.words.items():
            if code < size:
                lut[code] = index.get(token, -1)
    elif table.level == "byte":
        lut[: BYTE_EOS_ID + 1] = np.arange(BYTE_EOS_ID + 1)
    else:
        for i, token in enumerate(vocabulary.tokens):
            if token == vocabulary.eos_token:
                lut[_NEWLINE] = i
            elif len(token) == 1 and ord(token) < size:
                lut[ord(token)] = i
    return lut


def to_ids(codes, lut, vocabulary, table, where):
    """`lut[codes]`, unknown codes as `<unk>`; without one, a ValueError.

    `where` names the split and file in the error, which also gives the
    line of the first unknown token.
    """
    if table.level == "byte":
        return codes  # byte codes are the ids
    ids = lut[codes]
    unknown = ids < 0
    if not unknown.any():
        return ids
    unk = vocabulary.unk_id
    if unk is not None:
        ids[unknown] = unk
        return ids
    position = int(np.flatnonzero(unknown)[0])
    line = int(np.count_nonzero(codes[:position] == table.eos_code)) + 1
    missing = sorted({table.token(int(c)) for c in np.unique(codes[unknown])})
    raise ValueError(
        f"Token {table.token(int(codes[position]))!r} ({where}, line {line}) is "
        f"not in the vocabulary of {len(vocabulary)} tokens, which has no "
        f"{vocabulary.unk_token!r} token to map it to. {len(missing)} distinct "
        f"unknown token(s): {missing[:10]!r}{' ...' if len(missing) > 10 else ''}"
    )


def encode_codes(
    table,
    codes,
    *,
    vocabulary=None,
    min_count=1,
    max_size=None,
    unk_token=UNK_TOKEN,
    paths=None,
    empty=None,
):
    """Token ids of every split (given as codes of `table`) and their vocabulary.

    Args:
        table: the `SymbolTable` the codes come from.
        codes: dict of split name to its int32 codes.
        vocabulary: a fixed `Vocabulary`, or `None` to build one from the
            `"train"` split (`min_count`, `max_size`; `unk_token` added when
            a token is dropped or a token of another split is unseen).
        paths: dict of split name to file, for error messages.
        empty: dict of split name to what an empty split was (e.g. "an
            empty file"), for error messages.

    Returns:
        `(ids, vocabulary)`: a dict of int32 arrays, and the vocabulary.
    """
    paths = dict(paths or {})
    for split, split_codes in codes.items():
        if not np.any(split_codes != table.eos_code):
            origin = f" ({paths[split]})" if split in paths else ""
            lines = int(np.count_nonzero(split_codes == table.eos_code))
            what = (empty or {}).get(split) if not split_codes.size else None
            raise ValueError(
                f"Expected the {split!r} split{origin} to contain tokens. "
                f"Received: {what or f'{lines} line(s) without any token'}"
            )
    size = table.size(*codes.values())
    level = table.level
    if vocabulary is None:
        vocabulary, _ = build_vocabulary(
            table, codes["train"], min_count, max_size, unk_token
        )
        lut = lookup_table(table, vocabulary, size)
        if level != "byte" and vocabulary.unk_id is None and any(
            np.any(lut[c] < 0) for c in codes.values()
        ):
            # Tokens of valid / test unseen in training: add <unk> for them.
            vocabulary = Vocabulary(
                vocabulary.tokens + [unk_token], eos_token=table.eos_token,
                unk_token=unk_token, level=level,
            )
            lut = lookup_table(table, vocabulary, size)
    else:
        if vocabulary.level != level:
            raise ValueError(
                f"Expected a vocabulary of level {level!r} (the `level`). "
                f"Received: a vocabulary of level {vocabulary.level!r}"
            )
        if vocabulary.eos_token != table.eos_token:
            raise ValueError(
                f"Expected `vocabulary.eos_token` to be {table.eos_token!r} (the "
                f"`eos_token`). Received: {vocabulary.eos_token!r}"
            )
        lut = lookup_table(table, vocabulary, size)
    ids = {}
    for split, split_codes in codes.items():
        origin = f", {paths[split]}" if split in paths else ""
        ids[split] = to_ids(split_codes, lut, vocabulary, table, f"{split} split{origin}")
    if table.tokenizer is not None:
        vocabulary.tokenizer = table.tokenizer
    return ids, vocabulary


def line_ends(ids, eos_id):
    """Positions just after each `<eos>` of `ids` (the starts of the next lines)."""
    return np.flatnonzero(ids == eos_id) + 1


def nearest_boundary(boundaries, target):
    """The element of the sorted `boundaries` nearest to `target`."""
    k = bisect.bisect_left(boundaries, target)
    candidates = [boundaries[i] for i in (k - 1, k) if 0 <= i < len(boundaries)]
    return min(candidates, key=lambda b: (abs(b - target), b)) if candidates else 0
