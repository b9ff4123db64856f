"""A directory laid out as an mmfs mount (README.md, "The mount" and "The training
stream"), written from a config with mmfs's in-process reader: mmfs.json, the sample
files with their xattrs and, with a `training:` block, the rank folders
`<split>/ranks/RRR/NNNNNNN.bin` (each the concatenation of its samples' files, as the
plan says) with `user.mmfs.samples`. Loaders and examples are tested against it as
against a mount; tests that mount for real check the mount against the same rules.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mmfs.sampling import open_corpus
from mmfs.sampling.samplers import describe_training, plan_splits, rank_ids
from mmfs.tree import XATTR_DATASET, XATTR_PIECES, name_width

XATTR_SAMPLES = "user.mmfs.samples"


def write_contract_dir(config_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = open_corpus(str(config_path), progress=False)
    info = corpus.describe()
    info["config_path"] = str(config_path)
    samples: dict[str, list[bytes]] = {}
    for split, reader in corpus.splits.items():
        width = name_width(len(reader))
        folder = out / split / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        samples[split] = []
        for i in range(len(reader)):
            data = reader.read(i)
            samples[split].append(data)
            path = folder / f"{i:0{width}d}.bin"
            path.write_bytes(data)
            dataset, pieces = reader.provenance(i)
            os.setxattr(path, XATTR_DATASET, dataset.encode())
            os.setxattr(path, XATTR_PIECES, " ".join(f"{s}:{o}:{n}" for s, o, n in pieces).encode())
        info["splits"][split].update(path=f"{split}/samples", name_width=width)
    training = corpus.config.training
    if training is not None:
        lengths = {split: len(reader) for split, reader in corpus.splits.items()}
        t = describe_training(training, lengths, info["bytes_per_sample"])
        info["training"] = t
        for split, plan in plan_splits(training, lengths).items():
            if plan.files_per_rank == 0:
                continue
            assert plan.files_per_rank == t["microbatches"][split]
            for rank in range(training.data_parallel_size):
                folder = out / t["ranks_path"][split] / f"{rank:0{t['rank_name_width']}d}"
                folder.mkdir(parents=True, exist_ok=True)
                for j, ids in enumerate(rank_ids(plan, rank)):
                    path = folder / f"{j:0{t['microbatch_name_width'][split]}d}.bin"
                    path.write_bytes(b"".join(samples[split][i] for i in ids))
                    os.setxattr(path, XATTR_SAMPLES, " ".join(map(str, ids.tolist())).encode())
    (out / "mmfs.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return out
