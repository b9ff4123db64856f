"""What the object-storage benchmarks share: the dataset in a bucket folder, the
localbucket server, an mmfs config, mount and CLI, and /proc readings of a process
(CPU seconds, peak RSS). Used by object_storage.py, object_storage_node.py,
mount_alternatives.py, rank_fairness.py and s3_clients.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from s3_server import CREDENTIALS, free_port  # noqa: E402

BUCKET, KEY = "bench", "big"
SEQ, DP, MBS = 4096, 8, 4


def ensure_data(folder: Path, gib: float) -> Path:
    """<folder>/<bucket>/big.bin and .idx: random uint16 tokens, documents of 200-8000."""
    prefix = folder / BUCKET / KEY
    if prefix.with_suffix(".idx").exists() and prefix.with_suffix(".bin").stat().st_size >= gib * (1 << 30):
        return prefix
    from mmfs.formats.writer import IndexedDatasetWriter

    prefix.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tokens = int(gib * (1 << 30)) // 2
    with IndexedDatasetWriter(str(prefix.with_suffix(".bin")), dtype=np.uint16) as w:
        done = 0
        while done < tokens:
            lengths = rng.integers(200, 8000, 1000)
            block = rng.integers(0, 50000, int(lengths.sum()), dtype=np.uint16)
            for piece in np.split(block, np.cumsum(lengths)[:-1]):
                w.add_item(piece)
                w.end_document()
            done += block.size
        w.finalize(str(prefix.with_suffix(".idx")))
    return prefix


@contextlib.contextmanager
def localbucket(root: Path):
    if importlib.util.find_spec("localbucket") is None:  # its process would die unseen (output to /dev/null)
        sys.exit("the benchmark's bucket is served by localbucket: pip install localbucket")
    port = free_port()
    # TCP_NODELAY: its headers and body go out in two writes, and Nagle's algorithm
    # would hold the body for the client's delayed ACK (40 ms a request)
    # and a listen backlog for bursts of new connections (5: a SYN dropped, resent after 1 s)
    launch = ("import sys, http.server, localbucket; localbucket.S3Handler.disable_nagle_algorithm = True; "
              "http.server.ThreadingHTTPServer.request_queue_size = 128; "
              "sys.argv[0] = 'localbucket'; localbucket.main()")
    proc = subprocess.Popen([sys.executable, "-c", launch, str(root), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def s3_client(endpoint: str, connections: int = 10):
    import boto3
    import botocore.config

    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=botocore.config.Config(
        max_pool_connections=connections, s3={"addressing_style": "path"}))


def write_config(path: Path, dataset: str, indices: Path, storage: dict | None = None) -> Path:
    """An mmfs config of `dataset` (s3:// or a path) read as the benchmarks' GPT samples."""
    config = {"datasets": [{"path": dataset}], "split": "100,0,0", "sequence_length": SEQ,
              "tokenizer": {"eod": 0, "pad": None}, "cache_dir": str(indices),
              "training": {"data_parallel_size": DP, "micro_batch_size": MBS}}
    if storage:
        config["storage"] = storage
    path.write_text(json.dumps(config))
    return path


def mmfs_env() -> dict:
    """The environment of mmfs's processes: the bucket's credentials instead of any AWS_*
    of this shell (this process's boto3 clients get them too), this tree on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDENTIALS)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    os.environ.update(CREDENTIALS)
    return env


def mmfs_cli(*args: str, env: dict, tree: Path = ROOT) -> subprocess.CompletedProcess:
    # run in the tree: `python -m` puts the working folder first on the path
    done = subprocess.run([sys.executable, "-m", "mmfs.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=tree)
    if done.returncode:
        raise SystemExit(f"mmfs {args[0]} failed: {done.stderr.strip()}")
    return done


@contextlib.contextmanager
def mmfs_mount(config: Path, mnt: Path, env: dict, tree: Path = ROOT, options: str = ""):
    """Build and mount (with `-o options`) with the mmfs of `tree`; yields (daemon pid,
    seconds to build, seconds to mount)."""
    t0 = time.perf_counter()
    mmfs_cli("build", config, env=env, tree=tree)
    built = time.perf_counter() - t0
    mnt.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    extra = ("-o", options) if options else ()
    out = mmfs_cli("mount", config, mnt, "--log", mnt.parent / f"{mnt.name}.log", *extra, env=env, tree=tree).stdout
    mounted = time.perf_counter() - t0
    pid = int(re.search(r"daemon pid (\d+)", out).group(1))
    try:
        yield pid, built, mounted
    finally:
        subprocess.run(["fusermount", "-u", str(mnt)], check=False, capture_output=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        for _ in range(200):  # gone, so the folder it read (s3fs's, rclone's) can be unmounted
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and every process below it (a daemon's helpers too)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
        todo += children.get(p, [])
    return total


def rss_peak(pid: int) -> int:
    """A process's peak resident bytes (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def disk_bytes(folder: Path) -> int:
    return sum(os.stat(os.path.join(d, n)).st_blocks * 512 for d, _, ns in os.walk(folder) for n in ns)
