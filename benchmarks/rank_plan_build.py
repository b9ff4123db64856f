"""What building the rank views' plans adds to building a config's indices.

    python benchmarks/rank_plan_build.py CONFIG [--dp 8] [--mbs 4] [--repeat 3]

Builds the config's indices from scratch (its cache_dir is emptied first, so use a
config whose cache you can lose), then plans every split for each sampler kind
(rankplan.plan_ranks: for cyclic, torch's randperm of the bucket). Prints medians
and the plan time as a share of the index build.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

from mmfs.config.schema import load_config
from mmfs.megatron import open_corpus
from mmfs.megatron.sampling.rankplan import plan_ranks

KINDS = {"single": ("single", True), "cyclic sharded": ("cyclic", True), "cyclic unsharded": ("cyclic", False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--dp", type=int, default=8)
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cache = load_config(args.config).cache_dir
    if cache is None:
        raise SystemExit("give a config with its own cache_dir (it is emptied before each build)")
    build, plans = [], {k: [] for k in KINDS}
    for _ in range(args.repeat):
        shutil.rmtree(cache, ignore_errors=True)
        t = time.perf_counter()
        corpus = open_corpus(args.config, progress=False)
        build.append(time.perf_counter() - t)
        lengths = {name: len(s) for name, s in corpus.splits.items()}
        for kind, (loader, sharding) in KINDS.items():
            t = time.perf_counter()
            for n in lengths.values():
                plan_ranks(n, args.mbs, args.dp, loader, sharding)
            plans[kind].append(time.perf_counter() - t)
    b = statistics.median(build)
    print(f"{args.config}: {lengths} samples; index build {b:.3f} s (median of {args.repeat})")
    for kind, times in plans.items():
        p = statistics.median(times)
        print(f"  plans, {kind}, dp {args.dp} mbs {args.mbs}: {p * 1000:.1f} ms = {100 * p / b:.1f} % of the build")


if __name__ == "__main__":
    main()
