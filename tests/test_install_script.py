"""The container recipe's one install step, examples/container/install.sh, run here as
the Dockerfile runs it (on a copy of the source folder, into a fresh virtual
environment: it installs only the system packages that are missing, builds the wheel,
installs it), then the `mmfs` it installed mounts a golden config and serves
megatron-core's samples exactly."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
from source_copy import copy_source

from golden_cases import expected_samples, write_case_config
from mount_fixtures import HANG_GUARD, ROOT, force_unmount

RECIPE = ROOT / "examples" / "container"


def test_the_dockerfile_installs_with_the_one_script_on_ubuntu_24_04():
    text = (RECIPE / "Dockerfile").read_text()
    assert re.search(r"^FROM ubuntu:24\.04$", text, re.M)
    runs = re.findall(r"^RUN (.*)$", text, re.M)
    assert len(runs) == 1 and "examples/container/install.sh" in runs[0], runs
    assert "--device /dev/fuse --cap-add SYS_ADMIN" in text


def test_install_sh_builds_and_installs_mmfs_that_mounts_exactly(tmp_path):
    source = copy_source(tmp_path / "src")
    venv = tmp_path / "opt-mmfs"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["MMFS_VENV"] = str(venv)
    proc = subprocess.run(["sh", str(source / "examples" / "container" / "install.sh"), str(source)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout.strip().splitlines()[-1]
    assert said == f"install.sh: mmfs installed in {venv} (the command: {venv}/bin/mmfs)"

    config = write_case_config("p1_single_u16", tmp_path / "case")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mmfs = str(venv / "bin" / "mmfs")
    try:
        mounted = subprocess.run([mmfs, "mount", str(config), str(mnt), "--log", str(tmp_path / "log")],
                                 env=env, capture_output=True, text=True, timeout=HANG_GUARD)
        assert mounted.returncode == 0, mounted.stderr
        rows = expected_samples("p1_single_u16", "train")
        folder = mnt / "train" / "samples"
        assert [(folder / f"{i:07d}.bin").read_bytes() for i in range(len(rows))] == \
            [r.astype(np.uint16).tobytes() for r in rows]
        assert subprocess.run([mmfs, "umount", str(mnt)], env=env, timeout=HANG_GUARD).returncode == 0
    finally:
        force_unmount(mnt)
    assert Path(venv / "bin" / "python").exists() and not os.path.ismount(mnt)
