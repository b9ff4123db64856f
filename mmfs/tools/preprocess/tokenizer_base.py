"""The interface every tokenizer of `mmfs preprocess` gives the pipeline."""

from __future__ import annotations

from itertools import chain

import numpy as np


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
