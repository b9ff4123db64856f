"""Two "nodes" of one training job on this machine (issue 32 item 3), for
test_two_nodes.py and benchmarks/two_nodes.py: one config whose dataset is in one
bucket (moto's server), one index cache folder both share (as a cluster file system
would), and per node its own proxy in front of the bucket (so what each node fetches
is counted by its own requests), its own range cache (XDG_CACHE_HOME) and its own
mount, from which only that node's data-parallel ranks read, through the streams
the Megatron provider reads.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from s3_server import FaultProxy, environment

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "nodes"
SUMMARY = re.compile(r"indices: (\d+)/(\d+) ready \((\d+) built, (\d+) from cache\)")


def write_dataset(folder: Path, tokens: int, seed: int = 5) -> Path:
    """folder/toks.{bin,idx}: uint16 documents of 100-3000 random tokens (EOD 0 last)."""
    from mmfs.formats.writer import IndexedDatasetWriter

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with IndexedDatasetWriter(str(folder / "toks.bin"), dtype=np.uint16) as w:
        done = 0
        while done < tokens:
            doc = rng.integers(1, 50000, int(rng.integers(100, 3000)), dtype=np.uint16)
            doc[-1] = 0
            w.add_item(doc)
            w.end_document()
            done += doc.size
        w.finalize(str(folder / "toks.idx"))
    return folder / "toks"


def job_config(path: Path, dataset: str, cache_dir: Path, sequence_length: int, dp: int, mbs: int,
               storage: dict | None = None) -> Path:
    """The job's config: one dataset, Megatron's split, the training layout."""
    config = {"datasets": [{"path": dataset}], "split": "98,1,1", "sequence_length": sequence_length,
              "tokenizer": {"eod": 0, "pad": None}, "cache_dir": str(cache_dir),
              "training": {"data_parallel_size": dp, "micro_batch_size": mbs, "global_batch_size": dp * mbs}}
    if storage:
        config["storage"] = storage
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class Node:
    """One node: its proxy to the bucket, its environment, its mount."""

    name: str
    proxy: FaultProxy
    home: Path
    mnt: Path = field(init=False)
    err: Path = field(init=False)
    proc: subprocess.Popen | None = None
    pid: int | None = None

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.mnt, self.err = self.home / "mnt", self.home / "mount.err"
        self.mnt.mkdir(exist_ok=True)

    @property
    def env(self) -> dict:
        return environment({"AWS_ENDPOINT_URL": self.proxy.url, "XDG_CACHE_HOME": str(self.home / "cache"),
                            "PYTHONPATH": str(ROOT)})

    def start_mount(self, config: Path) -> None:
        """`mmfs mount` in the background (it returns once mounted); stderr to a file."""
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "mmfs.cli", "mount", str(config), str(self.mnt),
                                          "--log", str(self.home / "daemon.log")],
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=self.env)

    def wait_mounted(self, timeout: float = 300) -> str:
        """The mount's stderr once `mmfs mount` has returned (it mounted, or failed)."""
        out, _ = self.proc.communicate(timeout=timeout)
        text = self.err.read_text()
        if self.proc.returncode:
            raise RuntimeError(f"node {self.name}: mmfs mount failed ({self.proc.returncode}):\n{out}{text}")
        self.pid = int(re.search(r"daemon pid (\d+)", out).group(1))
        return text

    def wait_for_line(self, words: str, timeout: float = 300) -> None:
        """Until the mount's stderr holds `words` (or `mmfs mount` ended without it)."""
        deadline = time.monotonic() + timeout
        while words not in self.err.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name}: no {words!r} in its output:\n{self.err.read_text()}")
            time.sleep(0.05)

    def unmount(self) -> None:
        from mount_fixtures import force_unmount

        force_unmount(self.mnt)


def summary(stderr: str) -> tuple[int, int, int]:
    """(indices, built, from cache) of a build's last progress line."""
    found = SUMMARY.findall(stderr)
    if not found:
        raise AssertionError(f"no build summary in:\n{stderr}")
    _done, total, built, cached = map(int, found[-1])
    return total, built, cached


def read_ranks(mount: Path, ranks: list[int], dp: int, mbs: int, count: int,
               local: Path | None = None) -> dict:
    """Each rank's first `count` micro-batch files of the train stream from 0, one
    thread per rank, as the Megatron provider lists them; bytes read, files whose
    bytes differ from `local` (a mount of the same data from local disk), seconds."""
    from mmfs.adapters.megatron import rank_stream_files
    from mmfs.loader import Mount

    m = Mount(mount)
    served, wrong, errors = [0] * len(ranks), [0] * len(ranks), []

    def reader(k: int, rank: int) -> None:
        try:
            files = rank_stream_files(m, "train", rank, dp, mbs, 0)
            for _ in range(count):
                path = next(files)
                with open(path, "rb") as f:
                    data = f.read()
                served[k] += len(data)
                if local is not None:
                    with open(os.path.join(local, os.path.relpath(path, mount)), "rb") as f:
                        wrong[k] += data != f.read()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(f"rank {rank}: {exc!r}")

    start = time.perf_counter()
    pool = [threading.Thread(target=reader, args=(k, r)) for k, r in enumerate(ranks)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return {"served": sum(served), "wrong_files": sum(wrong), "seconds": time.perf_counter() - start}
