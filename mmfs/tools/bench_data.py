"""The benchmark dataset: about 500 MB of random uint16 tokens in an MMIDIDX
pair, and configs over it (`python -m mmfs.tools.bench --make-data DIR`)."""

from __future__ import annotations

import os

import numpy as np


def make_data(folder: str, tokens: int = 250_000_000, seed: int = 0) -> list[str]:
    """Write a uint16 IndexedDataset of about `tokens` random tokens (documents
    of 1..2000 tokens, eod 65535 last) and two configs beside it:
    bench.yaml (sequence_length 4096, 1,000,000 train samples) and
    bench-100m.yaml (100,000,000 train samples, for the daemon's memory)."""
    from mmfs.formats.writer import write_index

    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, "bench_text_document")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2001, size=tokens // 1000 + 1, dtype=np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    eod = 65535
    with open(prefix + ".bin", "wb") as f:
        chunk = 1 << 22
        written = 0
        total = int(lengths.sum())
        ends = np.cumsum(lengths) - 1
        while written < total:
            n = min(chunk, total - written)
            block = rng.integers(0, 50000, size=n, dtype=np.uint16)
            lo, hi = np.searchsorted(ends, [written, written + n])
            block[ends[lo:hi] - written] = eod
            f.write(block.tobytes())
            written += n
    write_index(prefix + ".idx", np.uint16, lengths, np.arange(len(lengths) + 1, dtype=np.int64))
    configs = []
    for name, seq, train in (("bench.yaml", 4096, 1_000_000), ("bench-100m.yaml", 256, 100_000_000)):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(
                f"# mmfs benchmark data ({int(lengths.sum())} uint16 tokens)\n"
                "datasets:\n  - path: bench_text_document\n"
                'split: "100,0,0"\n'
                f"samples:\n  train: {train}\n"
                f"sequence_length: {seq}\nseed: 1234\n"
                f"tokenizer: {{eod: {eod}, pad: null}}\n"
                "cache_dir: cache\n"
            )
        configs.append(path)
    return configs
