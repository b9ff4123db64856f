"""BlendedDataset indices, exactly as megatron-core builds them (C via cffi).

    dataset_index         int16[size]   which GPTDataset serves top-level sample i
    dataset_sample_index  int64[size]   which sample of that GPTDataset
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import numpy as np

from mmfs.errors import ConfigError
from mmfs.megatron.build.check import available_memory
from mmfs.megatron.indices.gpt import gib
from mmfs.megatron.indices.splits import normalize
from mmfs.native import check, ffi, lib, pointer

MAX_DATASETS = 32766  # int16 dataset ids, as Megatron asserts


def blend_description(datasets: list[dict], split: str, weights: list, size: int | None) -> str:
    """Megatron's BlendedDataset unique description (its MD5 names the cache)."""
    ident = OrderedDict()
    ident["class"] = "BlendedDataset"
    ident["datasets"] = datasets
    ident["split"] = split
    ident["weights"] = weights
    ident["size"] = size
    return json.dumps(ident, indent=4)


def sizes_per_dataset(weights: list[float], target: int, surplus: float = 0.0) -> list[int]:
    """_get_size_per_split_per_dataset for one split: ceil(ceil(target * w) * (1 + surplus))."""
    return [int(math.ceil(math.ceil(target * w) * (1 + surplus))) for w in weights]


def blend_rounding(asked: int, weights: list[float]) -> list[int] | None:
    """What a top-level blend asked for `asked` samples takes of each dataset when that
    is more than asked: Megatron sizes it Σ ceil(asked × w) (normalised weights), so
    `samples: {valid: 16}` over two datasets can give 17. None when nothing is added."""
    per_dataset = sizes_per_dataset(weights, asked)
    return per_dataset if sum(per_dataset) > asked else None


def check_blend_fits(size: int, where: str = "", key: str = "samples.<split>") -> None:
    """Refuse, before allocating, a blend whose two arrays (int16 + int64 per
    sample) cannot fit in memory. where: the config and key, as the line begins."""
    need = size * (2 + 8)
    memory, source = available_memory()
    if need > memory:
        raise ConfigError(f"{where}a blend of {size:,} samples needs {gib(need)} of memory for its "
                          f"indices, more than the {gib(memory)} of {source}; lower {key}")


def build_blending_indices(weights: list[float], size: int) -> dict[str, np.ndarray]:
    """The greedy index: sample i goes to argmax_k(w_k * max(i, 1) - count_k)."""
    check_blend_fits(size)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    check(lib.mmfs_build_blending_index(
        pointer(w, "double *"), len(w), size,
        ffi.cast("int16_t *", dataset_index.ctypes.data),
        ffi.cast("int64_t *", dataset_sample_index.ctypes.data),
    ), "blending index")
    return {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}


def build_exhaustive_blending_indices(sizes: list[int]) -> dict[str, np.ndarray]:
    """Every sample of every dataset exactly once, in the same error-minimising order."""
    check_blend_fits(sum(int(n) for n in sizes))
    s = np.ascontiguousarray(sizes, dtype=np.int64)
    total = int(s.sum())
    dataset_index = np.zeros(total, dtype=np.int16)
    dataset_sample_index = np.zeros(total, dtype=np.int64)
    check(lib.mmfs_build_exhaustive_blending_index(
        pointer(s, "int64_t *"), len(s), total,
        ffi.cast("int16_t *", dataset_index.ctypes.data) if total else ffi.NULL,
        ffi.cast("int64_t *", dataset_sample_index.ctypes.data) if total else ffi.NULL,
    ), "exhaustive blending index")
    return {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}


__all__ = ["normalize", "blend_description", "sizes_per_dataset", "build_blending_indices",
           "build_exhaustive_blending_indices", "MAX_DATASETS"]
