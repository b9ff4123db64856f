"""The daemon's C path: sample files served without Python, index and token
files read with pread beyond `-o map_limit_mb`, and a resident memory that
stays flat however many samples are read."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from golden_cases import expected_samples, write_case_config
from mmfs.formats.writer import IndexedDatasetWriter
from mount_fixtures import mmfs, mounted


def _rss_kb(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])


@pytest.mark.parametrize("case", ["p2_blend2_u16", "p3_multi_epoch_i32"])
def test_everything_read_with_pread_is_megatrons(case, tmp_path):
    config = write_case_config(case, tmp_path)
    with mounted(config, tmp_path / "mnt", "-o", "map_limit_mb=0") as m:
        for split in ("train", "valid", "test"):
            rows = expected_samples(case, split)
            if rows is None:
                continue
            dtype = np.dtype(__import__("json").loads((m.path / "mmfs.json").read_text())["dtype"])
            folder = m.path / split / "samples"
            for i, row in enumerate(rows):
                data = row.astype(dtype.newbyteorder("<")).tobytes()
                path = folder / f"{i:07d}.bin"
                assert path.read_bytes() == data
                # Partial reads (C: the whole sample into a temporary, then a slice).
                with open(path, "rb", buffering=0) as f:
                    f.seek(3)
                    assert f.read(5) == data[3:8]
                    f.seek(len(data) - 1)
                    assert f.read(100) == data[-1:]
                    assert f.read(100) == b""
        served = next(line for line in m.log.read_text().splitlines() if "served in C: " in line)
        assert "/train/samples" in served
        out = subprocess.run(["dd", f"if={m.path}/samples/0000001.bin", "bs=1", "skip=7", "count=9",
                              "status=none"], capture_output=True, check=True).stdout
        assert out == (m.path / "samples" / "0000001.bin").read_bytes()[7:16]


def test_bad_map_limit_is_a_clear_error(tmp_path):
    config = write_case_config("p1_single_u16", tmp_path)
    (tmp_path / "mnt").mkdir()
    proc = mmfs("mount", config, tmp_path / "mnt", "-o", "map_limit_mb=lots")
    assert proc.returncode == 2
    assert "map_limit_mb=lots" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def big_config(tmp_path_factory):
    """40 MB of uint16 tokens, 2,400 samples of 8,193 tokens."""
    folder = tmp_path_factory.mktemp("big")
    writer = IndexedDatasetWriter(str(folder / "big.bin"), dtype=np.uint16)
    rng = np.random.RandomState(0)
    for _ in range(200):
        writer.add_item(rng.randint(0, 50000, size=100_000).astype(np.uint16))
        writer.end_document()
    writer.finalize(str(folder / "big.idx"))
    config = folder / "big.yaml"
    config.write_text("datasets: [{path: big}]\nsplit: '100,0,0'\nsequence_length: 8192\n"
                      "cache_dir: cache\ntokenizer: {eod: 0}\n")
    return config


def _read_every_sample(mount) -> int:
    folder = mount.path / "train" / "samples"
    names = os.listdir(folder)
    for name in names:
        with open(folder / name, "rb") as f:
            f.read()
    return len(names)


def test_daemon_memory_stays_flat(big_config, tmp_path):
    """Reading every sample (all 40 MB of tokens) leaves the daemon's RSS where it
    was under a small map limit; with no limit, the files' copies are in it."""
    with mounted(big_config, tmp_path / "capped", "-o", "map_limit_mb=1") as m:
        before = _rss_kb(m.pid)
        assert _read_every_sample(m) > 2000
        capped_growth = _rss_kb(m.pid) - before
        capped_files = _rss_kb(m.pid, "RssFile")
    with mounted(big_config, tmp_path / "mapped", "-o", "map_limit_mb=100000") as m:
        _read_every_sample(m)
        held = _rss_kb(m.pid, "RssAnon")
    assert capped_growth < 4 * 1024, f"daemon grew by {capped_growth} kB"
    assert capped_files < 16 * 1024
    assert held > 40 * 1024  # the token file, copied into the daemon's memory
