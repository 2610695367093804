"""Token ↔ id mapping of a language-modelling corpus."""

import collections
import json
import os

import numpy as np

EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
_FORMAT = "keras_mogrifier.Vocabulary"


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

    Args:
        tokens: iterable of str. The tokens, in id order, without duplicates.
        eos_token: str. The end-of-sentence token; must be in `tokens`.
            Defaults to `"<eos>"`.
        unk_token: str. The token unknown tokens map to, when it is in
            `tokens` (when it is not, unknown tokens are an error). Defaults
            to `"<unk>"`.

    Example:

    >>> vocab = Vocabulary.build("a b a <eos> c a <eos>".split())
    >>> vocab.tokens
    ['a', '<eos>', 'b', 'c']
    >>> vocab.to_ids(["c", "a"]).tolist()
    [3, 0]
    >>> vocab.to_tokens([2, 1])
    ['b', '<eos>']
    """

    def __init__(self, tokens, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN):
        _check_token_name("eos_token", eos_token)
        _check_token_name("unk_token", unk_token)
        if isinstance(tokens, str):
            raise ValueError(
                "Expected `tokens` to be a sequence of strings, not one string. "
                f"Received: tokens={tokens[:50]!r}"
            )
        tokens = list(tokens)
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
        self._tokens = tokens
        self._index = index
        self.eos_token = eos_token
        self.unk_token = unk_token

    @classmethod
    def build(cls, tokens, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN):
        """Builds the vocabulary of a token stream (e.g. a training split).

        Ids follow decreasing count, then lexicographic order. `eos_token` is
        added (last) when the stream lacks it.

        Args:
            tokens: iterable of str. The training tokens.
            eos_token: str. Defaults to `"<eos>"`.
            unk_token: str. Defaults to `"<unk>"`.

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
        return cls(ordered, eos_token=eos_token, unk_token=unk_token)

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
        )

    def __hash__(self):
        return hash((tuple(self._tokens), self.eos_token, self.unk_token))

    def __repr__(self):
        head = ", ".join(repr(t) for t in self._tokens[:5])
        more = ", ..." if len(self) > 5 else ""
        return f"Vocabulary(size={len(self)}, tokens=[{head}{more}])"

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
            ids: iterable of int in `[0, len(self))`.

        Returns:
            A list of str.
        """
        ids = np.asarray(ids)
        if ids.size and (
            not np.issubdtype(ids.dtype, np.integer)
            or ids.min() < 0
            or ids.max() >= len(self)
        ):
            raise ValueError(
                f"Expected integer ids in [0, {len(self)}). Received ids with "
                f"dtype {ids.dtype}, min {ids.min()!r} and max {ids.max()!r}"
            )
        tokens = self._tokens
        return [tokens[i] for i in ids.reshape(-1).tolist()]

    def get_config(self):
        """A JSON-serialisable dict from which `from_config` rebuilds it."""
        return {
            "tokens": list(self._tokens),
            "eos_token": self.eos_token,
            "unk_token": self.unk_token,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def save(self, path):
        """Writes the vocabulary to a JSON file."""
        data = {"format": _FORMAT, "version": 1, **self.get_config()}
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
        try:
            return cls(data["tokens"], data["eos_token"], data["unk_token"])
        except ValueError as error:
            raise ValueError(f"In the vocabulary file {path!r}: {error}") from error
