"""A copy of this checkout's source (what `pip wheel .` reads) in a test's folder: a
wheel is built there, never in the checkout (its build/ and egg-info stay out of it,
and two builds at once do not share one build folder)."""

import os
import shutil
from pathlib import Path

from mount_fixtures import ROOT

# Left out at the top only (mmfs/megatron/build/ is a package); build products anywhere.
TOP = {".git", ".venv", "build", "tests", "benchmarks", "demo-data", "tour", "mnt", ".hypothesis", "dist"}
ANYWHERE = shutil.ignore_patterns("*.egg-info", "__pycache__", "*.so", "*.o", "_native.c")


def _left_out(folder: str, names: list[str]) -> set[str]:
    top = {n for n in names if n in TOP} if os.path.samefile(folder, ROOT) else set()
    return top | set(ANYWHERE(folder, names))


def copy_source(dest: Path) -> Path:
    shutil.copytree(ROOT, dest, ignore=_left_out, symlinks=True)
    return dest
