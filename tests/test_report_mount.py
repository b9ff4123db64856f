"""MOUNT/report.html: made in the background by a child process from the mount's own
snapshot of the config, a short page saying so until then, kept, sized and dated as
the mount's other files; serving never waits for it."""

import os
import time

import pytest
import yaml

from golden_cases import write_case_config
from mmfs.cli import main
from mmfs.mount.report_file import BEING_MADE, PAGE_MAKER
from mount_fixtures import mounted

# Put on the PYTHONPATH of a mount (sitecustomize runs first in every Python process of
# it): holds the page maker child, and only it, until the test creates the release file.
HOLD = f"""
import os, sys, time
if {PAGE_MAKER!r} in sys.argv:
    open(os.environ["MMFS_TEST_HELD"], "w").close()
    deadline = time.monotonic() + 300  # never left behind for good
    while not os.path.exists(os.environ["MMFS_TEST_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def _config(tmp_path):
    path = write_case_config("p2_blend2_u16", tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["training"] = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8}
    path.write_text(yaml.safe_dump(cfg))
    return path


def wait_until(ready, what: str, timeout: float = 300.0):
    """Wait for an event seen from outside (a file appears, a page replaces the note)."""
    deadline = time.monotonic() + timeout
    while not (found := ready()):
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.02)
    return found


def read_page(path) -> bytes:
    """report.html once the page replaced the note (the mount has the kernel forget the
    note's size when the page is made: a new open sees the page)."""
    return wait_until(lambda: (data := path.read_bytes()) != BEING_MADE and data, "page in place of the note")


def test_mount_serves_the_report(tmp_path):
    config = _config(tmp_path)
    assert main(["-q", "report", str(config), "-o", str(tmp_path / "cli.html")]) == 0
    with mounted(config, tmp_path / "mnt") as m:
        assert "report.html" in os.listdir(m.path)
        page = m.file("report.html")
        data = read_page(page)
        st = os.stat(page)
        assert st.st_size == len(data)
        assert data == (tmp_path / "cli.html").read_bytes()
        assert st.st_mtime_ns == os.stat(m.file("mmfs.json")).st_mtime_ns
        assert os.stat(page).st_size == st.st_size and page.read_bytes() == data  # kept
        assert main(["-q", "report", str(m.path), "-o", str(tmp_path / "of-mount.html")]) == 0  # MOUNT as target
        assert (tmp_path / "of-mount.html").read_bytes() == data


def test_a_read_returns_while_report_html_is_made(tmp_path, monkeypatch):
    """A local mount serves with one thread: the first stat of report.html starts the page
    maker and answers at once with the note's size; with the maker held, a sample read
    returns and report.html still reads as the note; released, the page replaces it."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "sitecustomize.py").write_text(HOLD)
    held, release = tmp_path / "held", tmp_path / "release"
    monkeypatch.setenv("PYTHONPATH", str(gate))
    monkeypatch.setenv("MMFS_TEST_HELD", str(held))
    monkeypatch.setenv("MMFS_TEST_RELEASE", str(release))
    config = _config(tmp_path)
    assert main(["-q", "report", str(config), "-o", str(tmp_path / "cli.html")]) == 0
    try:
        with mounted(config, tmp_path / "mnt") as m:
            page = m.file("report.html")
            assert os.stat(page).st_size == len(BEING_MADE)
            wait_until(held.exists, "page maker child")  # it runs, and waits for the release
            info = yaml.safe_load(m.file("mmfs.json").read_text())
            assert len(m.file("samples/0000000.bin").read_bytes()) == info["bytes_per_sample"]
            assert page.read_bytes() == BEING_MADE and not release.exists()  # the page is still being made
            release.touch()
            assert read_page(page) == (tmp_path / "cli.html").read_bytes()
    finally:
        release.touch()


def test_the_page_is_of_the_config_as_mounted(tmp_path):
    """A config edited after mounting changes neither mmfs.json nor report.html."""
    config = _config(tmp_path)
    assert main(["-q", "report", str(config), "-o", str(tmp_path / "cli.html")]) == 0
    with mounted(config, tmp_path / "mnt") as m:
        cfg = yaml.safe_load(config.read_text())
        cfg["sequence_length"] *= 2
        config.write_text(yaml.safe_dump(cfg))
        data = read_page(m.file("report.html"))
        assert data == (tmp_path / "cli.html").read_bytes()
        manifest = yaml.safe_load(m.file("mmfs.json").read_text())
        assert f"{manifest['tokens_per_sample']:,} tokens per sample".encode() in data


def test_mount_of_a_run_in_phases_serves_its_report(tmp_path):
    from test_report_phases import write

    config = write(tmp_path, "continue")
    with mounted(config, tmp_path / "mnt") as m:
        data = read_page(m.file("report.html"))
        assert main(["-q", "report", str(m.path), "-o", str(tmp_path / "of-mount.html")]) == 0
    assert data == (tmp_path / "of-mount.html").read_bytes()
    assert data.count(b"<h3 class='phase'") == 3


# training blocks with a batch-size schedule (its size rule rides in the pickled snapshot)
SCHEDULES = {
    "step": {"data_parallel_size": 2, "micro_batch_size": 2, "step_batch_size_schedule": "0:8 2048:16"},
    "rampup": {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 16,
               "rampup_batch_size": [8, 4, 64]},
}


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_report_html_of_a_config_with_a_batch_size_schedule_is_the_page(tmp_path, kind):
    path = write_case_config("p2_blend2_u16", tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["training"] = SCHEDULES[kind]
    path.write_text(yaml.safe_dump(cfg))
    assert main(["-q", "report", str(path), "-o", str(tmp_path / "cli.html")]) == 0
    with mounted(path, tmp_path / "mnt") as m:
        data = read_page(m.file("report.html"))
    assert b"could not be made" not in data and b"pickle" not in data
    assert data == (tmp_path / "cli.html").read_bytes()


def test_unmounting_while_the_page_is_made_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """The page maker is held when the mount ends: the child is ended and its private
    folder (the pickled snapshot) removed with it."""
    gate, tmp = tmp_path / "gate", tmp_path / "tmp"
    gate.mkdir()
    tmp.mkdir()
    (gate / "sitecustomize.py").write_text(HOLD)
    held, release = tmp_path / "held", tmp_path / "release"
    monkeypatch.setenv("PYTHONPATH", str(gate))
    monkeypatch.setenv("MMFS_TEST_HELD", str(held))
    monkeypatch.setenv("MMFS_TEST_RELEASE", str(release))
    monkeypatch.setenv("TMPDIR", str(tmp))
    config = _config(tmp_path)
    try:
        with mounted(config, tmp_path / "mnt") as m:
            assert os.stat(m.file("report.html")).st_size == len(BEING_MADE)
            wait_until(held.exists, "page maker child")
            assert [p.name for p in tmp.glob("mmfs-report-*/config.pickle")]  # the child's folder, in use
        assert not list(tmp.iterdir()), list(tmp.rglob("*"))
    finally:
        release.touch()
