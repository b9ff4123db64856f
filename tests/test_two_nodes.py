"""A job on two nodes reading one bucket (issue 32 item 3), as two mounts of one
config on this machine (tests/two_nodes.py): a shared index cache folder and, per
node, its own proxy in front of the bucket, its own range cache and its own mount,
read only by that node's data-parallel ranks. Each node fetches only what its ranks
read, one build of each index serves both nodes, and every byte is the local
mount's."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading

import pytest
from s3_server import FaultProxy, MotoServer, environment, use_test_credentials
from two_nodes import BUCKET, ROOT, Node, job_config, read_ranks, summary, write_dataset

from mmfs.megatron.cache.locks import try_lock
from mount_fixtures import mounted, wait_gone

DP, MBS, SEQ = 4, 2, 1024
RANKS = {"a": [0, 1], "b": [2, 3]}  # node -> its data-parallel ranks
# micro-batches each rank reads: 120 x 2 x 1025 tokens x 2 bytes, 492 KB a rank; what
# each window fetches ahead past the last read stays in 1.2 with the default prefetch
# (64 MiB): a window holds at most a tenth of what its reader read (mount/prefetch.py)
FILES = 120


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A 2 M-token uint16 dataset (4 MB) on local disk and in the bucket."""
    prefix = write_dataset(tmp_path_factory.mktemp("two-nodes") / "data", 2_000_000)
    server = MotoServer()
    for suffix in (".bin", ".idx"):
        server.put(BUCKET, f"data/toks{suffix}", prefix.with_suffix(suffix).read_bytes())
    yield server, prefix
    server.stop()


def _train_lock(config, server, tmp_path) -> str:
    """The lock file name of the config's train index: a build of the config into a
    scratch folder names its files (the names do not depend on the folder)."""
    scratch = tmp_path / "scratch.yaml"
    text = config.read_text().replace(str(tmp_path / "shared-cache"), str(tmp_path / "scratch-cache"))
    scratch.write_text(text)
    env = environment({"AWS_ENDPOINT_URL": server.url, "XDG_CACHE_HOME": str(tmp_path / "scratch-home"),
                       "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-m", "mmfs.cli", "build", str(scratch)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    (description,) = (tmp_path / "scratch-cache").glob("*-GPTDataset-train-description.txt")
    return str(tmp_path / "shared-cache" / description.name.replace("-description.txt", ".lock"))


def test_two_nodes_fetch_only_their_ranks_share_one_build_and_read_the_local_bytes(tmp_path, bucket, monkeypatch):
    server, prefix = bucket
    use_test_credentials(monkeypatch)
    (tmp_path / "shared-cache").mkdir()
    config = job_config(tmp_path / "job.yaml", f"s3://{BUCKET}/data/toks", tmp_path / "shared-cache", SEQ, DP, MBS)
    local = job_config(tmp_path / "local.yaml", str(prefix), tmp_path / "local-cache", SEQ, DP, MBS)
    lock_path = _train_lock(config, server, tmp_path)
    nodes = {name: Node(name, FaultProxy(server.port), tmp_path / f"node-{name}") for name in RANKS}
    with contextlib.ExitStack() as stack:
        for node in nodes.values():
            stack.callback(node.proxy.close)
            stack.callback(node.unmount)
        # A builder holds the train index (as a node that got there first would):
        # both nodes build what is free, then wait for it, each saying so.
        held = try_lock(lock_path)
        assert held is not None
        try:
            for node in nodes.values():
                node.start_mount(config)
            for node in nodes.values():
                node.wait_for_line(f"waiting for the builder holding {lock_path}")
        finally:
            held.release()
        # now one of them takes the lock and builds it; the other loads it (from the cache,
        # or after waiting for that builder too)
        outputs = {name: node.wait_mounted() for name, node in nodes.items()}
        counts = {name: summary(text) for name, text in outputs.items()}
        total = counts["a"][0]
        assert total == 3 and all(t == total and built + cached == total for t, built, cached in counts.values())
        assert sum(built for _t, built, _c in counts.values()) == total, counts  # each index built once
        local_mount = stack.enter_context(mounted(local, tmp_path / "local-mnt")).path
        reads: dict = {}
        threads = [threading.Thread(target=lambda n=name: reads.__setitem__(
            n, read_ranks(nodes[n].mnt, RANKS[n], DP, MBS, FILES, local_mount))) for name in nodes]
        for t in threads:  # both nodes read at once, as a job's nodes do
            t.start()
        for t in threads:
            t.join()
        for node in nodes.values():  # the daemons gone, what each proxy counted is all it passed on
            node.unmount()
            assert wait_gone(node.pid)
    for name, node in nodes.items():
        assert reads[name]["wrong_files"] == 0
        assert reads[name]["served"] == len(RANKS[name]) * FILES * MBS * (SEQ + 1) * 2
        assert 0 < node.proxy.ranged_bytes <= 1.2 * reads[name]["served"], (name, node.proxy.ranged_bytes, reads)
