"""Record what Megatron-LM's own parser makes of the launch lines the docs show, into
megatron_docs.json beside this file (tests/test_megatron_docs_lines.py checks that
the docs still hold those very lines, so a changed line must be recorded again).

    python tests/reference/record_megatron_docs.py --megatron-lm LM_ROOT

Needs torch 2.13.0 (CPU), the megatron-core 0.19.2 wheel and a Megatron-LM checkout
(or `git archive`) at core_v0.19.0 for pretrain_gpt.py. Each line: the words of
docs/megatron.md's `launch.args` (as `mmfs config --from-megatron @launch.args`
reads them) and of docs/config.md's `mmfs config --from-megatron ...` example, given
to Megatron's parse_args and validate_args (pretrain_gpt.py's args_defaults) with the
WORLD_SIZE the docs give (no GPU here: the device is said to be an H100, 9.0, and
CUDA_DEVICE_MAX_CONNECTIONS is 1, as launch scripts export it); recorded: accepted or Megatron's message, and the data
arguments it parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import shlex
import sys
import types
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "megatron_docs.json"
ARGS = ("data_path", "split", "seq_length", "micro_batch_size", "global_batch_size", "train_iters", "eval_interval",
        "eval_iters", "seed", "tokenizer_type", "vocab_size", "data_cache_path", "data_parallel_size")


def doc_lines() -> dict[str, tuple[str, int]]:
    """{name: (the launch line's text as the docs hold it, its WORLD_SIZE)}."""
    megatron = (ROOT / "docs" / "megatron.md").read_text()
    block = re.search(r"cat > tour/job/launch.args <<'EOF'\n(.*?)\nEOF\n", megatron, re.S).group(1)
    world = int(re.search(r"WORLD_SIZE=(\d+) mmfs config --from-megatron @launch.args", megatron).group(1))
    config = (ROOT / "docs" / "config.md").read_text()
    m = re.search(r"WORLD_SIZE=(\d+) mmfs config --from-megatron (.*?) > tour/config.yaml", config, re.S)
    return {"megatron.md launch.args": (block, world), "config.md example": (m.group(2), int(m.group(1)))}


def words(text: str) -> list[str]:
    return shlex.split(text.replace("\\\n", " "), comments=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", required=True)
    opts = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from record_megatron_iterators import prepare_megatron

    m = prepare_megatron(opts.megatron_lm)
    out = {"about": "Megatron's parse_args/validate_args on the launch lines of the docs (record_megatron_docs.py)",
           "provenance": {"megatron-core": metadata.version("megatron-core"), "torch": metadata.version("torch"),
                          "python": platform.python_version(), "megatron_lm_pretrain_gpt": "core_v0.19.0",
                          "args": "Megatron's parse_args and validate_args with pretrain_gpt.py's args_defaults"},
           "lines": {}}
    import torch

    # no GPU here: validate_args asks the device's architecture (tensor parallelism); an H100's
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=9, minor=0)
    for name, (text, world) in doc_lines().items():
        os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
        sys.argv = ["pretrain_gpt.py", *words(text)]
        said = io.StringIO()
        entry = {"text": text, "world_size": world}
        try:
            with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(said):
                args = m.parse_args()
                m.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
            entry["megatron"] = {k: getattr(args, k) for k in ARGS}
        except (AssertionError, ValueError, SystemExit) as exc:
            entry["refused"] = said.getvalue().strip().splitlines()[-1] if isinstance(exc, SystemExit) else str(exc)
        out["lines"][name] = entry
        print(name, "refused" if "refused" in entry else "accepted", flush=True)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
