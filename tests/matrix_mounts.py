"""The reference matrix's data, configs and mounts as mmfs reads them
(tests/test_matrix.py): the generated datasets of matrix_cases.py written as
IndexedDataset pairs by mmfs's writer and as JSONL texts, a cell's config on each
storage kind, and a mounted cell's views read back as sample digests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml

import matrix_cases as mc
from matrix_reference import CELLS, Cell, digest, file_digests
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.loader import Mount
from mmfs.megatron.corpus import open_corpus
from mmfs.mount import contract
from mmfs.tools.which import which_in

BUCKET = "matrix"


def write_data(folder: Path) -> None:
    """The generated datasets as IndexedDataset pairs (mmfs's writer) and as JSONL texts."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in mc.DATASETS:
        with IndexedDatasetWriter(str(folder / f"{name}.bin"), dtype=np.uint16) as writer:
            for doc in mc.tokens(name):
                writer.add_document(doc, [len(doc)])
            writer.finalize(str(folder / f"{name}.idx"))
        (folder / f"{name}.jsonl").write_text(mc.jsonl(name))


def write_config(name: str, storage: str, data: Path, folder: Path, endpoint: str | None = None) -> Path:
    """The config of cell `name` (sampler/mode/schedule) on a storage kind."""
    sampler, mode, schedule = name.split("/")

    def dataset(name: str, weight: float | None) -> dict:
        path = {"local": str(data / "data" / name), "text": str(data / "data" / f"{name}.jsonl"),
                "s3": f"s3://{BUCKET}/data/{name}"}[storage]
        return {"path": path, "name": name, **({} if weight is None else {"weight": weight})}

    def datasets(blend) -> list[dict]:
        return [dataset(blend, None)] if isinstance(blend, str) else [dataset(n, w) for n, w in blend.items()]

    config: dict = {"split": mc.SPLIT, "sequence_length": mc.SEQUENCE_LENGTH, "seed": mc.SEED,
                    "cache_dir": str(data / f"cache-{storage}"),
                    "tokenizer": {"type": "ByteLevel"} if storage == "text" else {"eod": mc.EOD, "pad": None},
                    "training": mc.training(sampler, schedule)}
    if storage == "s3":
        config["storage"] = {"endpoint_url": endpoint, "cache_dir": str(data / "s3-objects")}
    if mode == "none":
        config["datasets"] = datasets(mc.PHASES[0])
    else:  # the second phase starts at an iteration, the third at its first sample (both forms)
        config["phase_mode"] = mode
        third = CELLS[name].get("consumed_before_iteration", [0] * 20)[mc.PHASE_STARTS[1]] or 19 * 8
        config["phases"] = [{"datasets": datasets(mc.PHASES[0])},
                            {"start_iteration": mc.PHASE_STARTS[0], "datasets": datasets(mc.PHASES[1])},
                            {"start_samples": third, "datasets": datasets(mc.PHASES[2])}]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Run:
    """A cell mounted from one storage kind: the mount, its config and corpus (in this process),
    and the same config served in this process without FUSE (Mount(CONFIG))."""

    def __init__(self, cell: Cell, storage: str, config: Path, path: Path) -> None:
        self.cell, self.storage, self.config, self.path = cell, storage, config, path
        self.mount = Mount(path)
        self.in_process = Mount(config)
        self.corpus = open_corpus(str(config), progress=False)
        self.tokens = self.mount.tokens_per_sample

    def digests(self, path: str | Path) -> list[str]:
        with open(path, "rb") as f:
            return file_digests(f.read(), self.mount.dtype, self.tokens)

    def rank_files(self, split: str, rank: int) -> list[list[str]]:
        return [self.digests(self.mount.microbatch_path(split, rank, j))
                for j in range(self.mount.microbatches_per_rank(split))]

    def rank_ids(self, split: str, rank: int) -> list[list[int]]:
        return [self.mount.microbatch_samples(split, rank, j) for j in range(self.mount.microbatches_per_rank(split))]

    def phase_split(self, phase: int, split: str) -> dict:
        """mmfs.json's description of a restart phase's own valid or test."""
        return self.mount.phases["phases"][phase]["splits"][split]

    def phase_rank_files(self, info: dict, rank: int) -> list[list[str]]:
        """A rank's micro-batch files of a phase's own valid or test (phase_split's ranks_path)."""
        folder = self.path / info["ranks_path"] / f"{rank:0{self.mount.training['rank_name_width']}d}"
        width = info["microbatch_name_width"]
        return [self.digests(folder / f"{j:0{width}d}.bin") for j in range(info["microbatches"])]

    def which(self, iteration: int, split: str = "train") -> dict:
        return which_in(self.corpus, iteration, split)

    def which_digests(self, answer: dict) -> list[list[list[str]]]:
        """Each rank's micro-batches of a `which` answer, the tokens read from its pieces."""
        datasets = {d.name: d.dataset for d in self.corpus.datasets}

        def tokens(sample: dict) -> np.ndarray:
            ds = datasets[sample["dataset"]]
            parts = [np.asarray(ds.get(p["sequence"], p["sequence_tokens"][0],
                                       p["sequence_tokens"][1] - p["sequence_tokens"][0])) for p in sample["pieces"]]
            return np.concatenate(parts)

        return [[[digest(tokens(s)) for s in mb["samples"]] for mb in r["microbatches"]] for r in answer["ranks"]]


def loader_files(m: Mount, cell: Cell) -> Iterator[tuple[str, str | None]]:
    """(path in the mount, the attribute the loader reads of it) of every file mmfs.loader
    reads of a cell: mmfs.json; every sample of each split (its beyond ids too) and of each
    restart phase's own valid and test; every micro-batch file of each rank; the streams
    the cell's relaunches read (train at each recorded layout and consumed count, each
    split and phase's own from 0 on both layouts)."""
    yield contract.MANIFEST, None
    phases = (m.phases or {}).get("phases", [])
    owned = [(split, None) for split in m.samples]
    owned += [(split, k) for k, p in enumerate(phases) for split in p.get(contract.KEY_SPLITS, {})
              if contract.KEY_PATH in p[contract.KEY_SPLITS][split]]
    for split, phase in owned:
        entry = m.info[contract.KEY_SPLITS][split] if phase is None else phases[phase][contract.KEY_SPLITS][split]
        beyond = int(entry.get(contract.KEY_BEYOND, {}).get(contract.KEY_BEYOND_SAMPLES, 0))
        for i in range(m.split_samples(split, phase) + beyond):
            yield os.path.relpath(m.sample_path(split, i, phase), m.path), contract.XATTR_PIECES
        for rank in range(mc.DATA_PARALLEL_SIZE):
            for j in range(m.microbatches_per_rank(split, phase)):
                yield os.path.relpath(m.microbatch_path(split, rank, j, phase), m.path), contract.XATTR_SAMPLES
    layouts = [(split, phase, dp, mbs, 0) for split, phase in owned
               for dp, mbs in ((mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE), mc.OTHER_LAYOUT)]
    for key in cell.resumed():
        layout = dict(part.split("=") for part in key.split(","))
        layouts.append(("train", None, int(layout["dp"]), int(layout["mbs"]), int(layout["from"])))
    for split, phase, dp, mbs, at in layouts:
        for rank in range(dp):
            for f in m.stream_files(split, rank, dp, mbs, at, phase=phase):
                yield os.path.relpath(f, m.path), contract.XATTR_SAMPLES


def differences(mount: Mount, other: Mount, cell: Cell) -> list[str]:
    """Each file of loader_files (listed on `mount`) whose bytes, attribute or stream listing
    `other` serves differently."""
    found, listed = [], set()
    for rel, name in loader_files(mount, cell):
        a, b = os.path.join(mount.path, rel), os.path.join(other.path, rel)
        if mount.files.read(a) != other.files.read(b):
            found.append(f"{rel}: other bytes")
        if name is not None and mount.attribute(a, name) != other.attribute(b, name):
            found.append(f"{rel}: another {name}")
        folder = os.path.dirname(rel)
        if "/streams/" in f"/{folder}/" and folder not in listed:
            listed.add(folder)
            if sorted(mount.files.listdir(os.path.join(mount.path, folder))) != \
                    sorted(other.files.listdir(os.path.join(other.path, folder))):
                found.append(f"{folder}: another listing")
    return found
