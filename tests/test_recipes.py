"""docs/megatron.md's launch recipes, run as written (node.sh for Slurm, the torchrun
script), on a node that a previous run left a mount on: a stale one (its daemon
killed with the step, as on a requeue) and a live one. `torchrun` is a stand-in that
reads every sample of the mount the ranks would read; the recipe must mount, let it
read Megatron's exact samples, and unmount."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from golden_cases import expected_samples, write_case_config
from mount_fixtures import ROOT, force_unmount, is_mounted, start_mount, wait_gone

CASE = "p2_blend2_u16"
PAGE = ROOT / "docs" / "megatron.md"

# The stand-in for torchrun: the digest of every train sample of $MMFS_MOUNT, in order.
TORCHRUN = f"""#!/bin/sh
exec {sys.executable} -c '
import hashlib, os, sys
folder = os.path.join(os.environ["MMFS_MOUNT"], "train", "samples")
digest = hashlib.sha256()
for name in sorted(os.listdir(folder)):
    digest.update(open(os.path.join(folder, name), "rb").read())
open(os.environ["READ_DIGEST"], "w").write(digest.hexdigest())
'
"""


def _block(marker: str) -> str:
    bodies = re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    found = [b for b in bodies if marker in b]
    assert len(found) == 1, marker
    return found[0]


def _want() -> str:
    digest = hashlib.sha256()
    for row in expected_samples(CASE, "train"):
        digest.update(row.astype(np.uint16).tobytes())
    return digest.hexdigest()


def _bin(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    (folder / "mmfs").write_text(f"#!/bin/sh\nexec {sys.executable} -m mmfs.cli \"$@\"\n")
    (folder / "torchrun").write_text(TORCHRUN)
    for tool in folder.iterdir():
        tool.chmod(0o755)
    return folder


def _run(script: str, tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT), READ_DIGEST=str(tmp_path / "read"),
                PATH=f"{_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}", **env)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=full, timeout=300)


def _left_stale(config: Path, mnt: Path) -> None:
    m = start_mount(config, mnt)
    os.kill(m.pid, signal.SIGKILL)
    assert wait_gone(m.pid)


def test_slurm_node_sh_survives_a_requeue_onto_a_stale_mount(tmp_path):
    config = write_case_config(CASE, tmp_path / "case")
    mnt = tmp_path / "mmfs-job"
    _left_stale(config, mnt)  # the run before the requeue, killed with its step
    job = f"test{os.getpid()}"
    log = Path(f"/tmp/mmfs-{job}-0-1.log")
    try:
        proc = _run(_block("# node.sh"), tmp_path, {
            "MMFS_CONFIG": str(config), "MMFS_MOUNT": str(mnt), "SLURM_JOB_ID": job, "SLURM_NODEID": "0",
            "SLURM_NNODES": "1", "SLURM_RESTART_COUNT": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500", "MEGATRON_ARGS": ""})
        assert proc.returncode == 0, proc.stderr
        assert "cleared a stale mmfs mount" in proc.stderr
        assert (tmp_path / "read").read_text() == _want()
        assert not is_mounted(mnt)  # the trap unmounted it
    finally:
        force_unmount(mnt)
        log.unlink(missing_ok=True)


def test_torchrun_script_survives_a_stale_and_a_live_mount_left_by_an_earlier_run(tmp_path):
    config = write_case_config(CASE, tmp_path / "case")
    script = _block("torchrun --nnodes 4").replace("/shared/job/run.yaml", str(config))
    script = script.replace("/mnt/", f"{tmp_path}/")
    mnt = tmp_path / "mmfs-9"
    env = {"JOB_ID": "9", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MEGATRON_ARGS": ""}
    try:
        _left_stale(config, mnt)
        proc = _run(script, tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "read").read_text() == _want() and not is_mounted(mnt)
        earlier = start_mount(config, mnt)  # an earlier run's daemon, still serving
        (tmp_path / "read").unlink()
        proc = _run(script, tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "read").read_text() == _want() and not is_mounted(mnt)
        assert wait_gone(earlier.pid)
    finally:
        force_unmount(mnt)
