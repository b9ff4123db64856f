"""`mmfs preprocess` speed and memory, in one run.

Repeats the reference corpus (tests/golden/preprocess) to about --mb MB, runs
`mmfs preprocess` with the golden Hugging Face tokenizer and --append-eod, and prints
documents/s, MB/s, CPU time and the peak memory of the whole process tree (parent +
workers; RSS summed, and PSS, which counts shared pages once). CPU time depends less
than wall time on what else the machine runs. With --megatron-python, also
runs benchmarks/megatron_baseline.py (Megatron's per-document path with
megatron-core's own classes) on the same input, the two taking turns (--rounds),
checks the outputs are byte-identical and prints the ratio of the median times.
Several sizes (--mb 50,500) show that memory does not grow with the input.

With --types, the tokenizer types of tests/golden/preprocess/tokenizers too (their corpus
repeated; NullTokenizer's own corpus of ids), each beside megatron-core's class for it.

    python benchmarks/preprocess.py [--mb 50,500] [--workers 2] [--megatron-python PY]
        [--types HuggingFaceTokenizer,GPT2BPETokenizer,SentencePieceTokenizer,TikTokenizer,NullTokenizer]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "preprocess"
TOKENIZERS = GOLDEN / "tokenizers"
# Each type's input corpus and mmfs flags (the models recorded in tests/golden/preprocess/tokenizers).
TYPES = {
    "HuggingFaceTokenizer": (GOLDEN / "corpus.jsonl", ["--tokenizer-model", str(GOLDEN / "hf_tokenizer")]),
    "GPT2BPETokenizer": (TOKENIZERS / "corpus.jsonl", ["--vocab-file", str(TOKENIZERS / "gpt2-vocab.json"),
                                                        "--merge-file", str(TOKENIZERS / "gpt2-merges.txt")]),
    "SentencePieceTokenizer": (TOKENIZERS / "corpus.jsonl", ["--tokenizer-model", str(TOKENIZERS / "sp.model")]),
    "TikTokenizer": (TOKENIZERS / "corpus.jsonl", ["--tokenizer-model", str(TOKENIZERS / "tiktoken.json"),
                                                    "--vocab-size", "2200"]),
    "NullTokenizer": (TOKENIZERS / "null_corpus.jsonl", ["--vocab-size", "70000"]),
}


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return out


def memory_kb(pids: list[int]) -> tuple[int, int]:
    """(summed RSS, summed PSS) of the processes, in kB."""
    rss = pss = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            pass
    return rss, pss


def cpu_seconds() -> float:
    """User + system CPU time of this process's reaped children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds, peak summed RSS and PSS (MB) of a command's process tree."""
    cpu = cpu_seconds()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_rss = peak_pss = 0
    while proc.poll() is None:
        rss, pss = memory_kb(tree(proc.pid))
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.02)
    secs = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
    return secs, cpu_seconds() - cpu, peak_rss // 1024, peak_pss // 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", default="50", help="input size(s) in MB, comma-separated (default 50); "
                    "the baseline runs on the first")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--megatron-python", help="a Python with megatron-core and transformers")
    ap.add_argument("--rounds", type=int, default=3, help="turns of mmfs and baseline (medians; default 3)")
    ap.add_argument("--types", default="HuggingFaceTokenizer", help=f"comma-separated, of {', '.join(TYPES)}")
    args = ap.parse_args()
    for kind in args.types.split(","):
        if kind not in TYPES:
            sys.exit(f"--types: {kind} is not one of {', '.join(TYPES)}")
        run_type(args, kind)
    return 0


def run_type(args: argparse.Namespace, kind: str) -> None:
    corpus_path, flags = TYPES[kind]
    corpus = corpus_path.read_bytes()
    docs_per_copy = corpus.count(b"\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        # megatron-core's GPT2BPETokenizer resolves "gpt2" through AutoTokenizer: a local
        # folder with the model type keeps it offline and on the given vocab and merges.
        os.makedirs(f"{tmp}/gpt2")
        Path(f"{tmp}/gpt2/config.json").write_text('{"model_type": "gpt2"}')
        sizes = [float(x) for x in args.mb.split(",")]
        for mb in sizes:
            copies = max(1, round(mb * 1e6 / len(corpus)))
            src = Path(tmp) / "input.jsonl"
            for old in Path(tmp).iterdir():
                if old.is_file():
                    old.unlink()
            with open(src, "wb") as f:
                for _ in range(copies):
                    f.write(corpus)
            size, docs = copies * len(corpus), copies * docs_per_copy
            print(f"input: the reference corpus x{copies} = {size / 1e6:.1f} MB, {docs:,} documents; "
                  f"{args.workers} workers, {kind}, --append-eod")
            runs = {"mmfs preprocess": [sys.executable, "-m", "mmfs.cli", "-q", "preprocess", "--input", str(src),
                                        "--output-prefix", f"{tmp}/mmfs", "--workers", str(args.workers),
                                        "--tokenizer-type", kind, *flags, "--append-eod"]}
            if args.megatron_python and mb == sizes[0]:  # the baseline is slow: first size only
                baseline = str(ROOT / "benchmarks" / "megatron_baseline.py")
                files = GOLDEN / "hf_tokenizer" if kind == "HuggingFaceTokenizer" else TOKENIZERS
                runs["megatron-core baseline"] = [args.megatron_python, baseline, str(src), str(files),
                                                  f"{tmp}/megatron", str(args.workers), kind]
            times: dict[str, list[float]] = {name: [] for name in runs}
            cpus: dict[str, list[float]] = {name: [] for name in runs}
            memory: dict[str, tuple[int, int]] = {name: (0, 0) for name in runs}
            for _ in range(args.rounds if len(runs) > 1 else 1):  # the two take turns
                for name, cmd in runs.items():
                    secs, cpu, rss, pss = measure(cmd, env, cwd=tmp)
                    times[name].append(secs)
                    cpus[name].append(cpu)
                    memory[name] = max(memory[name], (rss, pss))
            for name in runs:
                secs = statistics.median(times[name])
                rss, pss = memory[name]
                cpu = statistics.median(cpus[name])
                print(f"  {name:24s} {secs:6.1f} s  {docs / secs:9,.0f} documents/s  {size / 1e6 / secs:5.2f} MB/s  "
                      f"CPU {cpu:.1f} s  peak memory {rss} MB RSS summed, {pss} MB PSS  (runs: "
                      f"{', '.join(f'{t:.1f}' for t in times[name])} s)")
            if len(runs) == 2:
                same = all(filecmp.cmp(f"{tmp}/mmfs_text_document{s}", f"{tmp}/megatron_text_document{s}",
                                       shallow=False) for s in (".bin", ".idx"))
                base, ours = "megatron-core baseline", "mmfs preprocess"
                ratio = statistics.median(times[base]) / statistics.median(times[ours])
                cpu_ratio = statistics.median(cpus[base]) / statistics.median(cpus[ours])
                print(f"  mmfs / baseline: {ratio:.2f}x documents/s, {cpu_ratio:.2f}x less CPU time (medians); "
                      f"outputs byte-identical: {same}")


if __name__ == "__main__":
    sys.exit(main())
