"""`make demo` (python -m mmfs.tools.demo) runs from scratch, writes the mount's report
page (a clean one: the demo's splits are large enough for what they promise) and
prints its path, says no error, and leaves no mount."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mmfs.tools.demo import config_text
from mount_fixtures import ROOT, force_unmount, is_mounted


def test_demo_runs_and_unmounts(tmp_path):
    mnt = tmp_path / "mnt"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mmfs.tools.demo", "--data-dir", str(tmp_path / "demo-data"),
             "--config", str(tmp_path / "configs" / "demo.yaml"), "--mountpoint", str(mnt)],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
        for expected in ("samples -> train/samples", "0000000.bin", "hexdump -C", "00000000  ",
                         "decoded back to text", "user.mmfs.pieces=", "user.mmfs.dataset=",
                         "docstring", "mmfs: unmounted"):
            assert expected in out, expected
        assert not is_mounted(mnt)
        assert (tmp_path / "demo-data" / "stdlib_code.idx").is_file()
        assert "path: ../demo-data/stdlib_code" in (tmp_path / "configs" / "demo.yaml").read_text()
        assert "error" not in (out + proc.stderr).lower()
        page = tmp_path / "demo-data" / "report.html"
        assert f"open {page}" in out and page.stat().st_size > 100_000
        html = page.read_text()
        assert "<h2>Warnings</h2><p class='none'>none</p>" in html and "id='mmfs-data'" in html
    finally:
        force_unmount(mnt)


def test_committed_config_is_what_the_demo_writes():
    committed = ROOT / "configs" / "demo.yaml"
    assert committed.read_text() == config_text(Path("configs/demo.yaml"), Path("demo-data"))
