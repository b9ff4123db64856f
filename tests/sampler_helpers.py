"""What only the sampler tests use: torch's large-n randperm at any n (and
training_stream, Megatron's training loop over the sampler port, re-exported from
mmfs.megatron.sampling.samplers, where mmfs.adapters.torch uses it)."""

from __future__ import annotations

import numpy as np

from mmfs.megatron.sampling.samplers import training_stream  # noqa: F401 - re-exported
from mmfs.native import ffi, lib


def randperm_inside_out(n: int, seed: int) -> np.ndarray:
    """torch's large-n randperm algorithm for any n."""
    out = np.empty(n, dtype=np.int64)
    if lib.mmfs_randperm_large_path_i64(seed, n, ffi.cast("int64_t *", out.ctypes.data)) < 0:
        raise ValueError(f"randperm_inside_out: bad arguments (n {n}, seed {seed})")
    return out
