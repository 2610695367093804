"""What the enwik8 and text8 loaders share: reading the file, the standard split."""

import os
import zipfile

from keras_mogrifier import _validation
from keras_mogrifier.data import reader


def find_file(path, name):
    """`path` itself, or `name` (plain, `.gz` or `.zip`) in the directory `path`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        for candidate in (name, name + ".gz", name + ".zip"):
            if os.path.isfile(os.path.join(path, candidate)):
                return os.path.join(path, candidate)
        raise FileNotFoundError(
            f"Expected {path!r} to hold {name!r}, {name + '.gz'!r} or "
            f"{name + '.zip'!r}. Received: a directory with none of them"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Expected the {name} file ({name}, {name}.gz or {name}.zip, as "
            f"http://mattmahoney.net/dc/{name}.zip has it), or a directory "
            f"holding it. Received: {path!r}, which does not exist"
        )
    return path


def read_hutter_file(path):
    """The bytes of the file: plain, gzip-compressed, or the one member of a zip."""
    if not path.endswith(".zip"):
        return reader.read_bytes(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.namelist() if not m.endswith("/")]
            if len(members) != 1:
                raise ValueError(
                    f"Expected {path!r} to hold one file (as enwik8.zip and "
                    f"text8.zip do). Received: {len(members)} members"
                )
            return archive.read(members[0])
    except zipfile.BadZipFile as error:
        raise ValueError(
            f"Expected {path!r} to be a complete zip file. Received: {error}; "
            "it may be truncated: download it again"
        ) from error


def split_bytes(codes, valid_size, test_size, path, unit="bytes"):
    """`{"train", "valid", "test"}` views of `codes`: test last, valid before it.

    The split of Krause et al. and Transformer-XL's preparation scripts:
    `data[: -(valid + test)]`, `data[-(valid + test) : -test]`,
    `data[-test:]` (90M / 5M / 5M of the 10⁸-symbol files).
    """
    valid_size = _validation.positive_int(f"valid_{unit}", valid_size)
    test_size = _validation.positive_int(f"test_{unit}", test_size)
    n = len(codes)
    if n <= valid_size + test_size:
        raise ValueError(
            f"Expected {path!r} to hold more than valid + test = "
            f"{valid_size + test_size:,} {unit} (the standard file holds "
            f"100,000,000). Received: {n:,}"
        )
    train_end = n - valid_size - test_size
    return {
        "train": codes[:train_end],
        "valid": codes[train_end : n - test_size],
        "test": codes[n - test_size :],
    }
