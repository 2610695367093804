"""Wikitext-2 (Merity et al., 2016), from the standard token files."""

from keras_mogrifier.data.corpus import load_corpus

WIKITEXT2_FILE_PATTERN = "wiki.{split}.tokens"


def load_wikitext2(data_dir, level="word", vocabulary=None):
    """Loads Wikitext-2 from `wiki.{train,valid,test}.tokens` in `data_dir`.

    The files of the standard distribution (`wikitext-2/`, already tokenised,
    rare words as `<unk>`), or the same names with `.gz` appended. Nothing is
    downloaded. As for the Penn Treebank (`load_corpus`), every line,
    headings (` = Title = `) and blank lines included, is followed by
    `<eos>`, the convention of the published Wikitext-2 figures
    (AWD-LSTM's `data.py`; 2,088,628 / 217,646 / 245,569 tokens and a
    vocabulary of 33,278 with it). The vocabulary is built from the training
    split.

    Args:
        data_dir: str or path. The directory of the three files.
        level: str. `"word"`, `"char"` or `"byte"` tokens (see
            `keras_mogrifier.data.reader`).
            Defaults to `"word"`.
        vocabulary: `Vocabulary` or None. Use this vocabulary instead of
            building one. Defaults to `None`.

    Returns:
        A `Corpus` with `source="directory"`.

    Raises:
        FileNotFoundError: `data_dir` or one of the files does not exist.

    Example:

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for split in ("train", "valid", "test"):
    ...     with open(os.path.join(d, f"wiki.{split}.tokens"), "w") as f:
    ...         _ = f.write(" \\n = Title = \\n the cat <unk> \\n")
    >>> corpus = load_wikitext2(d)
    >>> corpus.vocabulary.to_tokens(corpus.valid[:6])
    ['<eos>', '=', 'Title', '=', '<eos>', 'the']

    Reference:
        Merity, Xiong, Bradbury, Socher. "Pointer Sentinel Mixture Models",
        arXiv:1609.07843, 2016.
    """
    return load_corpus(
        data_dir, level=level, file_pattern=WIKITEXT2_FILE_PATTERN,
        vocabulary=vocabulary,
    )
