"""One rank's micro-batches from a bucket: an mmfs mount against megatron-core's own
S3 reader, and against the server's ceiling.

    PYTHONPATH=. python benchmarks/object_storage.py [--data DIR] [--gib 2.1]
        [--delay 0.02] [-n 200] [--megatron-n 25] [--chunks 268435456,16777216,1048576,65536,16384]
        [--ranks 1,8] [--cache-limit BYTES] [--tree LABEL=PATH ...] [--rounds 1] [--skip-megatron]
        [--others s3fs,rclone]

The bucket is served by localbucket (PyPI; a bucket is a folder and a ranged GET
reads only its range, so it costs the same on a large object as on a small one:
measured first and printed) on 127.0.0.1, behind the tests' proxy
(tests/s3_server.py), which adds `--delay` seconds to every request (a cloud
region's first-byte latency) and counts requests and bytes. The dataset is a
uint16 .bin of `--gib` GiB (written once into `--data`), read as GPT samples of
sequence_length 4096; rank 0 of data_parallel_size 8, micro_batch_size 4.

- mmfs: `mmfs mount` of a config whose dataset is s3://bench/big, `cache_limit` a
  quarter of the dataset unless `--cache-limit`; for each count of `--ranks`, a
  fresh mount whose ranks 000, 001, ... each read their first `-n` micro-batch
  files in order, a thread per rank. Samples/s, how far apart the first and last
  rank finished, bytes fetched ÷ bytes served, requests, connections made, the
  daemon's CPU seconds per GET and per 1,000 samples, its peak RSS, the cache
  folder's size. `--tree LABEL=PATH` mounts with the mmfs of another source tree
  too (an earlier commit's, with its compiled core), in turn, for ratios in one run.
- `--others`: s3fs-fuse and rclone mount (benchmarks/mount_alternatives.py, each
  with a disk cache of `cache_limit`), given the bucket through the same proxy, read
  the same way through an mmfs mount of a local config whose dataset is the path in
  their mount: the requests, bytes and CPU (theirs and the reading daemon's) of the
  same samples. benchmarks/object_storage_node.py sets them beside megatron-core's
  reader and the ceilings for a whole node.
- the ceiling: the very byte ranges mmfs fetched, fetched again by a plain boto3
  client with as many connections as mmfs's max_requests.
- megatron-core 0.19.2: its GPTDataset over the same s3:// prefix (the .idx
  downloaded, the .bin read by _S3BinReader with each `--chunks` size of
  bin_chunk_nbytes, 256 MiB being its default) in a torch DataLoader with 2
  workers and MegatronPretrainingSampler for the same rank; `--megatron-n`
  micro-batches each. Its first micro-batch is checked against mmfs's bytes.
  Needs torch and megatron-core (run with the Python they are in); skipped
  without them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mount_alternatives as alt  # noqa: E402
from s3_bench_common import (  # noqa: E402
    BUCKET,
    DP,
    KEY,
    MBS,
    ROOT,
    SEQ,
    cpu_seconds,
    disk_bytes,
    ensure_data,
    localbucket,
    mmfs_env,
    mmfs_mount,
    rss_peak,
    s3_client,
    write_config,
)
from s3_server import CREDENTIALS, FaultProxy  # noqa: E402


def ranged_get_seconds(client, key: str, size: int, n: int = 40) -> float:
    """Mean seconds of an 8 KiB ranged GET at random offsets of the object."""
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    for offset in rng.integers(0, max(1, size - 8192), n):
        client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={offset}-{offset + 8191}")["Body"].read()
    return (time.perf_counter() - start) / n


def run_mmfs(work: Path, proxy: FaultProxy, n: int, env: dict, ranks: int = 1, cache_limit: int = 0,
             tree: Path = ROOT, label: str = "", dataset: str = f"s3://{BUCKET}/{KEY}", helper: int = 0,
             helper_cache: Path | None = None) -> dict:
    """Mount (mmfs from `tree`), read the first `n` micro-batch files of ranks 0..ranks-1,
    a thread per rank, and measure. `dataset` may be a path in another file system's
    mount (s3fs, rclone) whose process is `helper`: its CPU is counted with the daemon's,
    its RSS and cache folder are reported instead."""
    work = work / f"mmfs-{label}-{ranks}"
    work.mkdir(parents=True, exist_ok=True)
    env = {**env, "PYTHONPATH": str(tree) + os.pathsep + env.get("PYTHONPATH", "")}
    cache = work / "storage"
    storage = {"endpoint_url": proxy.url, "cache_dir": str(cache)}
    if cache_limit:
        storage["cache_limit"] = cache_limit
        storage["prefetch"] = min(64 << 20, cache_limit // 2)
    config = write_config(work / "s3.yaml", dataset, work / "indices", storage)
    mnt = work / "mnt"
    with mmfs_mount(config, mnt, env, tree) as (pid, built, mounted):
        proxy.ranges, proxy.ranged_gets, proxy.ranged_bytes, proxy.gets, proxy.get_bytes = [], 0, 0, 0, 0
        connections = proxy.connections
        firsts: dict[int, bytes] = {}
        took: dict[int, float] = {}
        reads: list[float] = []

        def read_rank(r: int) -> int:
            rank = mnt / "train" / "ranks" / f"{r:03d}"
            served, start = 0, time.perf_counter()
            for name in sorted(os.listdir(rank))[:n]:
                t = time.perf_counter()
                data = (rank / name).read_bytes()
                reads.append(time.perf_counter() - t)
                firsts.setdefault(r, data)
                served += len(data)
            took[r] = time.perf_counter() - start
            return served

        cpu0 = cpu_seconds(pid) + (cpu_seconds(helper) if helper else 0)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(ranks) as pool:
            served = sum(pool.map(read_rank, range(ranks)))
        seconds = time.perf_counter() - t0
        cpu = cpu_seconds(pid) + (cpu_seconds(helper) if helper else 0) - cpu0
        time.sleep(1)  # the prefetcher's requests in flight land in the counts
        samples = n * ranks * MBS
        result = {"build_s": built, "mount_s": mounted, "microbatches": n * ranks, "seconds": seconds,
                  "samples_per_s": samples / seconds, "served_bytes": served,
                  "requests": proxy.gets, "fetched_bytes": proxy.get_bytes,
                  "rss_peak": rss_peak(helper or pid),
                  "cache_bytes": disk_bytes(helper_cache or cache) if helper_cache or not helper else 0, "cpu_s": cpu,
                  "cpu_per_get_ms": 1000 * cpu / max(1, proxy.gets),
                  "cpu_per_1000_samples": 1000 * cpu / samples, "connections": proxy.connections - connections,
                  "spread": (max(took.values()) - min(took.values())) / max(took.values()),
                  "read_ms": np.percentile(reads, [50, 90, 99, 100]) * 1000}
        result["fetched_per_served"] = result["fetched_bytes"] / served
        result["first"] = np.frombuffer(firsts[0], dtype=np.uint16)
        result["ranges"] = list(proxy.ranges)
        proxy.ranges = None
        return result


@contextlib.contextmanager
def other_mount(kind: str, proxy: FaultProxy, work: Path, cache_limit: int):
    """The bucket mounted by s3fs-fuse or rclone (benchmarks/mount_alternatives.py),
    through the proxy, each with a disk cache of `cache_limit` bytes: (mount point,
    its process, its cache folder)."""
    mount = {"s3fs": alt.s3fs_mount, "rclone": alt.rclone_mount}[kind]
    with mount(proxy.url, BUCKET, work / "bucket", work, cache_limit, CREDENTIALS) as proc:
        yield work / "bucket", proc.pid, work / f"{kind}-cache"


def print_mmfs(name: str, m: dict) -> None:
    print(f"{name}: index built in {m['build_s']:.1f} s, mounted in {m['mount_s']:.2f} s; "
          f"{m['microbatches']} micro-batch files in {m['seconds']:.2f} s: {m['samples_per_s']:,.0f} samples/s "
          f"(first and last rank {100 * m['spread']:.0f} % apart); a file's read p50/p90/p99/max "
          f"{'/'.join(f'{t:.0f}' for t in m['read_ms'])} ms")
    print(f"  {m['requests']} requests, fetched {m['fetched_bytes'] / 1e6:.1f} MB for "
          f"{m['served_bytes'] / 1e6:.1f} MB served: {m['fetched_per_served']:.3f}; daemon CPU "
          f"{m['cpu_s']:.2f} s: {m['cpu_per_get_ms']:.2f} ms per GET, {m['cpu_per_1000_samples']:.2f} s per "
          f"1,000 samples; peak RSS {m['rss_peak'] / 1e6:.0f} MB; cache folder {m['cache_bytes'] / 1e6:.1f} MB; "
          f"{m['connections']} connections", flush=True)


def run_ceiling(proxy: FaultProxy, ranges: list[tuple[str, str]], connections: int, work: Path) -> float:
    """Seconds to fetch `ranges` again with a plain client and `connections` threads,
    in a process of its own (this one runs the proxy)."""
    listing = work / "ranges.json"
    listing.write_text(json.dumps(ranges))
    out = subprocess.run([sys.executable, __file__, "--replay", str(listing), "--endpoint", proxy.url,
                          "--max-requests", str(connections)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def replay(listing: str, endpoint: str, connections: int) -> float:
    ranges = json.loads(Path(listing).read_text())
    client = s3_client(endpoint, connections)

    def get(item):
        path, spec = item
        bucket, _, key = path.lstrip("/").partition("/")
        return len(client.get_object(Bucket=bucket, Key=key.split("?")[0], Range=spec)["Body"].read())

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(connections) as pool:
        sum(pool.map(get, ranges))
    return time.perf_counter() - t0


def run_megatron(config_path: Path, work: Path, chunk: int, n: int, first: np.ndarray) -> dict:
    import torch
    from megatron.core.datasets import gpt_dataset
    from megatron.core.datasets.object_storage_utils import ObjectStorageConfig
    from megatron_modules import load_data_samplers

    from mmfs.megatron import open_corpus
    from mmfs.tools.megatron.baseline import megatron_dataset

    gpt_dataset.ObjectStorageConfig = functools.partial(ObjectStorageConfig, bin_chunk_nbytes=chunk)
    corpus = open_corpus(str(config_path), progress=False)
    cache = work / f"megatron-{chunk}"
    ds = megatron_dataset(corpus, "train", str(cache / "indices"), mmap_bin_files=False,  # as --no-mmap-bin-files
                          object_storage_cache_path=str(cache / "idx"))
    sampler = load_data_samplers().MegatronPretrainingSampler(len(ds), 0, MBS, 0, DP)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=2)
    t0 = time.perf_counter()
    count, steady_from = 0, None
    for batch in loader:
        if count == 0:
            steady_from = time.perf_counter()
            got = torch.cat([batch["tokens"], batch["labels"][:, -1:]], dim=1).numpy().astype(np.uint16)
            if not np.array_equal(got.reshape(-1), first):
                raise SystemExit("megatron-core's first micro-batch differs from mmfs's file 0")
        count += 1
        if count == n:
            break
    end = time.perf_counter()
    return {"chunk": chunk, "microbatches": count, "seconds": end - t0,
            "samples_per_s": (count - 1) * MBS / (end - steady_from)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "mmfs-s3-bench"))
    parser.add_argument("--gib", type=float, default=2.1)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("-n", type=int, default=200, help="micro-batch files mmfs reads")
    parser.add_argument("--megatron-n", type=int, default=25, help="micro-batches per megatron-core run")
    parser.add_argument("--chunks", default=f"{256 << 20},{16 << 20},{1 << 20},{64 << 10},{16 << 10}")
    parser.add_argument("--max-requests", type=int, default=16)
    parser.add_argument("--ranks", default="1,8", help="ranks read at once through one mount, each count in turn")
    parser.add_argument("--cache-limit", type=int, default=0, help="bytes (default: a quarter of the dataset)")
    parser.add_argument("--tree", action="append", default=[],
                        help="LABEL=PATH: also mount with the mmfs of another source tree (an earlier commit's)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each mount, the trees taking turns")
    parser.add_argument("--skip-megatron", action="store_true")
    parser.add_argument("--others", default="s3fs,rclone",
                        help="other FUSE mounts of the bucket to read through (benchmarks/mount_alternatives.py, "
                        "each with a disk cache of cache_limit; s3fs starts only with 64 MiB or more)")
    parser.add_argument("--replay", help=argparse.SUPPRESS)  # the ceiling's own process
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replay:
        print(replay(args.replay, args.endpoint, args.max_requests))
        return 0

    root = Path(args.data)
    ensure_data(root, args.gib)
    bin_size = (root / BUCKET / f"{KEY}.bin").stat().st_size
    small = root / BUCKET / "small"
    small.write_bytes(os.urandom(16384))
    env = mmfs_env()
    print(f"dataset: s3://{BUCKET}/{KEY} ({bin_size / (1 << 30):.2f} GiB uint16), S {SEQ}, "
          f"rank 0 of {DP}, micro_batch_size {MBS}; {args.delay * 1000:.0f} ms per request added")
    with localbucket(root) as port, tempfile.TemporaryDirectory(prefix="mmfs-s3-bench-") as tmp:
        work = Path(tmp)
        direct = s3_client(f"http://127.0.0.1:{port}")
        direct.head_object(Bucket=BUCKET, Key=f"{KEY}.bin")  # its first look hashes the object for the ETag
        big_s = ranged_get_seconds(direct, f"{KEY}.bin", bin_size)
        small_s = ranged_get_seconds(direct, "small", 16384)
        print(f"server: an 8 KiB ranged GET takes {big_s * 1000:.1f} ms on the {bin_size >> 20} MiB object, "
              f"{small_s * 1000:.1f} ms on a 16 KiB one (no delay)")
        proxy = FaultProxy(port)
        proxy.delay = args.delay
        env["AWS_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL"] = proxy.url
        limit = args.cache_limit or bin_size // 4
        print(f"cache_limit {limit / (1 << 20):.0f} MiB ({bin_size / limit:.1f}x under the dataset)")
        trees = [("this", ROOT)] + [(t.split("=", 1)[0], Path(t.split("=", 1)[1])) for t in args.tree]
        results: dict[tuple[str, int], list[dict]] = {}
        for ranks in (int(r) for r in args.ranks.split(",")):
            for turn in range(args.rounds):  # the trees take turns, in either order
                for label, tree in trees[::-1] if turn % 2 else trees:
                    r = run_mmfs(work, proxy, args.n, env, ranks, limit, tree, f"{label}-{turn}")
                    results.setdefault((label, ranks), []).append(r)
                    print_mmfs(f"mmfs ({label}), {ranks} rank(s) through one mount", r)
            for label, _ in trees[1:]:
                this, other = results["this", ranks], results[label, ranks]

                def mean(runs: list[dict], key: str) -> float:
                    return sum(r[key] for r in runs) / len(runs)
                print(f"  this / {label}, {ranks} rank(s), mean of {args.rounds}: samples/s "
                      f"{mean(this, 'samples_per_s') / mean(other, 'samples_per_s'):.2f}x, daemon CPU per GET "
                      f"{mean(this, 'cpu_per_get_ms') / mean(other, 'cpu_per_get_ms'):.2f}x", flush=True)
            for kind in [k for k in args.others.split(",") if k]:
                try:
                    with other_mount(kind, proxy, work / f"{kind}-{ranks}", limit) as (mnt, helper, cache):
                        r = run_mmfs(work, proxy, args.n, env, ranks, limit, ROOT, f"over-{kind}",
                                     str(mnt / KEY), helper, cache)
                except (RuntimeError, SystemExit) as exc:
                    print(f"{kind}: skipped ({exc})")
                    continue
                print_mmfs(f"{kind} mount read through a local mmfs mount, {ranks} rank(s)", r)
        m = next(iter(results.values()))[0]
        if m["microbatches"] != args.n:
            return 0
        ceiling_s = run_ceiling(proxy, m["ranges"], args.max_requests, work)
        ceiling = m["microbatches"] * MBS / ceiling_s
        print(f"ceiling: the same {len(m['ranges'])} ranges by boto3 with {args.max_requests} connections "
              f"in {ceiling_s:.2f} s: {ceiling:,.0f} samples/s; mmfs / ceiling {m['samples_per_s'] / ceiling:.2f}")
        try:
            if args.skip_megatron:
                raise ImportError
            import megatron.core  # noqa: F401
            import torch  # noqa: F401
        except ImportError:
            print("megatron-core: not installed here, skipped")
            return 0
        sys.path.insert(0, str(ROOT / "tests" / "reference"))
        runs = []
        for chunk in (int(c) for c in args.chunks.split(",")):
            before = proxy.get_bytes
            r = run_megatron(work / "mmfs-this-0-1" / "s3.yaml", work, chunk, args.megatron_n, m["first"])
            r["fetched_bytes"] = proxy.get_bytes - before
            runs.append(r)
            print(f"megatron-core, bin_chunk_nbytes {chunk:,}: {r['microbatches']} micro-batches in "
                  f"{r['seconds']:.1f} s: {r['samples_per_s']:,.1f} samples/s steady (fetched "
                  f"{r['fetched_bytes'] / 1e6:,.0f} MB); mmfs / it {m['samples_per_s'] / r['samples_per_s']:.1f}x")
        best = max(runs, key=lambda r: r["samples_per_s"])
        default = runs[0]
        print(f"mmfs / megatron-core: {m['samples_per_s'] / default['samples_per_s']:.1f}x at its default chunk, "
              f"{m['samples_per_s'] / best['samples_per_s']:.1f}x at its best ({best['chunk']:,} bytes)")
        proxy.close()
    small.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
