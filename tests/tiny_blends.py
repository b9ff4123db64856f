"""Blends of many small IndexedDatasets, for what only shows at scale: header
files, build claims."""

import numpy as np
import yaml

from mmfs.formats.writer import IndexedDatasetWriter


def write_tiny_blend(folder, datasets: int, documents: int = 300) -> str:
    """`datasets` uint16 datasets and a config blending them (train and valid
    splits, cache_dir `cache`); returns the config's path."""
    rng = np.random.RandomState(datasets)
    paths = []
    for d in range(datasets):
        prefix = str(folder / f"ds{d}")
        with IndexedDatasetWriter(prefix + ".bin", dtype=np.uint16) as w:
            for _ in range(documents):
                w.add_item(rng.randint(1, 100, size=rng.randint(1, 40)))
                w.end_document()
            w.finalize(prefix + ".idx")
        paths.append(prefix)
    config = folder / "blend.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": p, "weight": 1.0 + d % 7} for d, p in enumerate(paths)],
        "split": "90,10,0", "samples": {"train": 500, "valid": 50, "test": 0},
        "sequence_length": 16, "tokenizer": {"eod": 0}, "cache_dir": "cache"}))
    return str(config)
