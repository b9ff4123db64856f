"""Benchmark of `mmfs report` at scale (a program, not a test).

    python benchmarks/report_scale.py --root SCRATCH [--datasets 1000] [--docs 20000]
        [--samples 4000000] [--dp 64] [--gbs 512] [--no-browser]

Makes (once) the blend of benchmarks/scale_blend.py with a training: block (data-parallel
size --dp, micro-batch size 1, global batch --gbs), builds its indices, then measures in
fresh processes: `mmfs report --json` (figures only) and `mmfs report -o page.html`
(wall time, CPU seconds, peak memory, output size), and headless Chromium rendering the
page (a screenshot, against a blank page) when `chromium` is installed."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale_blend import check, generate, mmfs_cmd, run  # noqa: E402


def with_training(config: str, dp: int, gbs: int) -> str:
    with open(config) as f:
        spec = json.load(f)
    samples = spec["samples"]["train"]
    spec.pop("samples")
    spec["training"] = {"data_parallel_size": dp, "micro_batch_size": 1, "global_batch_size": gbs,
                        "train_iters": samples // gbs, "eval_interval": samples // gbs, "eval_iters": 10}
    out = config.replace(".yaml", f"-dp{dp}-gbs{gbs}.yaml")
    with open(out, "w") as f:
        json.dump(spec, f)
    return out


def chromium_seconds(url: str) -> float:
    exe = shutil.which("chromium")
    profile = tempfile.mkdtemp()
    t = time.perf_counter()
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=60000",
                    "--window-size=1200,1600", f"--screenshot={profile}/shot.png", url],
                   capture_output=True, timeout=600)
    seconds = time.perf_counter() - t
    shutil.rmtree(profile, ignore_errors=True)
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--datasets", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--samples", type=int, default=4_000_000)
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--gbs", type=int, default=512)
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.root, exist_ok=True)
    config = with_training(generate(args.root, args.datasets, args.docs, args.samples, "cache"), args.dp, args.gbs)
    print(f"config: {config}", flush=True)
    check(run(mmfs_cmd("-q", "build", config)), "build")
    figures = check(run(mmfs_cmd("-q", "report", config, "--json")), "report --json")
    print(f"mmfs report --json: {figures['seconds']:.2f} s, {figures['cpu']:.2f} CPU-s, "
          f"{figures['rss_mb']:.0f} MB peak, {len(figures['out']) / 1e6:.2f} MB of JSON")
    page = os.path.join(args.root, "report.html")
    made = check(run(mmfs_cmd("-q", "report", config, "-o", page)), "report -o")
    print(f"mmfs report -o: {made['seconds']:.2f} s, {made['cpu']:.2f} CPU-s, {made['rss_mb']:.0f} MB peak, "
          f"page {os.path.getsize(page) / 1e6:.2f} MB")
    if not args.no_browser and shutil.which("chromium"):
        blank = os.path.join(args.root, "blank.html")
        with open(blank, "w") as f:
            f.write("<!DOCTYPE html><html><body>blank</body></html>")
        b, p = chromium_seconds(f"file://{blank}"), chromium_seconds(f"file://{page}")
        print(f"headless chromium screenshot: page {p:.2f} s, blank page {b:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
