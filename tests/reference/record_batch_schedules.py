"""Record the global batch size over a run as megatron-core's microbatch calculators
and Megatron-LM's training loop and evaluate() give it, into batch_schedules.json
beside this file (the tests read it).

    python tests/reference/record_batch_schedules.py \\
        --calc-0.17 CALC --calc-0.19 CALC --lm-0.17 LM_ROOT --lm-0.19 LM_ROOT

CALC: megatron/core/num_microbatches_calculator.py of megatron-core 0.17 (the
ramp-up calculator) and 0.19 (the step schedule; it ignores rampup_batch_size).
LM_ROOT: a folder holding megatron/training/training.py and arguments.py of that
version: the megatron-core wheel's own (0.17.0 and 0.19.2 ship them; unzip the
wheel), or a Megatron-LM checkout at core_v0.17.0 / core_v0.19.0 (the committed JSON
was recorded from both; they give the same file). Plain Python: no
torch, no megatron import. What runs is Megatron's own code, cut out by name:

- consumed_before_iteration: the calculator as the loop drives it: update(consumed,
  True), then consumed += dp * mbs * get() (as before).
- loop: the statements of train()'s `while iteration < args.train_iters` body from
  its first update_num_microbatches to its last (the "Number of microbatches should
  not decrease" assert and the consistency check), run per iteration with the real
  calculator; the consumed_samples of each iteration and the assertion, if any.
- resumed_batch_size: the global batch size of a job resumed at consumed_samples C,
  for every multiple C of mbs * dp: a new calculator, update(C, False) as the
  loop's first call does.
- evaluate: validate_args' global and eval batch-size defaults, then evaluate()
  itself (forward_backward_func stubbed to read its micro-batches from the data
  iterator, as Megatron's schedules do), called several times on one valid
  iterator: which of each rank's valid micro-batches every eval step reads.
Deterministic: running it twice writes the same file.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

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
    # thresholds at samples 20 and 44, iterations start at 40 and 56: a job resumed at 48 reads 32
    ("0:8 2560:16 5632:32", 128, 2, 4),
]
LOOPS = [  # (schedule, seq_length, mbs, dp, train_iters): the training loop's asserts
    ("0:16 2K:8", 128, 2, 4, 40),  # decreases at the iteration reaching 2K tokens
    ("0:16 2K:8", 128, 2, 4, 5),  # ... which a 5-iteration run never reaches
    ("0:16 2K:12", 128, 2, 4, 40),  # not a multiple of mbs x dp, reached (and a decrease)
    ("0:16 2K:24 100K:12", 128, 2, 4, 40),  # not a multiple, never reached
    ("0:16 2K:20", 128, 2, 4, 40),  # an increase to a non-multiple: the consistency check
    ("0:8 1K:16 3K:8", None, 2, 4, 400),
]
EVALUATIONS = [  # (calculator version, training keys, eval_iters, evaluations)
    ("0.17", {"rampup_batch_size": [16, 8, 3000], "global_batch_size": 64, "micro_batch_size": 1,
              "data_parallel_size": 8}, 4, 3),
    ("0.17", {"rampup_batch_size": [8, 8, 100], "global_batch_size": 24, "micro_batch_size": 2,
              "data_parallel_size": 4}, 3, 3),
    ("0.19", {"step_batch_size_schedule": "0:8 2K:16 6K:24", "micro_batch_size": 2, "data_parallel_size": 4},
     4, 3),
    ("0.19", {"step_batch_size_schedule": "0:6, 1K:12, 2K:18", "micro_batch_size": 3,
              "data_parallel_size": 2}, 2, 4),
    ("0.19", {"global_batch_size": 24, "micro_batch_size": 2, "data_parallel_size": 4}, 2, 3),
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


def resumed_sizes(make_calc, mbs: int, dp: int, until: int) -> list[int]:
    """The global batch size a job resumed at C = 0, mbs*dp, 2*mbs*dp, ... < until starts with."""
    out = []
    for consumed in range(0, until, mbs * dp):
        calc = make_calc()
        calc.update(consumed, consistency_check=False)
        out.append(calc.get_current_global_batch_size())
    return out


# -- Megatron-LM's code, cut out of its files by name -----------------------------


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def loop_microbatch_statements(lm_root: Path) -> ast.Module:
    """train()'s per-iteration microbatch update: from the first update_num_microbatches
    of the `while iteration < args.train_iters` body to the last."""
    train = _function(lm_root / "megatron/training/training.py", "train")
    loop = next(n for n in ast.walk(train) if isinstance(n, ast.While) and "train_iters" in ast.unparse(n.test))
    marks = [i for i, s in enumerate(loop.body)
             if isinstance(s, ast.Expr) and ast.unparse(s).startswith("update_num_microbatches(")]
    return ast.Module(body=loop.body[marks[0]:marks[-1] + 1], type_ignores=[])


def batch_size_defaults(lm_root: Path) -> ast.Module:
    """validate_args' top-level statements that default or check the (eval) global
    batch size."""
    validate = _function(lm_root / "megatron/training/arguments.py", "validate_args")
    keep = [s for s in validate.body if isinstance(s, (ast.If, ast.Assert))
            and any(k in ast.unparse(s.test) for k in ("global_batch_size", "eval_micro_batch_size"))]
    return ast.Module(body=keep, type_ignores=[])


def evaluate_function(lm_root: Path):
    fn = _function(lm_root / "megatron/training/training.py", "evaluate")
    fn.decorator_list = []
    return fn


class _Anything:
    """Stands for every name evaluate() uses that has no bearing on which samples
    it reads (timers, the rerun state machine, fault tolerance hooks, ...)."""

    def __call__(self, *a, **k):
        return self

    def __getattr__(self, name):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())


def run_evaluations(lm_root: Path, keys: dict, eval_iters: int, evaluations: int) -> dict:
    args = SimpleNamespace(
        micro_batch_size=keys["micro_batch_size"], data_parallel_size=keys["data_parallel_size"],
        global_batch_size=keys.get("global_batch_size"), step_batch_size_schedule=keys.get("step_batch_size_schedule"),
        rampup_batch_size=keys.get("rampup_batch_size"), eval_global_batch_size=None, eval_micro_batch_size=None,
        eval_iters=eval_iters, consumed_valid_samples=0, gtp_weight_remat_size=1, cuda_graph_impl="none",
        cuda_graph_scope=[], cuda_graph_warmup_steps=0, moe_expert_rank_capacity_factor=None,
        reuse_grad_buf_for_mxfp8_param_ag=False, overlap_param_gather=False, empty_unused_memory_level=0,
        exit_duration_in_mins=None, seq_length=128, decoder_seq_length=None, sft=False,
        vision_pretraining=False, vision_pretraining_type=None,
        _is_global_batch_size_explicitly_specified=keys.get("global_batch_size") is not None,
    )
    anything = _Anything()
    space = {"args": args, "print_rank_0": lambda *a: None, "is_global_batch_size_explicitly_specified":
             args._is_global_batch_size_explicitly_specified}
    exec(compile(batch_size_defaults(lm_root), "arguments.py", "exec"), space)

    reads: list[list[int]] = []

    def forward_backward_func(*, data_iterator, num_microbatches, **_):
        # what Megatron's schedules do: forward_step reads a micro-batch per call
        reads.append([next(data_iterator) for _ in range(num_microbatches)])
        return []

    fn = evaluate_function(lm_root)
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    space = {name: anything for name in names}
    space.update(__builtins__=__builtins__, len=len, getattr=getattr, ValueError=ValueError,
                 get_args=lambda: args, get_forward_backward_func=lambda **_: forward_backward_func,
                 has_nvidia_modelopt=False, is_last_rank=lambda: False, is_pp_last_stage=lambda *a: False,
                 torch=SimpleNamespace(no_grad=contextlib.nullcontext), _otel_managed_span=lambda *a, **k:
                 contextlib.nullcontext())
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "training.py", "exec"), space)
    microbatches = itertools.count()  # one rank's valid iterator: its micro-batch numbers
    consumed = []
    for _ in range(evaluations):
        space["evaluate"](None, microbatches, [anything], None, anything)
        consumed.append(args.consumed_valid_samples)
    return {"eval_iters": eval_iters,
            "evaluations": evaluations, "microbatches_per_eval_step": reads,
            "consumed_valid_samples_after_each_evaluation": consumed}


def run_loop(lm_root: Path, calc, mbs: int, dp: int, train_iters: int) -> dict:
    args = SimpleNamespace(consumed_train_samples=0, rl_use_sequence_packing=False, save=None,
                           micro_batch_size=mbs, train_iters=train_iters)
    space = {"args": args, "update_num_microbatches": lambda c, consistency_check, verbose=False:
             calc.update(c, consistency_check, verbose), "get_num_microbatches": calc.get,
             "print_rank_0": lambda *a: None, "num_microbatches": calc.get(), "iteration": 0}
    code = compile(loop_microbatch_statements(lm_root), "training.py", "exec")
    consumed, error = [], None
    while space["iteration"] < train_iters:
        try:
            exec(code, space)
        except AssertionError as exc:
            error = {"iteration": space["iteration"] + 1, "message": str(exc)}
            break
        consumed.append(args.consumed_train_samples)
        args.consumed_train_samples += dp * mbs * calc.get()
        space["iteration"] += 1
    return {"consumed_before_iteration": consumed, "assertion": error}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--calc-0.17", "--calc-0.19", "--lm-0.17", "--lm-0.19"):
        parser.add_argument(flag, required=True)
    a = vars(parser.parse_args())
    old, new = load(a["calc_0.17"], "calc_old"), load(a["calc_0.19"], "calc_new")
    lm = {"0.17": Path(a["lm_0.17"]), "0.19": Path(a["lm_0.19"])}
    cases = []
    for start, inc, ramp, gbs, mbs, dp in RAMPUPS:
        def make(start=start, inc=inc, ramp=ramp, gbs=gbs, mbs=mbs, dp=dp):
            return old.RampupBatchsizeNumMicroBatchesCalculator(gbs, mbs, dp, False, 1, start, inc, ramp)
        consumed = run(make(), mbs, dp)
        cases.append({"rampup_batch_size": [start, inc, ramp], "global_batch_size": gbs,
                      "micro_batch_size": mbs, "data_parallel_size": dp,
                      "consumed_before_iteration": consumed,
                      "resumed_batch_size": resumed_sizes(make, mbs, dp, consumed[-1])})
    for text, seq, mbs, dp in STEPS:
        def make(text=text, seq=seq, mbs=mbs, dp=dp):
            return new.StepBatchsizeNumMicroBatchesCalculator(mbs, dp, False, 1, text, seq)
        consumed = run(make(), mbs, dp)
        cases.append({"step_batch_size_schedule": text, "sequence_length": seq,
                      "micro_batch_size": mbs, "data_parallel_size": dp,
                      "consumed_before_iteration": consumed,
                      "resumed_batch_size": resumed_sizes(make, mbs, dp, min(consumed[-1], 200_000))})
    loops = []
    for text, seq, mbs, dp, iters in LOOPS:
        calc = new.StepBatchsizeNumMicroBatchesCalculator(mbs, dp, False, 1, text, seq)
        loops.append({"step_batch_size_schedule": text, "sequence_length": seq, "micro_batch_size": mbs,
                      "data_parallel_size": dp, "train_iters": iters, **run_loop(lm["0.19"], calc, mbs, dp, iters)})
    evaluations = [{"megatron": version, "training": keys, **run_evaluations(lm[version], keys, iters, n)}
                   for version, keys, iters, n in EVALUATIONS]
    OUT.write_text(json.dumps({"iterations": ITERATIONS, "cases": cases, "loops": loops,
                               "evaluations": evaluations}, indent=None) + "\n")


if __name__ == "__main__":
    main()
