"""Benchmark of index building (a program, not a test):

    python benchmarks/index_build.py [--docs 20000000] [--repeat 3] [--dir TMP]

On the issue's workload (documents of 1..2000 tokens, uniform; sequence_length
4096) it times, side by side in one run and interleaved:
  1. the sample index: mmfs's C vs megatron-core's helpers_cpp;
  2. the whole train split (document, sample and shuffle index): mmfs vs
     megatron-core's own GPTDataset functions;
and, through a real config on a generated dataset (sparse .bin), the time and
resident memory of re-opening a built config from its cache (in a fresh process).
megatron-core columns are skipped when it is not importable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from mmfs.formats.writer import write_index
from mmfs.megatron.indices.gpt import (
    GptParams,
    build_document_index,
    build_gpt_indices,
    build_sample_index,
    plan_epochs,
)

SEQ_LEN = 4096
SEED = 1234


def megatron():
    """megatron-core's helpers and GPTDataset module, or None."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets import gpt_dataset, helpers_cpp
    except Exception:  # noqa: BLE001 - any import failure means "not installed"
        return None
    return helpers_cpp, gpt_dataset


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def write_dataset(prefix: str, lengths: np.ndarray) -> None:
    """An MMIDIDX uint16 dataset with these lengths; the .bin is sparse (all zeros)."""
    write_index(prefix + ".idx", np.uint16, lengths, np.arange(len(lengths) + 1, dtype=np.int64))
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.sum(dtype=np.int64)) * 2)


REOPEN = r"""
import json, resource, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
import mmfs.megatron as s
before = rss()
t = time.perf_counter()
corpus = s.open_corpus(sys.argv[1], progress=False)
elapsed = time.perf_counter() - t
corpus.splits["train"].read(12345)
print(json.dumps({"seconds": elapsed, "rss_mb": rss() - before,
                  "from_cache": all(g.from_cache for g in corpus.indices["train"].gpts)}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args(argv)
    meg = megatron()
    rng = np.random.RandomState(0)
    lengths = rng.randint(1, 2001, size=args.docs).astype(np.int32)
    tokens = int(lengths.sum(dtype=np.int64))
    p = GptParams("bench", "train", 0, args.docs, None, SEQ_LEN, SEED, True, True, "100,0,0",
                  [(0, 1.0), None, None], {})
    plan = plan_epochs(p, tokens)
    doc = build_document_index(0, args.docs, 1, np.random.RandomState(SEED), False)
    print(f"workload: {args.docs:,} documents, {tokens:,} tokens, sequence_length {SEQ_LEN}; "
          f"median of {args.repeat}")
    rows = []

    # 1. sample index alone, same inputs.
    ours = timed(lambda: build_sample_index(lengths, doc, p, plan), args.repeat)
    n = build_sample_index(lengths, doc, p, plan).shape[0] - 1
    theirs = None
    if meg:
        helpers_cpp, _ = meg
        theirs = timed(lambda: helpers_cpp.build_sample_idx_int32(
            lengths, doc, SEQ_LEN, 1, tokens, True, 1), args.repeat)
        if not np.array_equal(build_sample_index(lengths, doc, p, plan),
                              helpers_cpp.build_sample_idx_int32(lengths, doc, SEQ_LEN, 1, tokens, True, 1)):
            raise SystemExit("the sample indices differ from megatron-core's")
    rows.append(("sample index", n, ours, theirs))

    # 2. the whole train split.
    ours = timed(lambda: build_gpt_indices(lengths, p, "bench"), args.repeat)
    theirs = None
    if meg:
        helpers_cpp, gd = meg
        from megatron.core.datasets import helpers

        def megatron_train():
            rs = np.random.RandomState(SEED)
            d = gd._build_document_index(np.arange(args.docs, dtype=np.int32), 1, rs, False)
            s = helpers.build_sample_idx(lengths, d, SEQ_LEN, 1, tokens, True, True)
            gd._build_shuffle_index(s.shape[0] - 1, s.shape[0] - 1, rs)

        theirs = timed(megatron_train, args.repeat)
    rows.append(("train split (document + sample + shuffle)", n, ours, theirs))

    print(f"\n{'what':45} {'samples':>10} {'mmfs s':>8} {'megatron s':>11} {'ratio':>6}")
    for what, count, a, b in rows:
        ratio = f"{a / b:6.2f}" if b else "   n/a"
        mb = f"{b:11.3f}" if b else "not installed".rjust(11)
        print(f"{what:45} {count:>10,} {a:8.3f} {mb} {ratio}")

    # 3. re-open a built config from its cache, in a fresh process.
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        write_dataset(os.path.join(tmp, "bench"), lengths)
        config = os.path.join(tmp, "bench.yaml")
        with open(config, "w") as f:
            json.dump({"datasets": [{"path": "bench"}], "split": "100,0,0",
                       "sequence_length": SEQ_LEN, "seed": SEED, "cache_dir": "cache",
                       "tokenizer": {"eod": 0}}, f)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mmfs.cli", "-q", "build", config], check=True,
                       stdout=subprocess.DEVNULL)
        first = time.perf_counter() - t
        reopen = [json.loads(subprocess.run([sys.executable, "-c", REOPEN, config], check=True,
                                            capture_output=True, text=True).stdout)
                  for _ in range(args.repeat)]
        print(f"\nconfig build from scratch (new process, whole pipeline): {first:.2f} s")
        print(f"re-open from cache: {statistics.median(r['seconds'] for r in reopen) * 1000:.1f} ms, "
              f"resident memory +{max(r['rss_mb'] for r in reopen):.1f} MB "
              f"(from cache: {all(r['from_cache'] for r in reopen)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
