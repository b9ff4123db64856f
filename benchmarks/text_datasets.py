"""Text datasets in a config, in one run: what a JSONL path in `datasets` costs against
running `mmfs preprocess` first and naming its output.

- first build: `mmfs build` of the JSONL config (tokenizing into the cache, then the
  indices) against `mmfs preprocess` followed by `mmfs build` of its output;
- re-open: a later `mmfs build` of each (what every later build or mount pays: the
  text file's identity, and loading the tokenizer when the config's `tokenizer:` block
  gives `type` but not `eod` and `pad`), median of --rounds, taking turns.

The reference corpus of tests/golden/preprocess is repeated to about --mb MB; its
Hugging Face tokenizer, --append-eod, every CPU.

    python benchmarks/text_datasets.py [--mb 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "preprocess"
MODEL = GOLDEN / "hf_tokenizer"


def mmfs(*args: str) -> float:
    """Seconds `mmfs ARGS` took (it must succeed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mmfs.cli", "-q", *args], env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"mmfs {' '.join(args)} failed: {proc.stderr.strip()}")
    return took


def config(folder: Path, name: str, path: str, tokenizer: str) -> str:
    file = folder / f"{name}.yaml"
    file.write_text(f"datasets: [{{path: {path}}}]\nsplit: '98,1,1'\nsequence_length: 2048\n"
                    f"tokenizer: {tokenizer}\ncache_dir: cache-{name}\n")
    return str(file)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=20)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = GOLDEN.joinpath("corpus.jsonl").read_bytes()
        corpus = folder / "corpus.jsonl"
        corpus.write_bytes(data * max(1, round(args.mb * 1e6 / len(data))))
        size_mb = corpus.stat().st_size / 1e6
        hf = f"{{type: HuggingFaceTokenizer, model: {MODEL}}}"
        text = config(folder, "text", "corpus.jsonl", hf)
        first_text = mmfs("build", text)
        workers = str(len(os.sched_getaffinity(0)))
        preprocess = mmfs("preprocess", "--input", str(corpus), "--output-prefix", str(folder / "corpus"),
                          "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(MODEL),
                          "--append-eod", "--workers", workers)
        indexed = config(folder, "indexed", "corpus_text_document", hf)
        first_indexed = mmfs("build", indexed)
        given = config(folder, "given", "corpus.jsonl", f"{{type: HuggingFaceTokenizer, model: {MODEL}, "
                                                          "eod: 0, pad: null}")
        mmfs("build", given)  # its own cache folder: indices built once before the turns
        plain = config(folder, "plain", "corpus_text_document", "{eod: 0, pad: null}")
        mmfs("build", plain)
        turns: dict[str, list[float]] = {"text": [], "given": [], "indexed": [], "plain": []}
        configs = {"text": text, "given": given, "indexed": indexed, "plain": plain}
        for _ in range(args.rounds):
            for name, path in configs.items():
                turns[name].append(mmfs("build", path))
        med = {k: statistics.median(v) for k, v in turns.items()}
    print(f"corpus {size_mb:.1f} MB, {workers} workers, {args.rounds} rounds")
    print(f"first build, JSONL config:            {first_text:6.2f} s")
    print(f"mmfs preprocess + first build:        {preprocess + first_indexed:6.2f} s "
          f"({preprocess:.2f} + {first_indexed:.2f}); ratio {first_text / (preprocess + first_indexed):.2f}x")
    print(f"re-open, JSONL, tokenizer type only:  {med['text']:6.3f} s")
    print(f"re-open, JSONL, eod and pad given:    {med['given']:6.3f} s")
    print(f"re-open, IndexedDataset, type only:   {med['indexed']:6.3f} s")
    print(f"re-open, IndexedDataset, eod and pad: {med['plain']:6.3f} s "
          f"(JSONL given / this: {med['given'] / med['plain']:.2f}x; type only / this: "
          f"{med['text'] / med['plain']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
