"""The other ways to read a bucket as files, for benchmarks/object_storage_node.py
and object_storage.py:
s3fs-fuse and rclone mount (Debian's `s3fs` and `rclone`), each given the same
disk-cache budget as mmfs, and the readers that read ranks' micro-batches.

A training job reads a mounted `.bin` as megatron-core does with
`--no-mmap-bin-files`: a pread of exactly each piece of each sample. Here that
reading is done by a local mmfs mount whose dataset is the other system's mounted
path (the same pieces, from the same index), so every system is measured with the
same reader and only the way bytes come from the bucket differs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

# fusermount3 (fuse3) where installed, else fusermount: either unmounts any FUSE mount.
FUSERMOUNT = shutil.which("fusermount3") or "fusermount"

# What s3fs keeps free; it starts only with ~50 MB beyond it free (its multipart buffers).
S3FS_RESERVE_MB = 256


def _wait_mounted(path: Path, proc: subprocess.Popen, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.ismount(path):
            return
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} before mounting {path}")
        time.sleep(0.05)
    raise SystemExit(f"{what} did not mount {path} in {seconds:.0f} s")


def _unmount(path: Path, proc: subprocess.Popen) -> None:
    if subprocess.run([FUSERMOUNT, "-u", str(path)], check=False, capture_output=True).returncode:
        # still busy (a reader's daemon exiting): detach it, so no dead mount is left behind
        subprocess.run([FUSERMOUNT, "-u", "-z", str(path)], check=False, capture_output=True)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def budget_folder(work: Path, name: str, budget: int):
    """A tmpfs of `budget` bytes plus S3FS_RESERVE_MB. s3fs's cache has no size limit of
    its own, only `ensure_diskfree` (MB to leave free), and it refuses to start unless
    that much and its multipart buffers fit: with ensure_diskfree = S3FS_RESERVE_MB its
    cache can fill `budget` bytes of this folder and no more."""
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    size = budget + (S3FS_RESERVE_MB << 20)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@contextlib.contextmanager
def s3fs_mount(endpoint: str, bucket: str, mnt: Path, work: Path, budget: int, credentials: dict):
    """s3fs-fuse with its disk cache (`use_cache`) in a folder of `budget` bytes."""
    mnt.mkdir(parents=True, exist_ok=True)
    passwd = work / "s3fs.passwd"
    passwd.write_text(f"{credentials['AWS_ACCESS_KEY_ID']}:{credentials['AWS_SECRET_ACCESS_KEY']}\n")
    passwd.chmod(0o600)
    with budget_folder(work, "s3fs-cache", budget) as cache:
        proc = subprocess.Popen(
            ["s3fs", bucket, str(mnt), "-f", "-o", f"url={endpoint}", "-o", "use_path_request_style",
             "-o", f"passwd_file={passwd}", "-o", f"use_cache={cache}", "-o", f"ensure_diskfree={S3FS_RESERVE_MB}",
             "-o", "ro", "-o", "allow_other"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_mounted(mnt, proc, "s3fs")
            yield proc
        finally:
            _unmount(mnt, proc)


@contextlib.contextmanager
def rclone_mount(endpoint: str, bucket: str, mnt: Path, work: Path, budget: int, credentials: dict):
    """rclone mount with `--vfs-cache-mode full` and `--vfs-cache-max-size` the budget."""
    mnt.mkdir(parents=True, exist_ok=True)
    # rclone's S3 library reads AWS_* itself (AWS_CA_BUNDLE breaks its transport): only ours
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
           "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint, "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
           "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": credentials["AWS_ACCESS_KEY_ID"],
           "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": credentials["AWS_SECRET_ACCESS_KEY"],
           "RCLONE_CONFIG_BENCH_REGION": credentials.get("AWS_REGION", "us-east-1")})
    cache = work / "rclone-cache"
    proc = subprocess.Popen(
        ["rclone", "mount", f"bench:{bucket}", str(mnt), "--read-only", "--vfs-cache-mode", "full",
         "--vfs-cache-max-size", str(budget), "--cache-dir", str(cache), "--allow-other"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_mounted(mnt, proc, "rclone")
        yield proc
    finally:
        _unmount(mnt, proc)


def read_ranks(rank_dirs: list[Path], n: int, seconds: float | None = None, workers: int = 1) -> dict:
    """Read the first `n` files of every rank folder at once, each in order (as a
    rank's DataLoader does): one thread a rank, or `workers` a rank, worker w reading
    files w, w + workers, ... (a DataLoader's workers); with `seconds`, a rank starts
    no file after that long (a system far slower than the others ends in bounded
    time). Returns the wall time, each rank's finish time, the files and the bytes read."""
    finished = [0.0] * len(rank_dirs)
    served = [0] * len(rank_dirs) * workers
    files = [0] * len(rank_dirs) * workers
    waited = [0.0] * len(rank_dirs) * workers  # seconds spent in each file's open and read
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = time.perf_counter()

    def rank(i: int, w: int) -> None:
        k = i * workers + w
        try:
            names = sorted(os.listdir(rank_dirs[i]))[:n][w::workers]
            for name in names:
                if seconds is not None and time.perf_counter() - start > seconds:
                    break
                began = time.perf_counter()
                with open(rank_dirs[i] / name, "rb", buffering=0) as f:  # no isatty: two requests a file
                    served[k] += len(f.read())
                waited[k] += time.perf_counter() - began
                files[k] += 1
            with lock:
                finished[i] = max(finished[i], time.perf_counter() - start)
        except BaseException as exc:  # reported once all threads end
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(i, w)) for i in range(len(rank_dirs)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {"seconds": max(finished), "finished": finished, "served_bytes": sum(served), "files": sum(files),
            "file_ms": 1000 * sum(waited) / max(1, sum(files))}

