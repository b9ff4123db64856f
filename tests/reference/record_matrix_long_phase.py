"""Record the reference matrix's extra cell (issue 42 item 3) into
matrix_long_phase.json beside this file: a run in restart phases whose last phase's
dataset is far longer than the phase (a bare prefix, whose GPTDataset megatron-core
builds to a whole epoch: 223 samples for a phase of 40), resumed inside that phase
on another layout; tests/test_matrix_long_phase.py checks `mmfs resume-check`
against the counts Megatron's jobs give.

    python tests/reference/record_matrix_long_phase.py --lm LM_ROOT

with torch 2.13.0 (CPU) and megatron-core 0.19.2; LM_ROOT: a Megatron-LM checkout (or
`git archive`) at core_v0.19.0. It is record_matrix.py's own run (run_cell, resumed,
resume_counts: Megatron-LM's loaders, samplers and relaunches, each launch's job
stopping at its phase's end, the last at train_iters) with matrix_cases.py's phases
changed to LONG_PHASES and LONG_STARTS, under the constant global batch, for each
sampler. Deterministic.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import record_matrix as rm  # noqa: E402
from megatron_training import Megatron, load_module, load_samplers  # noqa: E402
from record_phases import load_megatron  # noqa: E402

import matrix_cases as mc  # noqa: E402

OUT = HERE / "matrix_long_phase.json"
LONG_PHASES = [{"web": 0.6, "code": 0.4}, "math", "web"]  # the last: a bare prefix, its GPTDataset a whole epoch
LONG_STARTS = [10, 25]  # the last phase: iterations 25..29, 40 samples
RESUMED_AT = (25, 26, 27, 28)  # iterations the job is relaunched at, inside the last phase


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lm", required=True, type=Path)
    parser.add_argument("--lm-commit", help="the commit of a `git archive` given as --lm")
    a = parser.parse_args()
    load_megatron()
    import megatron.core.datasets.utils  # noqa: F401  (the real Split)
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    mc.PHASES, mc.PHASE_STARTS = LONG_PHASES, LONG_STARTS  # read by record_matrix's functions at call time
    samplers = load_samplers(a.lm)
    calc = load_module(a.lm / "megatron/core/num_microbatches_calculator.py", "calc_019")
    cells = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        written = rm.write_data(data)
        m = Megatron(a.lm, calc, samplers, data, str(Path(tmp) / "cache"))
        m.parsed = rm.parse_all(a.lm, data)  # Megatron's parse_args/validate_args of each launch line
        for sampler in mc.SAMPLERS:
            cell = rm.run_cell(m, sampler, "restart", "constant")
            lengths = [len(m.datasets[launch["train"]]) for launch in cell["launches"]]
            out = {"train_iters": cell["train_iters"], "consumed_before_iteration": cell["consumed_before_iteration"],
                   "phase_train_dataset_samples": lengths, "resumed": {}}
            for iteration in RESUMED_AT:
                at = cell["consumed_before_iteration"][iteration]
                for dp, mbs in ((mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE), mc.OTHER_LAYOUT):
                    job = rm.resumed(m, sampler, "restart", "constant", cell, dp, mbs, iteration)
                    counts = rm.resume_counts(m, sampler, "restart", "constant", cell, job, iteration)
                    out["resumed"][f"dp={dp},mbs={mbs},from={at}"] = counts
            cells[f"{sampler}/restart/constant"] = out
            print(sampler, "recorded", lengths, flush=True)
    commit = a.lm_commit or "core_v0.19.0"
    result = {"about": "resume-check's counts from Megatron's jobs in restart phases whose last phase's dataset is "
                       "far longer than the phase (record_matrix_long_phase.py)",
              "provenance": {"megatron-core": metadata.version("megatron-core"), "torch": torch.__version__,
                             "python": platform.python_version(), "megatron_lm": commit,
                             "args": rm.ARGS_MADE},
              "phases": LONG_PHASES, "phase_starts": LONG_STARTS, "data": written, "cells": cells}
    OUT.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
