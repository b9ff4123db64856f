"""megatron-core's own data loader against mmfs.loader, for one data-parallel rank.

    python benchmarks/megatron_loader.py CONFIG_OR_MOUNT [--rank 0] [--dp 8] [--mbs 4]
                                        [-n 300] [--num-workers 2] [--mount MOUNT]

Times what a Megatron rank's data loader does: megatron-core 0.19.2's GPTDataset
(built by BlendedMegatronDatasetBuilder for the same config) in a torch DataLoader
with MegatronPretrainingSampler as its batch sampler and `--num-workers` workers
(2 by default), over `-n` micro-batches. With a mount that serves rank views
(`--mount`, or a mount given as the target), it then times Mount.megatron_batches for
the same rank and micro-batches, checks that both give the same tensors, and prints
the ratio. Needs torch and megatron-core (run it with the Python they are installed
in, with mmfs importable, e.g. PYTHONPATH=<mmfs checkout>). The micro-batch size and
data-parallel size default to the config's training: block, else 4 and 8.
Figures are samples/s, steady state (after the first micro-batch, which includes
starting the workers) and overall.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reference"))

FLAGS = ("eod_mask_loss", "reset_position_ids", "reset_attention_mask", "create_attention_mask")


def _config_of(target: str) -> tuple[str, str | None]:
    """(config path, mount or None) of a CONFIG or a MOUNT."""
    if os.path.isdir(target):
        with open(os.path.join(target, "mmfs.json")) as f:
            return json.load(f)["config_path"], target
    return target, None


def _timed(batches, n: int, check=None) -> dict[str, float]:
    start = time.perf_counter()
    first = None
    count = 0
    for batch in batches:
        if check is not None:
            check(count, batch)
        count += 1
        if first is None:
            first = time.perf_counter()
        if count == n:
            break
    end = time.perf_counter()
    return {"microbatches": count, "total_s": end - start, "steady_s": end - first if first else 0.0}


def megatron_loader(corpus, split: str, rank: int, dp: int, mbs: int, workers: int, cache: str, flags: dict):
    import torch
    from megatron_modules import load_data_samplers

    from mmfs.tools.megatron.baseline import megatron_dataset

    ds = megatron_dataset(corpus, split, cache)
    for name, value in flags.items():
        setattr(ds.config, name, value)
    if any(flags.get(k) for k in FLAGS[:3]):
        ds.masks_and_position_ids_are_cacheable = False
    samplers = load_data_samplers()
    sampler = samplers.MegatronPretrainingSampler(len(ds), 0, mbs, rank, dp)
    return torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=workers, pin_memory=False,
                                       persistent_workers=workers > 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a YAML config or an mmfs mount")
    parser.add_argument("--split", default="train")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--dp", type=int, help="data_parallel_size (default: the config's, else 8)")
    parser.add_argument("--mbs", type=int, help="micro_batch_size (default: the config's, else 4)")
    parser.add_argument("-n", "--microbatches", type=int, default=300)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--mount", help="also time Mount.megatron_batches through this mount")
    parser.add_argument("--sample-files", action="store_true",
                        help="with a mount without rank views: time Mount.megatron_batch over the rank's "
                        "sample files instead (the same samples, one file each)")
    parser.add_argument("--flag", action="append", default=[], choices=FLAGS, help="a GPTDataset flag to turn on")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from mmfs.megatron import open_corpus

    config_path, mount = _config_of(args.target)
    mount = args.mount or mount
    corpus = open_corpus(config_path, progress=False)
    t = corpus.config.training
    dp = args.dp or (t.data_parallel_size if t else 8)
    mbs = args.mbs or (t.micro_batch_size if t else 4)
    flags = dict.fromkeys(args.flag, True)
    result: dict = {"config": config_path, "split": args.split, "rank": args.rank, "data_parallel_size": dp,
                    "micro_batch_size": mbs, "num_workers": args.num_workers, "flags": sorted(flags),
                    "sequence_length": corpus.sequence_length}
    with tempfile.TemporaryDirectory(prefix="mmfs-megatron-loader-") as cache:
        loader = megatron_loader(corpus, args.split, args.rank, dp, mbs, args.num_workers, cache, flags)
        kept = []

        def keep(i, batch):
            if i < 3:
                kept.append({k: v.numpy().copy() for k, v in batch.items()})

        result["megatron"] = _timed(iter(loader), args.microbatches, keep)
        del loader
    if mount:
        from mmfs.loader import Mount

        m = Mount(mount)

        def same(i, batch):
            if i < len(kept):
                for k, v in kept[i].items():
                    if not np.array_equal(batch[k], v):
                        raise SystemExit(f"micro-batch {i}: {k} differs between megatron-core and mmfs")

        if args.sample_files:
            from mmfs.megatron.sampling.rankplan import microbatch_ids, plan_ranks

            plan = plan_ranks(m.samples[args.split], mbs, dp)
            batches = (m.megatron_batch(args.split, microbatch_ids(plan, args.rank, j).tolist(), **flags)
                       for j in range(plan.files_per_rank))
            result["mmfs_source"] = "sample files (Mount.megatron_batch)"
            result["mmfs"] = _timed(batches, args.microbatches, same)
        elif not m.training or (m.training["data_parallel_size"], m.training["micro_batch_size"]) != (dp, mbs):
            result["mmfs_note"] = "the mount serves no rank views for this dp / mbs (try --sample-files)"
        else:
            result["mmfs_source"] = "micro-batch files (Mount.megatron_batches)"
            result["mmfs"] = _timed(m.megatron_batches(args.split, args.rank, **flags), args.microbatches, same)
    for key in ("megatron", "mmfs"):
        if key in result:
            r = result[key]
            r["samples_per_s_steady"] = (r["microbatches"] - 1) * mbs / r["steady_s"] if r["steady_s"] else 0.0
            r["samples_per_s_total"] = r["microbatches"] * mbs / r["total_s"]
    if "mmfs" in result:
        result["ratio_steady"] = result["mmfs"]["samples_per_s_steady"] / result["megatron"]["samples_per_s_steady"]
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{config_path}: {args.split}, rank {args.rank} of {dp}, micro_batch_size {mbs}, "
          f"S {corpus.sequence_length}, flags {sorted(flags) or 'none'}")
    for key, label in (("megatron", f"megatron-core DataLoader ({args.num_workers} workers)"),
                       ("mmfs", f"mmfs, {result.get('mmfs_source')}")):
        if key in result:
            r = result[key]
            print(f"  {label}: {r['microbatches']} micro-batches, {r['samples_per_s_steady']:,.0f} samples/s "
                  f"steady, {r['samples_per_s_total']:,.0f} overall ({r['total_s']:.2f} s)")
    if "ratio_steady" in result:
        print(f"  mmfs / megatron-core (steady): {result['ratio_steady']:.2f}x")
    if "mmfs_note" in result:
        print(f"  mmfs: {result['mmfs_note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
