"""Record what torch.randperm and megatron-core 0.19.2's samplers yield, into
megatron_samplers.json beside this file (the tests read it; they never import torch).

Run with a Python that has torch 2.13.0 (CPU) and megatron-core 0.19.2:
    python tests/reference/record_megatron_samplers.py
The output is deterministic: running it twice writes the same file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from pathlib import Path

import numpy as np
import torch
from megatron_modules import cyclic_iter, load_data_samplers

HERE = Path(__file__).resolve().parent
OUT = HERE / "megatron_samplers.json"
SMALL_LIMIT = (2**32 - 1) // 20  # torch switches algorithm at n >= this


def torch_randperm(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g)


def record_randperm() -> dict:
    small = []
    for seed, n in itertools.product([0, 1, 2, 3, 17, 2**32 + 5], [0, 1, 2, 3, 5, 10, 100, 625, 1000, 4097]):
        small.append({"seed": seed, "n": n, "perm": torch_randperm(n, seed).tolist()})
    large = []
    # Either side of torch's switch to the inside-out algorithm with 64-bit draws.
    for seed, n in [(1, SMALL_LIMIT - 1), (0, SMALL_LIMIT)]:
        perm = torch_randperm(n, seed).numpy()
        positions = sorted({*range(16), *range(n - 16, n), *np.linspace(0, n - 1, 257).astype(int).tolist()})
        large.append({
            "seed": seed, "n": n, "positions": positions,
            "values": perm[positions].tolist(),
            "sha256_int32_le": hashlib.sha256(perm.astype("<i4").tobytes()).hexdigest(),
        })
        del perm
    return {"small": small, "large": large}


def record_samplers(samplers) -> list:
    rng = random.Random(20261122)
    combos = set()
    for total in [1, 2, 5, 6, 7, 10, 11, 12, 13, 17, 24, 29, 30, 31, 47, 64, 100, 101]:
        for mbs, dp in [(1, 1), (1, 3), (2, 1), (2, 2), (2, 3), (3, 2), (4, 2), (1, 4), (3, 4)]:
            combos.add((total, mbs, dp))
    for _ in range(12):
        combos.add((rng.randint(50, 5000), rng.randint(1, 8), rng.randint(1, 8)))
    cases = []
    for total, mbs, dp in sorted(combos):
        group = mbs * dp
        files = total // group
        for kind in ("single", "sharded", "unsharded"):
            if kind != "single" and files == 0:
                continue  # Megatron divides by zero (active_total == 0)
            starts = sorted({0, group, 2 * group, files * group, (files + 1) * group, 3 * files * group + group})
            for consumed in starts:
                if kind == "single" and consumed >= total:
                    continue  # Megatron asserts: no samples left to consume
                limit = min(files + 3 if kind == "single" else 3 * files + 7, 24)
                streams = {}
                for rank in range(dp):
                    if kind == "single":
                        sampler = samplers.MegatronPretrainingSampler(total, consumed, mbs, rank, dp)
                        it = iter(sampler)  # Megatron's `single` iterator: one pass
                    else:
                        sampler = samplers.MegatronPretrainingRandomSampler(
                            None, total, consumed, mbs, rank, dp, kind == "sharded")
                        it = cyclic_iter(sampler)
                    streams[str(rank)] = [list(map(int, b)) for b in itertools.islice(it, limit)]
                cases.append({"kind": kind, "total": total, "micro_batch_size": mbs,
                              "data_parallel_size": dp, "consumed": consumed, "streams": streams})
    return cases


def main() -> None:
    samplers = load_data_samplers()
    out = {
        "about": "torch.randperm (CPU) and megatron-core's samplers, recorded by record_megatron_samplers.py",
        "torch_version": torch.__version__,
        "megatron_core_version": __import__("megatron.core.package_info", fromlist=["__version__"]).__version__,
        "randperm": record_randperm(),
        "samplers": record_samplers(samplers),
    }
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(out['samplers'])} sampler cases)")


if __name__ == "__main__":
    main()
