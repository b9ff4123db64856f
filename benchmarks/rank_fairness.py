"""8 ranks reading one mount of a bucket at once: how evenly they progress.

    PYTHONPATH=. python benchmarks/rank_fairness.py [--data DIR] [--gib 0.25]
        [--delay 0.02] [-n 60] [--rounds 2] [--max-requests 16]

The dataset and the store are benchmarks/object_storage.py's (a uint16 .bin in
localbucket on 127.0.0.1, behind the tests' proxy adding `--delay` seconds to
every request); sequence_length 4096, data_parallel_size 8, micro_batch_size 4.
One mount; a thread per rank reads its first `-n` micro-batch files of
ranks/RRR in order, all at once. Printed per round: each rank's seconds to its
last file, the spread (last rank's time ÷ first rank's), samples/s of the node,
and the bytes the daemon fetched ahead for each rank (its log at unmount).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from s3_bench_common import BUCKET, DP, KEY, MBS, ensure_data, localbucket, mmfs_cli, write_config  # noqa: E402
from s3_server import CREDENTIALS, FaultProxy  # noqa: E402

# fusermount3 (fuse3) where installed, else fusermount: either unmounts any FUSE mount.
FUSERMOUNT = shutil.which("fusermount3") or "fusermount"


def one_round(work: Path, proxy: FaultProxy, n: int, max_requests: int, env: dict) -> dict:
    config = write_config(work / "s3.yaml", f"s3://{BUCKET}/{KEY}", work / "indices",
                          {"endpoint_url": proxy.url, "cache_dir": str(work / "storage"),
                           "max_requests": max_requests})
    mmfs_cli("build", config, env=env)
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    log = work / "mount.log"
    out = mmfs_cli("mount", config, mnt, "--log", log, env=env).stdout
    pid = int(re.search(r"daemon pid (\d+)", out).group(1))
    finished = [0.0] * DP
    try:
        def reader(rank: int) -> None:
            folder = mnt / "train" / "ranks" / f"{rank:03d}"
            for name in sorted(os.listdir(folder))[:n]:
                (folder / name).read_bytes()
            finished[rank] = time.perf_counter() - t0

        pool = [threading.Thread(target=reader, args=(r,)) for r in range(DP)]
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        subprocess.run([FUSERMOUNT, "-u", str(mnt)], check=False)
        with contextlib.suppress(ProcessLookupError):
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)
            os.kill(pid, signal.SIGTERM)
    text = log.read_text()
    ahead = json.loads(text.split("bytes per view: ", 1)[1].splitlines()[0]) if "bytes per view: " in text else {}
    return {"finished": finished, "spread": max(finished) / min(finished),
            "samples_per_s": DP * n * MBS / max(finished), "ahead": ahead}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "mmfs-s3-fair"))
    parser.add_argument("--gib", type=float, default=0.25)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("-n", type=int, default=60, help="micro-batch files each rank reads")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-requests", type=int, default=16)
    args = parser.parse_args(argv)
    data = Path(args.data)
    ensure_data(data, args.gib)
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(ROOT)}
    with localbucket(data) as port:
        proxy = FaultProxy(port)
        proxy.delay = args.delay
        try:
            for k in range(args.rounds):
                with tempfile.TemporaryDirectory(dir=data) as tmp:
                    r = one_round(Path(tmp), proxy, args.n, args.max_requests, env)
                print(f"round {k + 1}: ranks done at " + " ".join(f"{s:.1f}" for s in r["finished"])
                      + f" s; last / first {r['spread']:.2f}; {r['samples_per_s']:.0f} samples/s; MB fetched "
                      "ahead per rank " + " ".join(f"{b / 1e6:.1f}" for _, b in sorted(r["ahead"].items())),
                      flush=True)
        finally:
            proxy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
