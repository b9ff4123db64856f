"""A bad flag or flag value is one line on stderr and exit 2, like every user error."""

from __future__ import annotations

import subprocess
import sys

import pytest

BAD = [
    (["which", "config.yaml", "--iteration", "1.5"], "mmfs which: error: argument --iteration"),
    (["bogus"], "mmfs: error: argument COMMAND: invalid choice: 'bogus'"),
    (["preprocess", "--workers", "x"], "mmfs preprocess: error: argument --workers"),
    ([], "mmfs: error: the following arguments are required: COMMAND"),
    (["build"], "mmfs build: error: the following arguments are required: config"),
    (["sample", "c.yaml", "1", "--split", "nope"], "mmfs sample: error: argument --split"),
]


@pytest.mark.parametrize("argv, start", BAD, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_argument_errors_are_one_line(argv, start):
    run = subprocess.run([sys.executable, "-m", "mmfs.cli", *argv], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), run.stderr


def test_help_still_prints_the_usage():
    run = subprocess.run([sys.executable, "-m", "mmfs.cli", "which", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("usage: mmfs which")
