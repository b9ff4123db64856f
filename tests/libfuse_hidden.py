"""Run by tests/test_libfuse.py inside a private mount namespace where one libfuse is
hidden (an empty file bound over it): mount a golden case with `mmfs mount -v`, compare
every sample of every split with Megatron's, and say what the mount used. Prints one
JSON line; exits non-zero (with the reason) if the mount cannot be made."""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from golden_cases import SPLITS, expected_samples, write_case_config  # noqa: E402
from mount_fixtures import Mount, mmfs, stop_mount  # noqa: E402


def loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def max_background(mountpoint: Path) -> int | None:
    """The connection's max_background, from fusectl (mounted by the caller), if there."""
    conn = Path("/sys/fs/fuse/connections") / str(os.minor(os.stat(mountpoint).st_dev)) / "max_background"
    return int(conn.read_text()) if conn.exists() else None


def main(case: str, work: Path, hidden_soname: str, hidden_major: str) -> int:
    config = write_case_config(case, work)
    mountpoint = work / "mnt"
    mountpoint.mkdir(exist_ok=True)
    log = work / "daemon.log"
    result: dict = {"hidden_loads": loads(hidden_soname)}
    os.environ["MMFS_LIBFUSE"] = hidden_major  # forcing the hidden one: refused in one line
    forced = mmfs("mount", config, mountpoint, "--log", log)
    del os.environ["MMFS_LIBFUSE"]
    result["forced_hidden"] = [forced.returncode, forced.stderr.strip().splitlines()]
    proc = mmfs("mount", "-v", config, mountpoint, "--log", log)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr, file=sys.stderr)
        return 1
    pid = int(re.search(r"daemon pid (\d+)", proc.stdout + proc.stderr).group(1))
    m = Mount(mountpoint, pid, log, config)
    try:
        result["said"] = [line for line in proc.stderr.splitlines() if "libfuse" in line]
        info = json.loads((mountpoint / "mmfs.json").read_text())
        dtype = np.dtype(info["dtype"]).newbyteorder("<")
        result["samples"] = result["wrong"] = 0
        for split in SPLITS:
            rows = expected_samples(case, split)
            if rows is None:
                continue
            folder = mountpoint / split / "samples"
            if sorted(os.listdir(folder)) != [f"{i:07d}.bin" for i in range(len(rows))]:
                result["wrong"] += 1
            for i, row in enumerate(rows):
                result["samples"] += 1
                result["wrong"] += (folder / f"{i:07d}.bin").read_bytes() != row.astype(dtype).tobytes()
        result["counters"] = json.loads(os.getxattr(mountpoint, "user.mmfs.counters"))
        result["max_background"] = max_background(mountpoint)
    finally:
        stop_mount(m)
    result["unmounted"] = not os.path.ismount(mountpoint)
    result["log"] = [line for line in log.read_text().splitlines() if " libfuse " in line]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
