"""`mmfs bench` runs (a smoke test: figures are for README.md, not asserted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_blends import write_tiny_blend

from golden_cases import write_case_config
from mmfs.config.schema import load_config
from mmfs.formats import open_dataset
from mmfs.tools.bench_data import make_data
from mount_fixtures import HANG_GUARD, ROOT, is_mounted, mmfs, mounted


def test_bench_a_config_mounts_measures_and_unmounts(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "case")
    proc = mmfs("bench", config, "-n", "20", "--readers", "1,2", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    methods = {r["method"] for r in result["rows"]}
    assert {"mmfs mount", "tmpfs files", "mmfs in-process", "numpy memmap slice"} <= methods
    assert {(r["order"], r["readers"], r["phase"]) for r in result["rows"]} == {
        (o, n, p) for o in ("sequential", "random") for n in (1, 2) for p in ("cold", "warm")}
    assert all(r["samples"] == 20 and r["samples_per_s"] > 0 for r in result["rows"])
    assert result["daemon_memory_after"]["RssAnon"] > 0
    assert not is_mounted(result["mount"])


def test_bench_a_mount_point(tmp_path):
    config = write_case_config("p4_single_multiseq", tmp_path / "case")
    with mounted(config, tmp_path / "mnt") as m:
        proc = mmfs("bench", m.path, "-n", "10", "--readers", "1")
        assert proc.returncode == 0, proc.stderr
        assert "| mmfs mount" in proc.stdout and "| tmpfs files" in proc.stdout
    assert "not a mounted mmfs directory" in mmfs("bench", tmp_path).stderr


def test_make_data_writes_a_dataset_and_configs(tmp_path):
    configs = make_data(str(tmp_path / "data"), tokens=200_000)
    ds = open_dataset(str(tmp_path / "data" / "bench_text_document"))
    assert ds.num_tokens >= 200_000 and ds.dtype.name == "uint16"
    assert int(ds.get(0)[-1]) == 65535  # every document ends with eod
    for path in configs:
        assert load_config(path).sequence_length in (4096, 256)


def test_a_reader_count_past_the_bound_is_one_line(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "config")
    proc = mmfs("bench", config, "-n", "10", "--readers", "999999999999")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "at most 256 reader processes" in proc.stderr, proc.stderr


def _ours(marker: str) -> list[int]:
    """The live processes whose command line holds `marker` (the bench, its readers and
    its daemon are forks of one command line)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(name))
    return found


def _mounts_under(folder) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(folder))]


@pytest.mark.parametrize("how", ["SIGINT-to-group", "SIGINT", "SIGTERM", "SIGINT-twice"])
def test_a_signal_ends_the_bench_its_readers_mount_and_daemon(tmp_path, how):
    """`mmfs bench CONFIG` stopped while its readers read (Ctrl-C at a terminal: SIGINT
    to the whole group; SIGINT or SIGTERM to the bench alone; Ctrl-C twice): it ends
    with one line and exit 128 + the signal, no traceback, and leaves no process of its
    own (readers, daemon), no mount and nothing in its TMPDIR. Before, SIGINT never
    ended it and SIGTERM left the mount, the daemon and the readers."""
    config = Path(write_tiny_blend(tmp_path, 4, documents=300))
    raw = yaml.safe_load(config.read_text())
    raw["samples"]["train"] = 200_000  # passes long enough to be in one when the signal comes
    config.write_text(yaml.safe_dump(raw))
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = dict(os.environ, TMPDIR=str(temporary),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bench = subprocess.Popen([sys.executable, "-m", "mmfs.cli", "bench", str(config), "-n", "20000",
                              "--readers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=env, start_new_session=True)
    try:
        for line in bench.stderr:  # the event: a pass ended, the next one reads
            if "samples/s" in line:
                break
        assert _mounts_under(temporary), "the bench's mount"
        signum = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
        if how == "SIGINT-to-group":
            os.killpg(bench.pid, signum)
        else:
            for _ in range(2 if how == "SIGINT-twice" else 1):
                bench.send_signal(signum)
        _, err = bench.communicate(timeout=HANG_GUARD)  # (a reader left behind would hold stderr open)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
    assert bench.returncode == 128 + signum, err
    assert "Traceback" not in err, err
    assert f"mmfs: bench stopped ({signal.Signals(signum).name}); its readers, its mount and its daemon ended" in err
    assert _ours(str(config)) == []  # no reader, no daemon
    assert _mounts_under(temporary) == []
    assert os.listdir(temporary) == []
