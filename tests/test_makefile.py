"""The Makefile's two entry points install what each needs, and no more: `make demo`
the core package, `make test` the test extras on top; either order works, and a
second run installs nothing (checked with `make -n`, which runs no recipe)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def installs(target: str, venv: Path) -> list[str]:
    """The pip install lines `make TARGET` would run with its venv at `venv`."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), f"VENV={venv}", target],
                         capture_output=True, text=True, check=True).stdout
    return [line.split("pip install -q ", 1)[1] for line in out.splitlines()
            if "pip install -q " in line and "--upgrade pip" not in line]


def stamp(venv: Path, name: str) -> None:
    (venv / name).touch()


def test_demo_installs_the_core_and_test_adds_the_extras(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    assert installs("demo", venv) == ["-e ."]  # numpy, cffi, PyYAML, mfusepy: no test extras
    assert installs("test", venv) == ["-e .", "-e '.[test]'"]
    stamp(venv, ".installed-core")  # after `make demo`
    assert installs("demo", venv) == []
    assert installs("test", venv) == ["-e '.[test]'"]  # the extras, not the core again
    stamp(venv, ".installed-test")  # after `make test`
    assert installs("test", venv) == []
    assert installs("demo", venv) == []  # nothing reinstalled, nothing downgraded


def test_a_changed_source_rebuilds_the_core_only(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp(venv, ".installed-test")
    stamp(venv, ".installed-core")
    os.utime(venv / ".installed-core", (0, 0))  # older than every source
    assert installs("test", venv) == ["-e ."]
