"""`mmfs report -o FILE`: a place a page cannot go is one line, exit 2, before the
figures are made; nothing at the path is replaced unless it is a regular file."""

import os
import stat
import subprocess
import sys

import pytest

from golden_cases import write_case_config
from mmfs.cli import main
from mount_fixtures import ROOT


@pytest.fixture
def config(tmp_path):
    return str(write_case_config("p1_single_u16", tmp_path / "case"))


def _one_line(capsys, *fragments):
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_missing_folder_directory_and_empty_name(config, tmp_path, capsys):
    assert main(["report", config, "-o", str(tmp_path / "nope" / "x.html")]) == 2
    _one_line(capsys, "nope does not exist")
    assert main(["report", config, "-o", str(tmp_path)]) == 2
    _one_line(capsys, "is a directory", "report.html")
    assert main(["report", config, "-o", ""]) == 2
    _one_line(capsys, "empty file name")


def test_a_special_file_is_not_replaced(config, tmp_path, capsys):
    """A FIFO stands in for a device such as /dev/null: the page was written beside it
    and renamed over it (as root, `-o /dev/null` replaced the device with the page)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["report", config, "-o", str(fifo)]) == 2
    _one_line(capsys, "not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["case", "pipe"]


def test_an_unwritable_folder(config, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not str(path).startswith(str(folder)))
    assert main(["report", config, "-o", str(folder / "x.html")]) == 2
    _one_line(capsys, "not writable")


def test_a_symlink_is_written_through(config, tmp_path, capsys):
    real, link = tmp_path / "real.html", tmp_path / "link.html"
    link.symlink_to(real)
    assert main(["report", config, "-o", str(link)]) == 0
    assert link.is_symlink() and real.stat().st_size > 0


def test_iterations_that_are_not_numbers(config, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["report", config, "--iterations", "3,abc", "-o", str(tmp_path / "x.html")])
    assert exit_.value.code == 2
    _one_line(capsys, "'3,abc' is not a comma-separated list of whole numbers")


def test_a_fifo_at_the_old_script_bundle_path_is_never_read(config, tmp_path, monkeypatch):
    """The page draws its own charts: nothing is read from the per-user cache folder, so a
    FIFO where a Vega bundle was cached (XDG_CACHE_HOME/mmfs/report/vega-*.js), which
    blocked `mmfs report -o`, is not opened."""
    folder = tmp_path / "cache" / "mmfs" / "report"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "vega-1.9.0.post1-v6_4.js")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "mmfs.cli", "-q", "report", config, "-o", str(tmp_path / "r.html")],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (done.returncode, done.stderr) == (0, "") and (tmp_path / "r.html").stat().st_size > 0
