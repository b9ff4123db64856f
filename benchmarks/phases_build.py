"""Phases benchmark (a program, not a test): a run in phases over the scale
benchmark's blend of 1,000 datasets (benchmarks/scale_blend.py).

    python benchmarks/phases_build.py --root SCRATCH [--datasets 1000] [--docs 20000]
        [--samples 4000000] [--jobs 2] [--repeat 3] [--modes continue,restart]

Writes, beside the scale blend's config (no phases), the same blend as one phase and as four
phases (boundaries at 1/4, 1/2 and 3/4 of the train samples; each later phase
re-weights the datasets, the third drops a tenth of them and the fourth adds them
back), then measures in fresh processes, interleaved round by round on empty caches:
`mmfs build` of no phases, of one phase, of four phases (each phase mode asked for), and the
re-open of each from its cache. Prints wall time, peak memory and CPU seconds and
the ratio four phases / one phase of each round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale_blend import check, fresh_cache, generate, mmfs_cmd, old_caches, row, run, set_aside  # noqa: E402


def phased_config(config: str, phases: int, mode: str) -> str:
    """The scale config's blend as `phases` phases (in `mode`), its own cache folder."""
    with open(config) as f:
        spec = json.load(f)
    datasets, total = spec.pop("datasets"), spec["samples"]["train"]
    rng = np.random.RandomState(phases)
    out = []
    for k in range(phases):
        entries = [dict(d) for d in datasets]
        if k:
            for d in entries:
                d["weight"] = round(float(rng.uniform(0.1, 3.0)), 4)
        if k == 2:
            entries = entries[: len(entries) * 9 // 10]
        phase = {"datasets": entries}
        if k:
            phase["start_samples"] = total * k // phases
        out.append(phase)
    spec.update(phases=out, phase_mode=mode, cache_dir=f"cache-phases-{phases}-{mode}")
    path = config.replace(".yaml", f"-phases{phases}-{mode}.yaml")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="scratch folder (datasets and caches)")
    ap.add_argument("--datasets", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--samples", type=int, default=4_000_000, help="train samples")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="continue,restart")
    args = ap.parse_args()
    os.makedirs(args.root, exist_ok=True)
    base = generate(args.root, args.datasets, args.docs, args.samples, "cache")
    one = phased_config(base, 1, "continue")
    configs = {"1 phase": one, "no phases": base}
    for mode in args.modes.split(","):
        configs[f"4 phases, {mode}"] = phased_config(base, 4, mode)
    print(f"blend: {args.datasets} datasets x {args.docs} documents, {args.samples:,} train samples; "
          f"-j {args.jobs}; {args.repeat} rounds", flush=True)
    times: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.repeat):
        print(f"round {r + 1}: cold build (empty cache), then re-open")
        for name, config in configs.items():
            fresh_cache(config)
            built = check(run(mmfs_cmd("-q", "build", config, "-j", str(args.jobs))), f"build {name}")
            times[name].append(built["seconds"])
            cpu[name].append(built["cpu"])
            row(f"build, {name}", built, f"({built['seconds'] / times['1 phase'][-1]:.2f}x one phase)")
            again = check(run(mmfs_cmd("-q", "build", config)), f"re-open {name}")
            row(f"re-open, {name}", again)
    print("median build against one phase (time, then CPU: on a busy machine CPU-s are the steadier):")
    for name in configs:
        ratios = [t / o for t, o in zip(times[name], times["1 phase"])]
        cpu_ratios = [t / o for t, o in zip(cpu[name], cpu["1 phase"])]
        print(f"  {name:24} {statistics.median(times[name]):6.2f} s  {statistics.median(ratios):.2f}x   "
              f"{statistics.median(cpu[name]):5.1f} CPU-s  {statistics.median(cpu_ratios):.2f}x")
    for config in configs.values():
        set_aside(config, fresh_cache(config))
    shutil.rmtree(old_caches(base), ignore_errors=True)


if __name__ == "__main__":
    main()
