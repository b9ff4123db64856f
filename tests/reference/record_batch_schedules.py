"""Record iteration -> consumed_samples as megatron-core's microbatch calculators
give it, into batch_schedules.json beside this file (the tests read it).

Megatron's training loop, per iteration: update_num_microbatches(consumed, True),
then consumed += data_parallel_size * micro_batch_size * get_num_microbatches().
The calculator module is plain Python (no torch): pass the files of the two
versions that hold the schedules:
    python tests/reference/record_batch_schedules.py CALC_0_17.py CALC_0_19.py
(megatron/core/num_microbatches_calculator.py of megatron-core 0.17, which has
the ramp-up calculator, and of 0.19, which has the step schedule and ignores
rampup_batch_size). Deterministic: running it twice writes the same file.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "batch_schedules.json"
ITERATIONS = 400

RAMPUPS = [  # (start, increment, ramp_samples, global_batch_size, mbs, dp)
    (16, 8, 3000, 64, 1, 8),
    (32, 32, 6_000, 1536, 2, 16),
    (4, 4, 1000, 24, 2, 2),
    (3, 3, 100, 30, 1, 3),
    (8, 8, 7, 64, 4, 2),
    (8, 8, 100, 24, 2, 4),  # the layout of tests/golden's ranks-single_dp4_mb2
]
STEPS = [  # (schedule, seq_length, mbs, dp)
    ("0:8 100K:16 300K:32", 1024, 2, 4),
    ("0:768 2.5M:1536 5M:3072", 2048, 4, 8),
    ("0:6, 1000:12, 1001:18", None, 3, 2),
    ("50K:40 0:20", 512, 5, 4),
    ("0:8 2K:16 6K:24", 128, 2, 4),  # the same layout, p2_blend2_u16's sequence length
]


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(calc, mbs: int, dp: int) -> list[int]:
    consumed, out = 0, []
    for _ in range(ITERATIONS):
        out.append(consumed)  # consumed_samples when the iteration starts
        calc.update(consumed, consistency_check=True)
        consumed += dp * mbs * calc.get()
    return out


def main() -> None:
    old, new = load(sys.argv[1], "calc_old"), load(sys.argv[2], "calc_new")
    cases = []
    for start, inc, ramp, gbs, mbs, dp in RAMPUPS:
        calc = old.RampupBatchsizeNumMicroBatchesCalculator(gbs, mbs, dp, False, 1, start, inc, ramp)
        cases.append({"rampup_batch_size": [start, inc, ramp], "global_batch_size": gbs,
                      "micro_batch_size": mbs, "data_parallel_size": dp,
                      "consumed_before_iteration": run(calc, mbs, dp)})
    for text, seq, mbs, dp in STEPS:
        calc = new.StepBatchsizeNumMicroBatchesCalculator(mbs, dp, False, 1, text, seq)
        cases.append({"step_batch_size_schedule": text, "sequence_length": seq,
                      "micro_batch_size": mbs, "data_parallel_size": dp,
                      "consumed_before_iteration": run(calc, mbs, dp)})
    OUT.write_text(json.dumps({"iterations": ITERATIONS, "cases": cases}, indent=None) + "\n")


if __name__ == "__main__":
    main()
