"""Record the passes megatron-core 0.19.2's samplers make when a job resumes on
another layout, into megatron_streams.json beside this file (the tests of
`<split>/streams/` and `mmfs resume-check` read it; they never import torch).

Needs torch 2.13.0 (CPU) and Megatron's data_samplers.py, from the megatron-core
wheel or a Megatron-LM checkout (megatron/training/datasets/data_samplers.py):
    python tests/reference/record_megatron_streams.py [PATH/TO/data_samplers.py]
Deterministic: running it twice writes the same file.

Each case: a split of `total` samples, an old layout (the job ran from 0 to
`consumed`), a new layout (the sampler rebuilt with consumed_samples =
`consumed`). Recorded per rank: `new`, one pass of the new sampler (what
Megatron's training loop reads before it iterates the sampler again), or
`refused` with Megatron's assertion; `old`, the old layout's micro-batches from 0
up to `consumed` as the training loop iterates them (cyclic: again and again),
each with the sampler's epoch; `old_pass`, the old layout's whole pass of the
epoch the new sampler resumes in (single: from 0), what an uninterrupted job
would have read in it.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OUT = HERE / "megatron_streams.json"
TOTALS = (100, 643)  # the valid split of golden case p2_blend2_u16, the train split of p3_multi_epoch_i32
NEW_DP = (1, 3, 7, 16)
NEW_MBS = (1, 3, 5)
OLD_LAYOUTS = ((2, 4), (5, 1))  # (dp, mbs) the job ran with


def load_samplers(path: str | None):
    if path is None:
        sys.path.insert(0, str(HERE))
        from megatron_modules import load_data_samplers
        return load_data_samplers()
    # A checkout's file: stub what the samplers never call.
    for name in ("megatron", "megatron.core", "megatron.core.datasets", "megatron.training"):
        sys.modules.setdefault(name, types.ModuleType(name)).__path__ = []
    core = sys.modules["megatron.core"]
    core.mpu = types.ModuleType("megatron.core.mpu")
    utils = types.ModuleType("megatron.core.datasets.utils")
    utils.Split = type("Split", (), {"train": 0, "valid": 1, "test": 2})
    sys.modules["megatron.core.datasets.utils"] = utils
    sys.modules["megatron.training"].get_args = lambda: None
    handler = types.ModuleType("megatron.training.dist_signal_handler")
    handler.DistributedSignalHandler = object
    sys.modules["megatron.training.dist_signal_handler"] = handler
    spec = importlib.util.spec_from_file_location("megatron_data_samplers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make(samplers, kind, total, consumed, mbs, rank, dp):
    if kind == "single":
        return samplers.MegatronPretrainingSampler(total, consumed, mbs, rank, dp)
    return samplers.MegatronPretrainingRandomSampler(None, total, consumed, mbs, rank, dp, kind == "sharded")


def one_pass(samplers, kind, total, consumed, mbs, dp):
    try:
        out = {}
        for rank in range(dp):
            out[str(rank)] = [list(map(int, b)) for b in make(samplers, kind, total, consumed, mbs, rank, dp)]
        return {"new": out}
    except (AssertionError, ZeroDivisionError) as exc:
        return {"refused": f"{type(exc).__name__}: {exc}"}


def old_run(samplers, kind, total, consumed, mbs, dp):
    """Each rank's micro-batches [ids, epoch] from 0 until `consumed` samples."""
    steps = consumed // (mbs * dp)
    out = {}
    for rank in range(dp):
        sampler = make(samplers, kind, total, 0, mbs, rank, dp)
        got = []
        while len(got) < steps:
            before = len(got)
            for batch in sampler:
                got.append([list(map(int, batch)), int(getattr(sampler, "epoch", 0))])
                if len(got) == steps:
                    break
            if kind == "single" or len(got) == before:
                break
        out[str(rank)] = got
    return out


def main() -> None:
    samplers = load_samplers(sys.argv[1] if len(sys.argv) > 1 else None)
    cases = []
    for kind, total, (odp, ombs) in itertools.product(("single", "sharded", "unsharded"), TOTALS, OLD_LAYOUTS):
        old_group = odp * ombs
        for dp, mbs in itertools.product(NEW_DP, NEW_MBS):
            group = dp * mbs
            active = total - total % group
            # 0; a multiple of the old layout only; the end of the split (single:
            # its last sample; cyclic: the end of epoch 0 of the new layout, and
            # the old layout's epoch end)
            onlyold = next((k * old_group for k in range(1, total // old_group + 1) if (k * old_group) % group),
                           old_group)
            starts = {0, onlyold, total - 1 if kind == "single" else active, total - total % old_group}
            for consumed in sorted(starts):
                case = {"kind": kind, "total": total, "old_dp": odp, "old_mbs": ombs,
                        "dp": dp, "mbs": mbs, "consumed": consumed}
                case.update(one_pass(samplers, kind, total, consumed, mbs, dp))
                if consumed % old_group == 0:
                    case["old"] = old_run(samplers, kind, total, consumed, ombs, odp)
                    if "new" in case:
                        epoch = 0 if kind == "single" else consumed // active
                        at = epoch * (total - total % old_group)
                        case["old_pass"] = one_pass(samplers, kind, total, at, ombs, odp)["new"]
                cases.append(case)
    out = {"about": "megatron-core's samplers resumed on another layout, recorded by record_megatron_streams.py",
           "torch_version": torch.__version__, "cases": cases}
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
