"""The interface every tokenizer of `mmfs preprocess` gives the pipeline."""

from __future__ import annotations

import json
from itertools import chain

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.storage.file import sized_file_problem

# The largest tokenizer file read: real ones (tokenizer.json, vocab.json, merges.txt,
# tokenizer.model, TikToken rank files) are at most a few hundred MB.
MAX_TOKENIZER_FILE = 1 << 30


def check_tokenizer_file(path: str, what: str) -> str:
    """`path` if it is a regular file of a tokenizer's size, else one line naming it
    (a FIFO would block the read, /dev/zero or a huge sparse file would fill memory)."""
    problem = sized_file_problem(path, MAX_TOKENIZER_FILE, what)
    if problem is not None:
        raise PreprocessError(f"{path}: {problem}; give the {what} itself")
    return path


def read_tokenizer_json(path: str, what: str, expected: type, hint: str):
    """A tokenizer's JSON file holding an `expected` (dict or list), checked first as
    check_tokenizer_file does; one line naming the file and `hint` otherwise."""
    check_tokenizer_file(path, what)
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PreprocessError(f"{path}: cannot read the {what} ({exc}); {hint}") from None
    if not isinstance(value, expected):
        raise PreprocessError(f"{path}: not a JSON {'object' if expected is dict else 'list'}; {hint}")
    return value


def flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-text id lists as (all ids back to back as int64, the number of ids of each text)."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    return tokens, lengths


class Tokenizer:
    """The interface the pipeline uses."""

    name: str
    vocab_size: int
    eod: int | None
    pad: int | None = None
    max_id: int

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all ids back to back as int64, the number of ids of each text)."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens written out (for `mmfs which --text`)."""
        raise NotImplementedError
