"""Ctrl-C during `mmfs build`: the build stops before its next index, says so in one
line, exits 130, and leaves no partial cache file and no lock of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from test_cache_locks import HOLD, lock_of_first_index, mmfs, write_config
from tiny_blends import write_tiny_blend

from mmfs.megatron import open_corpus
from mmfs.megatron.build import builder
from mmfs.megatron.cache.write import TEMP_PREFIX
from mount_fixtures import HANG_GUARD


def leftovers(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.endswith(".lock") or n.startswith(TEMP_PREFIX)]


def test_an_interrupted_threaded_build_starts_no_index_after_it(tmp_path, monkeypatch):
    config = write_tiny_blend(tmp_path, 20)  # 40 GPTDatasets and 2 blends
    builders, calls, after = [], [], []
    real_init, real_build = builder.Builder.__init__, builder.build_gpt_indices

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        builders.append(self)

    def build(*args, **kwargs):
        if builders[-1].stopping.is_set():  # an index begun after the build was given up
            after.append(1)
        calls.append(1)
        if len(calls) == 3:  # Ctrl-C, delivered as the kernel does: to the main thread
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            assert builders[-1].stopping.wait(120), "the build did not stop"
        return real_build(*args, **kwargs)

    monkeypatch.setattr(builder.Builder, "__init__", init)
    monkeypatch.setattr(builder, "build_gpt_indices", build)
    with pytest.raises(KeyboardInterrupt):
        open_corpus(config, progress=False, jobs=2)
    # once the build is given up no index begins, but for the one another thread may have
    # checked for just before (what ran between Ctrl-C and then depends on thread speed)
    assert len(after) <= 1, len(after)
    cache = tmp_path / "cache"
    assert leftovers(cache) == []
    assert not [n for n in os.listdir(cache) if n.endswith(".npy")]  # nothing staged was kept


def test_ctrl_c_while_a_build_waits_is_one_line_exit_130_and_leaves_no_lock_of_its_own(tmp_path):
    config = write_config(tmp_path)
    held = lock_of_first_index(tmp_path, config)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, held], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        build = mmfs("-v", "build", str(config), "-j", "2")
        for line in build.stderr:  # the event: it waits for the lock the holder keeps
            if "waiting for the builder holding" in line:
                break
        build.send_signal(signal.SIGINT)
        out, err = build.communicate(timeout=HANG_GUARD)
    finally:
        holder.kill()
        holder.wait()
    assert build.returncode == 130
    lines = err.strip().splitlines()
    assert lines[-1] == "mmfs: build interrupted; nothing half-built was kept in the index cache", err
    assert "Traceback" not in err
    assert leftovers(tmp_path / "cache") == [os.path.basename(held)]  # the holder's, not the build's


# `mmfs build` whose GPTDataset indices take as long as the test says: "forever" (a C
# builder that never returns: Ctrl-C must not wait for it), or "until-stopped" (it
# returns once the build was given up, and its thread goes on to write what it built:
# the files a slow index wrote after Ctrl-C were left behind, 1.2 GB of them).
SLOW_BUILD = """
import sys, threading
from mmfs.megatron.build import builder
from mmfs.cli import main

mode, sys.argv = sys.argv[1], ["mmfs", *sys.argv[2:]]
made, real_init, real_build = [], builder.Builder.__init__, builder.build_gpt_indices

def init(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    made.append(self)

def build(*args, **kwargs):
    sys.stderr.write("an index begun\\n")  # one write: two threads' lines never mixed
    sys.stderr.flush()
    if mode == "forever":
        threading.Event().wait()
    made[-1].stopping.wait()
    return real_build(*args, **kwargs)

builder.Builder.__init__, builder.build_gpt_indices = init, build
sys.exit(main())
"""


@pytest.mark.parametrize("signals", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
@pytest.mark.parametrize("mode", ["forever", "until-stopped"])
def test_ctrl_c_ends_a_build_without_waiting_for_its_index_and_leaves_nothing(tmp_path, mode, signals):
    """Ctrl-C (once, or twice at once) while indices are being built: the build ends
    though an index never finishes ("forever"), says so in one line, exit 130, no
    traceback; nothing is left in the cache, also where the index's thread goes on to
    write what it built after the signal ("until-stopped")."""
    config = write_tiny_blend(tmp_path, 6)
    build = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, mode, "-v", "build", config, "-j", "2"],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    begun = 0
    for line in build.stderr:  # the event: indices are being built
        if line.startswith("an index begun"):
            begun += 1
            break
    for _ in range(signals):
        build.send_signal(signal.SIGINT)
    try:
        _, err = build.communicate(timeout=HANG_GUARD)
    finally:
        build.kill()
    assert build.returncode == 130, err
    assert "Traceback" not in err, err
    # said once (a line of an index begun before the signal may still come after it)
    assert err.count("mmfs: build interrupted; nothing half-built was kept in the index cache") == 1, err
    begun += err.count("an index begun")
    assert begun <= 2  # no index begun after the signal: the two threads' first, at most
    cache = tmp_path / "cache"
    assert leftovers(cache) == []
    assert not [n for n in os.listdir(cache) if n.endswith(".npy")]
