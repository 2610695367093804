"""Token ↔ id mapping of a language-modelling corpus, and text ↔ ids."""

import codecs
import collections
import collections.abc
import json
import os

import numpy as np

from keras_mogrifier import _validation

EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
LEVELS = ("word", "char", "byte")
_FORMAT = "keras_mogrifier.Vocabulary"
# Byte level: id b is the byte b, and <eos> (a line end) comes after them.
BYTE_EOS_ID = 256
_NEWLINE = 10


def byte_token(value):
    """The token of byte `value`: printable ASCII as itself, else `<0xNN>`."""
    return chr(value) if 0x20 <= value < 0x7F else f"<0x{value:02X}>"


BYTE_TOKENS = tuple(byte_token(b) for b in range(256))


def infer_level(tokens):
    """The level of a vocabulary given (or saved) without one.

    The byte tokens then `<eos>` are the byte level; character-level
    vocabularies hold the space token `" "`, which no word-level one can
    (words never contain whitespace).
    """
    tokens = tuple(tokens)
    if tokens[:256] == BYTE_TOKENS and len(tokens) == 257:
        return "byte"
    return "char" if " " in tokens else "word"


# === Tokenizers ===
#
# A tokenizer is the user's code, called once per line: what it returns,
# or raises, is reported with the tokenizer's name and the line it was
# given (the readers check each line's result; the strings in it a chunk of
# lines at a time).


def tokenizer_name(tokenizer):
    """How an error message names a tokenizer: its qualified name, else its type."""
    name = getattr(tokenizer, "__qualname__", None) or getattr(tokenizer, "__name__", None)
    return name if isinstance(name, str) else type(tokenizer).__name__


def _expected_tokens(tokenizer, number, where):
    return (
        f"Expected `tokenizer` ({tokenizer_name(tokenizer)}) to return an "
        f"iterable of non-empty strings (e.g. a list) for line {number} of {where}"
    )


def call_tokenizer(tokenizer, line, number, where):
    """`tokenizer(line)` as a list, or a `ValueError` naming the tokenizer,
    the line's `number` and `where` it comes from (a file, a split).

    The tokenizer may return a list, a tuple, a generator: any iterable but
    a string or bytes (a string given back is almost always a mistake, such
    as `str.lower`). An exception it raises is chained (`from`). The
    strings in the result are checked apart (`first_bad_token`): the
    readers check them for a chunk of lines at once.
    """
    try:
        tokens = tokenizer(line)
    except Exception as error:
        raise tokenizer_error(tokenizer, line, number, where, error) from error
    return token_list(tokens, tokenizer, line, number, where)


def token_list(tokens, tokenizer, line, number, where):
    """What `tokenizer` returned for `line`, as a list (see `call_tokenizer`)."""
    if isinstance(tokens, list):
        return tokens
    if (
        tokens is None
        or isinstance(tokens, (str, bytes, bytearray))
        or not isinstance(tokens, collections.abc.Iterable)
    ):
        raise ValueError(
            f"{_expected_tokens(tokenizer, number, where)}. Received: "
            f"{type(tokens).__name__} {_short(tokens)} (the line: {line[:80]!r})"
        )
    try:
        return list(tokens)
    except Exception as error:  # a generator that raises
        raise tokenizer_error(tokenizer, line, number, where, error) from error


def tokenizer_error(tokenizer, line, number, where, error):
    """The `ValueError` for an exception raised by `tokenizer` (to chain it to)."""
    return ValueError(
        f"{_expected_tokens(tokenizer, number, where)}. Received: "
        f"{type(error).__name__}: {error} (the line: {line[:80]!r})"
    )


def first_bad_token(tokens):
    """The position of the first token that is not a non-empty str, or `None`."""
    return next(
        (i for i, t in enumerate(tokens) if not isinstance(t, str) or not t), None
    )


def bad_token_error(tokenizer, token, number, where):
    return ValueError(
        f"{_expected_tokens(tokenizer, number, where)}. Received: {_short(token)} "
        f"({type(token).__name__}) among its tokens"
    )


def _short(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_token_name(name, value):
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"Expected `{name}` to be a non-empty string. Received: {name}={value!r}"
        )
    return value


class Vocabulary:
    """An ordered, immutable token ↔ id mapping.

    Token `k` of `tokens` gets id `k`. `Vocabulary.build` creates one from
    the tokens of a training split in a deterministic order: by decreasing
    count, ties broken by the tokens' lexicographic (Unicode code point)
    order — the order of the classic Penn Treebank readers, which gives the
    same ids on every machine and Python version.

    The end-of-sentence token (`<eos>`) is always part of the vocabulary.
    If the unknown-word token (`<unk>`) is part of it, `to_ids` maps tokens
    the vocabulary lacks to it; otherwise it raises a `ValueError` naming
    the token and where it occurred.

    The vocabulary knows the level of its tokens (`level`): `"word"`,
    `"char"` or `"byte"`, and so reads and writes text: `encode(text)` gives
    the ids of a string, `decode(ids)` the string of ids (see `encode`).
    A byte-level vocabulary is always `Vocabulary.bytes()`: id `b` is the
    byte `b` (its token is the character for printable ASCII, else
    `"<0xNN>"`), and `<eos>` (id 256) is the line end.

    Args:
        tokens: iterable of str. The tokens, in id order, without duplicates.
        eos_token: str. The end-of-sentence token; must be in `tokens`.
            Defaults to `"<eos>"`.
        unk_token: str. The token unknown tokens map to, when it is in
            `tokens` (when it is not, unknown tokens are an error). Defaults
            to `"<unk>"`.
        level: str or `None`. `"word"`, `"char"` or `"byte"`. Defaults to
            `None`: `"char"` when `tokens` hold the space token `" "` (which
            no word can be), else `"word"`.
        encoding: str. The text encoding of a byte-level vocabulary (how
            `encode` turns a string into bytes and `decode` bytes into a
            string). Defaults to `"utf-8"`.
        tokenizer: callable or `None`. Word level: how `encode` splits a
            line into tokens (the one the corpus was read with): a line →
            an iterable of non-empty str, as for `load_text`. It is not
            saved: a reloaded vocabulary splits on whitespace unless given
            one again (`vocabulary.tokenizer = fn`). Defaults to `None`
            (whitespace).

    Example:

    >>> vocab = Vocabulary.build("a b a <eos> c a <eos>".split())
    >>> vocab.tokens
    ['a', '<eos>', 'b', 'c']
    >>> vocab.to_ids(["c", "a"]).tolist()
    [3, 0]
    >>> vocab.to_tokens([2, 1])
    ['b', '<eos>']
    >>> vocab.decode(vocab.encode("c a\\nb"))
    'c a <eos> b'
    >>> Vocabulary.bytes().decode(Vocabulary.bytes().encode("naïve"))
    'naïve'
    """

    def __init__(
        self,
        tokens,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        level=None,
        encoding="utf-8",
        tokenizer=None,
    ):
        _check_token_name("eos_token", eos_token)
        _check_token_name("unk_token", unk_token)
        if isinstance(tokens, str):
            raise ValueError(
                "Expected `tokens` to be a sequence of strings, not one string. "
                f"Received: tokens={tokens[:50]!r}"
            )
        tokens = list(tokens)
        if level is None:
            level = infer_level(tokens)
        if level not in LEVELS:
            raise ValueError(
                f"Expected `level` to be one of {list(LEVELS)}. Received: level={level!r}"
            )
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise ValueError(
                "Expected `encoding` to be a text encoding Python knows (e.g. "
                f"'utf-8'). Received: encoding={encoding!r}"
            ) from None
        if tokenizer is not None and not callable(tokenizer):
            raise ValueError(
                "Expected `tokenizer` to be a callable (a line → its tokens) or "
                f"None. Received: tokenizer={tokenizer!r}"
            )
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise ValueError(
                    "Expected every token to be a non-empty string. "
                    f"Received: {token!r}"
                )
        index = {}
        for i, token in enumerate(tokens):
            if token in index:
                raise ValueError(
                    "Expected `tokens` without duplicates. Received: "
                    f"{token!r} at ids {index[token]} and {i}"
                )
            index[token] = i
        if eos_token not in index:
            raise ValueError(
                f"Expected the end-of-sentence token {eos_token!r} among "
                f"`tokens`. Received {len(tokens)} tokens without it"
            )
        if level == "byte" and (
            tuple(tokens) != BYTE_TOKENS + (eos_token,) or unk_token in index
        ):
            raise ValueError(
                "Expected a byte-level vocabulary to be the 256 byte tokens "
                "and the end-of-sentence token, in that order "
                f"(`Vocabulary.bytes()`). Received {len(tokens)} tokens: "
                f"{tokens[:5]!r}..."
            )
        if level == "char":
            long = [t for t in tokens if len(t) != 1 and t not in (eos_token, unk_token)]
            if long:
                raise ValueError(
                    "Expected a character-level vocabulary to hold single "
                    f"characters (and {eos_token!r}, {unk_token!r}). Received "
                    f"longer tokens: {long[:5]!r}"
                )
        self._tokens = tokens
        self._index = index
        self.eos_token = eos_token
        self.unk_token = unk_token
        self.level = level
        self.encoding = encoding
        self.tokenizer = tokenizer

    @classmethod
    def bytes(cls, encoding="utf-8", eos_token=EOS_TOKEN):
        """The byte-level vocabulary: the 256 byte values, then `<eos>`.

        Args:
            encoding: str. How `encode` / `decode` turn strings into bytes and
                back. Defaults to `"utf-8"`.
            eos_token: str. Defaults to `"<eos>"`.

        Returns:
            A `Vocabulary` with `level="byte"`.
        """
        return cls(
            BYTE_TOKENS + (eos_token,), eos_token=eos_token, level="byte",
            encoding=encoding,
        )

    @classmethod
    def build(cls, tokens, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN, level=None):
        """Builds the vocabulary of a token stream (e.g. a training split).

        Ids follow decreasing count, then lexicographic order. `eos_token` is
        added (last) when the stream lacks it. (The corpus readers build
        theirs with `min_count` and `max_size` as well: see
        `keras_mogrifier.data.load_text`.)

        Args:
            tokens: iterable of str. The training tokens.
            eos_token: str. Defaults to `"<eos>"`.
            unk_token: str. Defaults to `"<unk>"`.
            level: str or `None`. `"word"` or `"char"`. Defaults to `None`
                (inferred, as in the constructor).

        Returns:
            A `Vocabulary`.
        """
        _check_token_name("eos_token", eos_token)
        if isinstance(tokens, str):
            raise ValueError(
                "Expected `tokens` to be a sequence of strings, not one string. "
                f"Received: tokens={tokens[:50]!r}"
            )
        counts = collections.Counter(tokens)
        ordered = [
            token for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        if eos_token not in counts:
            ordered.append(eos_token)
        return cls(ordered, eos_token=eos_token, unk_token=unk_token, level=level)

    @property
    def tokens(self):
        """The tokens in id order (a copy)."""
        return list(self._tokens)

    @property
    def eos_id(self):
        """Id of the end-of-sentence token."""
        return self._index[self.eos_token]

    @property
    def unk_id(self):
        """Id of the unknown-word token, or `None` when it is not in the vocabulary."""
        return self._index.get(self.unk_token)

    def __len__(self):
        return len(self._tokens)

    def __contains__(self, token):
        return token in self._index

    def __iter__(self):
        return iter(self._tokens)

    def __eq__(self, other):
        return (
            isinstance(other, Vocabulary)
            and self._tokens == other._tokens
            and self.eos_token == other.eos_token
            and self.unk_token == other.unk_token
            and self.level == other.level
            and self.encoding == other.encoding
        )

    def __hash__(self):
        return hash((tuple(self._tokens), self.eos_token, self.unk_token, self.level))

    def __repr__(self):
        head = ", ".join(repr(t) for t in self._tokens[:5])
        more = ", ..." if len(self) > 5 else ""
        return f"Vocabulary(level={self.level!r}, size={len(self)}, tokens=[{head}{more}])"

    def token_to_id(self, token):
        """The id of one token (the `<unk>` id for an unknown token, if any)."""
        return int(self.to_ids([token])[0])

    def id_to_token(self, token_id):
        """The token of one id."""
        return self.to_tokens([token_id])[0]

    def to_ids(self, tokens, where=None):
        """Maps tokens to ids.

        Args:
            tokens: iterable of str.
            where: str, callable or `None`. Where the tokens come from, for
                the error message: a description such as `"valid split"`, or
                a function from a token's position to such a description.
                Defaults to `None`.

        Returns:
            An int32 NumPy array of ids.

        Raises:
            ValueError: a token is not in the vocabulary and the vocabulary
                has no `unk_token`.
        """
        if isinstance(tokens, str):
            raise ValueError(
                "Expected `tokens` to be a sequence of strings, not one string. "
                f"Received: tokens={tokens[:50]!r}"
            )
        if not isinstance(tokens, (list, tuple)):
            tokens = list(tokens)
        index = self._index
        unk = self.unk_id
        if unk is None:
            try:
                ids = [index[token] for token in tokens]
            except KeyError:
                self._raise_unknown(tokens, where)
        else:
            ids = [index.get(token, unk) for token in tokens]
        return np.asarray(ids, dtype=np.int32)

    def _raise_unknown(self, tokens, where):
        position, token = next(
            (i, t) for i, t in enumerate(tokens) if t not in self._index
        )
        if callable(where):
            location = where(position)
        else:
            location = f"position {position}" + (f" of {where}" if where else "")
        missing = sorted({t for t in tokens if t not in self._index})
        raise ValueError(
            f"Token {token!r} ({location}) is not in the vocabulary of "
            f"{len(self)} tokens, which has no {self.unk_token!r} token to map "
            f"it to. {len(missing)} distinct unknown token(s): "
            f"{missing[:10]!r}{' ...' if len(missing) > 10 else ''}"
        )

    def to_tokens(self, ids):
        """Maps ids back to tokens.

        Args:
            ids: ids in `[0, len(self))` of an integer dtype (not bool), of
                any shape (read in row-major order): a NumPy array, a
                tensor, a list or any iterable of int. An empty list or
                tuple is no ids.

        Returns:
            A list of str.

        Raises:
            ValueError: `ids` is not integer ids (strings, floats, bools,
                `None`, ragged lists: the message gives the dtype and the
                first value), or an id is out of range (the message gives
                the first one and its position).
        """
        ids = self._check_ids(ids)
        tokens = self._tokens
        return [tokens[i] for i in ids.reshape(-1).tolist()]

    def _check_ids(self, ids):
        if ids is None or isinstance(ids, (str, bytes, bytearray)):
            raise ValueError(
                f"Expected `ids` to be an array of integer token ids in [0, "
                f"{len(self)}) (`encode` reads text). Received: ids={_short(ids)}"
            )
        if isinstance(ids, collections.abc.Iterator):
            ids = list(ids)
        if isinstance(ids, (list, tuple)) and not ids:
            return np.zeros(0, np.int32)  # not NumPy's float64 of an empty list
        return _validation.token_ids("ids", ids, len(self))

    # === Text ===

    def encode(self, text, where=None):
        """The int32 ids of `text`, read the way the corpus readers read it.

        Lines (separated by `"\\n"`) are separated by `<eos>` (none after the
        last line: a prompt continues where it stops). Word level: each
        line's tokens are `tokenizer(line)` (whitespace-separated words
        without a tokenizer; `<eos>` may also be written out). Char level:
        each line's characters, its words re-joined by single spaces. Byte
        level: the bytes of `text` in `encoding` (or `text` itself, given
        bytes), with each newline byte as `<eos>`. Tokens the vocabulary
        lacks become `<unk>`, or without one raise a `ValueError` naming
        the token and `where`.

        Args:
            text: str (bytes also at byte level).
            where: str or `None`. What the text is, for error messages (e.g.
                `"prompt 1"`). Defaults to `None`.

        Returns:
            An int32 NumPy array.

        Raises:
            ValueError: `text` is not a string (or bytes at byte level); a
                token the vocabulary lacks when it has no `<unk>`; at byte
                level, a character `encoding` cannot write (the first, with
                its position); the tokenizer raises or returns something
                other than an iterable of non-empty strings (the message
                names it and the line, as `load_text`'s does).
        """
        if self.level == "byte":
            if isinstance(text, str):
                data = self._text_bytes(text, where)
            elif isinstance(text, (bytes, bytearray)):
                data = bytes(text)
            else:
                raise ValueError(
                    "Expected `text` to be a string or bytes. Received: "
                    f"text of type {type(text).__name__}"
                )
            ids = np.frombuffer(data, np.uint8).astype(np.int32)
            ids[ids == _NEWLINE] = BYTE_EOS_ID
            return ids
        if not isinstance(text, str):
            raise ValueError(
                f"Expected `text` to be a string. Received: text of type {type(text).__name__}"
            )
        tokens = []
        for i, line in enumerate(text.split("\n")):
            if i:
                tokens.append(self.eos_token)
            if self.level == "char":
                tokens.extend(" ".join(line.split()))
            elif self.tokenizer is None:
                tokens.extend(line.split())
            else:
                line_tokens = call_tokenizer(self.tokenizer, line, i + 1, where or "the text")
                bad = first_bad_token(line_tokens)
                if bad is not None:
                    raise bad_token_error(
                        self.tokenizer, line_tokens[bad], i + 1, where or "the text"
                    )
                tokens.extend(line_tokens)
        return self.to_ids(tokens, where=where)

    def _text_bytes(self, text, where):
        try:
            return text.encode(self.encoding)
        except UnicodeEncodeError as error:
            at = f" ({where})" if where else ""
            raise ValueError(
                f"Expected `text`{at} to be text the vocabulary's encoding "
                f"{self.encoding!r} can write. Received: {text[error.start]!r} "
                f"at position {error.start} ({error.reason})"
            ) from None

    def decode(self, ids):
        """The text of `ids`: the inverse of `encode`.

        Word level: tokens joined by spaces (`<eos>` stays visible, as in
        the corpora). Char level: characters joined, `<eos>` as a newline.
        Byte level: the bytes, `<eos>` as a newline, decoded from
        `encoding` (a byte sequence that is not valid there, as a sampled
        one may be, shows as U+FFFD). `decode(encode(text)) == text` for
        byte-level text and for char- and word-level text written the way
        they read it (single spaces, no spaces at line ends).

        Args:
            ids: ids in `[0, len(self))`, as for `to_tokens`.

        Returns:
            A str.

        Raises:
            ValueError: as `to_tokens`: what was expected, what was
                received, and the first id (and its position) it could not
                take, e.g. for `decode(["the", "cat"])`: "Expected `ids` to
                hold integer token ids. Received: ids.dtype=<U3, e.g.
                'the' at position (0,)".
        """
        if self.level == "byte":
            values = np.asarray(self._check_ids(ids)).reshape(-1).astype(np.int64)
            values[values == BYTE_EOS_ID] = _NEWLINE
            return values.astype(np.uint8).tobytes().decode(self.encoding, errors="replace")
        tokens = self.to_tokens(ids)
        if self.level == "word":
            return " ".join(tokens)
        return "".join("\n" if t == self.eos_token else t for t in tokens)

    # === Saving ===

    def get_config(self):
        """A JSON-serialisable dict from which `from_config` rebuilds it.

        The tokenizer is not part of it (a callable is not data).
        """
        config = {
            "tokens": list(self._tokens),
            "eos_token": self.eos_token,
            "unk_token": self.unk_token,
            "level": self.level,
        }
        if self.level == "byte":
            config["encoding"] = self.encoding
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "level" not in config:  # saved before vocabularies had a level
            config["level"] = infer_level(config.get("tokens", ()))
        return cls(**config)

    def save(self, path):
        """Writes the vocabulary to a JSON file."""
        data = {"format": _FORMAT, "version": 2, **self.get_config()}
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=0)

    @classmethod
    def load(cls, path):
        """Reads a vocabulary written by `save`.

        Raises:
            FileNotFoundError: if there is no such file.
            ValueError: naming the file, if it is not a complete vocabulary
                JSON file (truncated, not JSON, not written by `save`).
        """
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(
                "Expected a complete vocabulary JSON file written by "
                f"`Vocabulary.save`. Received: {path!r}, which is not valid "
                f"JSON ({error}); it may be truncated: save it again"
            ) from error
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(
                f"Expected a vocabulary JSON file written by `Vocabulary.save`. "
                f"Received: {path!r} without the format tag {_FORMAT!r}"
            )
        missing = [k for k in ("tokens", "eos_token", "unk_token") if k not in data]
        if missing:
            raise ValueError(
                f"Expected a vocabulary JSON file written by `Vocabulary.save`. "
                f"Received: {path!r} without the entries {missing}"
            )
        config = {k: data[k] for k in ("tokens", "eos_token", "unk_token", "level", "encoding") if k in data}
        try:
            return cls.from_config(config)
        except ValueError as error:
            raise ValueError(f"In the vocabulary file {path!r}: {error}") from error
