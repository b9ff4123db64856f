"""torch.randperm on the CPU, without torch.

torch's CPU MT19937 and its two randperm algorithms (swap for n < 2**32 / 20,
inside-out with 64-bit draws above) are reproduced in C (native/mmfs_randperm.c);
these are their bindings.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from mmfs.native import ffi, lib


def mt19937_raw(seed: int, n: int) -> np.ndarray:
    """The first n 32-bit outputs of torch's CPU generator after manual_seed(seed)
    (also numpy's legacy RandomState(seed) stream)."""
    out = np.empty(n, dtype=np.uint32)
    rc = lib.mmfs_mt19937_raw(seed, n, ffi.cast("uint32_t *", out.ctypes.data))
    if rc < 0:
        raise ValueError(f"mt19937_raw: bad arguments (seed {seed}, n {n})")
    return out


def randperm(n: int, seed: int, dtype: Any = np.int64) -> np.ndarray:
    """torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU,
    as int64 (torch's dtype) or int32 (same values, half the memory)."""
    dtype = np.dtype(dtype)
    if n < 0 or seed < 0:
        raise ValueError(f"randperm: n and seed must not be negative (n {n}, seed {seed})")
    out = np.empty(n, dtype=dtype)
    if dtype == np.int64:
        rc = lib.mmfs_randperm_i64(seed, n, ffi.cast("int64_t *", out.ctypes.data))
    elif dtype == np.int32:
        rc = lib.mmfs_randperm_i32(seed, n, ffi.cast("int32_t *", out.ctypes.data))
    else:
        raise ValueError(f"randperm: dtype must be int64 or int32, not {dtype}")
    if rc < 0:
        raise ValueError(f"randperm: n {n} does not fit {dtype}")
    return out


@lru_cache(maxsize=4)
def epoch_permutation(n: int, epoch: int) -> np.ndarray:
    """randperm(n, epoch), read-only and kept for the next caller (a run reads
    one epoch's permutation over and over)."""
    perm = randperm(n, epoch)
    perm.flags.writeable = False
    return perm


def index_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32) if n <= np.iinfo(np.int32).max else np.dtype(np.int64)
