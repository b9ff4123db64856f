"""Megatron's split arithmetic: the split string -> bookends -> sequence ranges.

The floats matter: the bookends go into the cache description as Python prints
them (e.g. [0, 0.969]), so they are computed the way megatron-core does.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from mmfs.config.schema import SPLITS


def normalize(weights: list[float]) -> list[float]:
    """megatron.core.datasets.utils.normalize: float64 division by the sum."""
    w = np.array(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def split_vector(split: str) -> list[float]:
    """parse_and_normalize_split: numbers in the string, padded to three, normalised."""
    parts = [float(p) for p in re.findall(r"[.0-9]+", split)]
    parts += [0.0] * (len(SPLITS) - len(parts))
    return normalize(parts)


@lru_cache(maxsize=64)  # asked once per index: thousands of times for a large blend
def split_matrix(split: str) -> tuple[tuple[float, float] | None, ...]:
    """convert_split_vector_to_split_matrix for one vector: (lo, hi) or None per split.

    The running sum starts at the int 0, as Megatron's does, so the first bookend
    prints as 0 (not 0.0) in the description JSON.
    """
    ends: list[float] = [0]
    for w in split_vector(split):
        ends.append(ends[-1] + w)
    return tuple(None if hi <= lo else (lo, hi) for lo, hi in zip(ends[:-1], ends[1:]))


def split_range(bookend: tuple[float, float], num_sequences: int) -> tuple[int, int]:
    """The [beg, end) sequence ids a split exposes (round half to even, as Python)."""
    beg = int(round(bookend[0] * float(num_sequences)))
    end = int(round(bookend[1] * float(num_sequences)))
    return beg, end
