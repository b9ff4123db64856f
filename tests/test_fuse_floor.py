"""benchmarks/fuse_floor.py's floor daemon serves the very names, sizes and bytes of
the mount it was packed from: the comparison it makes is between equals."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from golden_cases import write_case_config
from mount_fixtures import mount_in

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fuse_floor  # noqa: E402


def has_libfuse3_headers() -> bool:
    return bool(shutil.which("pkg-config")) and subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode == 0


@pytest.mark.skipif(not has_libfuse3_headers(), reason="libfuse 3's headers are missing (libfuse3-dev)")
def test_the_floor_serves_what_the_mount_serves(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "config")
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": 2, "micro_batch_size": 2}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    binary = fuse_floor.build_floor(str(tmp_path))
    with contextlib.ExitStack() as stack:
        mount = mount_in(stack, config, tmp_path / "mnt")
        files = fuse_floor.pack(str(mount), str(tmp_path / "floor.pack"))
        assert sorted(files) == ["train/ranks", "train/samples"]
        with fuse_floor.floor_mount(binary, str(tmp_path / "floor.pack"), str(tmp_path), False) as (floor, _):
            for names in files.values():
                assert names
                for name in names:
                    with open(os.path.join(floor, name), "rb", buffering=0) as f:
                        got = f.read()
                    with open(mount / name, "rb", buffering=0) as f:
                        assert got == f.read(), name
            assert sorted(os.listdir(os.path.join(floor, "train", "samples"))) == sorted(
                os.listdir(mount / "train" / "samples"))
            assert not os.path.exists(os.path.join(floor, "train", "nothing"))
