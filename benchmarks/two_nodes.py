"""A training job's two nodes reading one bucket, on this machine (issue 32 item 3).

One config whose dataset is in a bucket (moto's S3 server, 127.0.0.1), one index
cache folder both nodes share (cache_dir, as on a cluster file system), and per node
its own proxy in front of the bucket (tests/s3_server.py's FaultProxy, counting that
node's requests; --delay adds latency to each), its own range cache and its own
mount (tests/two_nodes.py). Both nodes mount at once into an empty cache, then each
node's ranks read their train streams at once, through the files the Megatron
provider reads (`streams/dp=D,mbs=M,from=0/RRR/`), checked against a mount of the
same data from local disk. Then, in the same run, one node alone mounts the same
config and reads every rank: the baseline the two nodes are compared with.

    python benchmarks/two_nodes.py [--tokens 50000000] [--files 200] [--delay 0.02] [--nodes 2]
        [--prefetch 8MiB|default] [--no-baseline]

Prints, per node: how it got the indices (built, from cache), its mount time, the
bytes its proxy passed on against the bytes its ranks read, its requests and its
samples/s; and the two nodes' samples/s together against the one node's.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from s3_server import FaultProxy, MotoServer  # noqa: E402
from two_nodes import BUCKET, Node, job_config, read_ranks, summary, write_dataset  # noqa: E402


def run_nodes(work: Path, server: MotoServer, config: Path, ranks: dict[str, list[int]], dp: int, mbs: int,
              files: int, delay: float, local: Path) -> dict:
    nodes = {name: Node(name, FaultProxy(server.port), work / f"node-{name}") for name in ranks}
    out: dict = {}
    try:
        for node in nodes.values():
            node.proxy.delay = delay
        start = time.perf_counter()
        for node in nodes.values():
            node.start_mount(config)
        for name, node in nodes.items():
            text = node.wait_mounted()
            out[name] = {"mount_s": time.perf_counter() - start, "indices": summary(text)}
        reads: dict = {}

        def read(name: str) -> None:
            try:
                reads[name] = read_ranks(nodes[name].mnt, ranks[name], dp, mbs, files, local)
            except Exception as exc:  # noqa: BLE001 - shown with the daemon's log below
                reads[name] = exc

        threads = [threading.Thread(target=read, args=(name,)) for name in nodes]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        for name, node in nodes.items():
            if isinstance(reads[name], Exception):
                log = (node.home / "daemon.log").read_text().splitlines()
                raise SystemExit(f"node {name}: {reads[name]}\n" + "\n".join(log[-30:]))
        for node in nodes.values():
            node.unmount()
        for name, node in nodes.items():
            wait_gone(node.pid)
            samples = len(ranks[name]) * files * mbs
            out[name].update(reads[name], fetched=node.proxy.ranged_bytes, requests=node.proxy.ranged_gets,
                             samples_per_s=samples / reads[name]["seconds"])
        out["wall_s"] = wall
        out["samples_per_s"] = sum(len(r) for r in ranks.values()) * files * mbs / wall
    finally:
        for node in nodes.values():
            node.unmount()
            node.proxy.close()
    return out


def wait_gone(pid: int) -> None:
    from mount_fixtures import wait_gone as gone

    if not gone(pid, 30):
        raise RuntimeError(f"daemon {pid} did not exit")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=50_000_000, help="tokens of the dataset (uint16)")
    p.add_argument("--seq", type=int, default=4096, help="sequence_length")
    p.add_argument("--ranks-per-node", type=int, default=4)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--files", type=int, default=100, help="micro-batches each rank reads")
    p.add_argument("--delay", type=float, default=0.02, help="seconds the proxy adds to each request")
    p.add_argument("--prefetch", default="8MiB", help="storage.prefetch of the config (default: the config's own)")
    p.add_argument("--nodes", type=int, default=2, help="nodes of the job, each a mount serving its own ranks")
    p.add_argument("--no-baseline", action="store_true", help="skip the one-node run")
    args = p.parse_args(argv)
    dp = args.nodes * args.ranks_per_node
    ranks = {chr(ord("a") + n): list(range(n * args.ranks_per_node, (n + 1) * args.ranks_per_node))
             for n in range(args.nodes)}
    with tempfile.TemporaryDirectory(prefix="mmfs-two-nodes-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        prefix = write_dataset(work / "data", args.tokens)
        server = MotoServer()
        stack.callback(server.stop)
        for suffix in (".bin", ".idx"):
            server.put(BUCKET, f"data/toks{suffix}", prefix.with_suffix(suffix).read_bytes())
        storage = {"prefetch": args.prefetch} if args.prefetch != "default" else None
        local_cfg = job_config(work / "local.yaml", str(prefix), work / "local-cache", args.seq, dp, args.mbs)
        local = Node("local", FaultProxy(server.port), work / "local")
        stack.callback(local.proxy.close)
        stack.callback(local.unmount)
        local.start_mount(local_cfg)
        local.wait_mounted()
        print(f"dataset: {prefix.with_suffix('.bin').stat().st_size / 1e6:.0f} MB in the bucket, sequence_length "
              f"{args.seq}, {dp} ranks of micro-batches of {args.mbs}, {args.files} micro-batches a rank, "
              f"{args.delay * 1000:.0f} ms added to each request, prefetch {args.prefetch}")
        results = {}
        label_n = f"{args.nodes} nodes"
        runs = [(label_n, ranks)] + ([] if args.no_baseline else [("one node", {"a": list(range(dp))})])
        for label, layout in runs:
            cache = work / f"shared-cache-{label.replace(' ', '-')}"
            config = job_config(work / f"{label.replace(' ', '-')}.yaml", f"s3://{BUCKET}/data/toks", cache,
                                args.seq, dp, args.mbs, storage=storage)
            results[label] = r = run_nodes(work / label.replace(" ", "-"), server, config, layout, dp, args.mbs,
                                           args.files, args.delay, local.mnt)
            print(f"{label}: {r['samples_per_s']:,.1f} samples/s together ({r['wall_s']:.1f} s)")
            for name in layout:
                n = r[name]
                total, built, cached = n["indices"]
                print(f"  node {name} (ranks {layout[name][0]}-{layout[name][-1]}): indices {built} built, {cached} "
                      f"from cache of {total}, mounted in {n['mount_s']:.2f} s; fetched {n['fetched'] / 1e6:.1f} MB "
                      f"for {n['served'] / 1e6:.1f} MB read: {n['fetched'] / n['served']:.3f}; {n['requests']} "
                      f"ranged GETs; {n['samples_per_s']:,.1f} samples/s; {n['wrong_files']} files differ from the "
                      "local mount")
        two = results[label_n]
        if "one node" in results:
            print(f"{args.nodes} nodes / one node, samples/s: "
                  f"{two['samples_per_s'] / results['one node']['samples_per_s']:.2f}x")
        builds = sum(two[n]["indices"][1] for n in ranks)
        print(f"indices built by the {args.nodes} nodes together: {builds} of {two['a']['indices'][0]} (each once)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
