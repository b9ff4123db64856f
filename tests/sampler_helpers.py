"""What only the sampler tests use: Megatron's training loop over the sampler
port and torch's large-n randperm at any n."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mmfs.megatron.samplers import RandomSampler, SamplerError, single_sampler
from mmfs.native import ffi, lib


def training_stream(dataloader_type: str, total: int, consumed: int, mbs: int, rank: int, dp: int,
                    data_sharding: bool = True) -> Iterator[list[int]]:
    """The micro-batches a rank reads from `consumed`, as Megatron's training loop
    iterates its data loader: `single` once; `cyclic` again and again (cyclic_iter)."""
    if dataloader_type == "single":
        yield from single_sampler(total, consumed, mbs, rank, dp)
        return
    if dataloader_type != "cyclic":
        raise SamplerError(f"unknown dataloader_type {dataloader_type!r} (single or cyclic)")
    sampler = RandomSampler(total, consumed, mbs, rank, dp, data_sharding)
    while True:
        count = 0
        for batch in sampler:
            count += 1
            yield batch
        if count == 0:
            raise SamplerError("the cyclic sampler produced no micro-batch in a pass")


def randperm_inside_out(n: int, seed: int) -> np.ndarray:
    """torch's large-n randperm algorithm for any n."""
    out = np.empty(n, dtype=np.int64)
    if lib.mmfs_randperm_large_path_i64(seed, n, ffi.cast("int64_t *", out.ctypes.data)) < 0:
        raise ValueError(f"randperm_inside_out: bad arguments (n {n}, seed {seed})")
    return out
