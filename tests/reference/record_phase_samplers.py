"""Record what Megatron-LM's relaunched phases read with the cyclic sampler
(`--phase-transition-iterations` x `--dataloader-type cyclic`, sharded and not) into
phase_samplers.json beside this file (issue 31; docs/phases.md). The tests never
import torch or megatron: they read the JSON.

    python tests/reference/record_phase_samplers.py [--lm-root LM_ROOT]

Needs torch 2.13.0 (CPU) and megatron-core 0.19.2. LM_ROOT: a folder holding
megatron/training/training.py and megatron/training/datasets/data_samplers.py of
Megatron-LM core_v0.19.0 (default: the megatron-core 0.19.2 wheel's own copies,
which are the same files). What runs is Megatron's own code:

- each relaunch k (args.iteration = T_k, or any iteration for a job resumed
  mid-phase) sizes its train split with training.py's
  get_train_valid_test_num_samples and takes its consumed offset from the
  statements of build_train_valid_test_data_loaders that compute
  consumed_train_samples_in_current_phase (both cut out of training.py by name);
- megatron-core's BlendedMegatronDatasetBuilder builds the phase's datasets from
  that launch's blend alone (a bare prefix: the GPTDataset itself, often longer
  than the phase);
- data_samplers.py's build_pretraining_data_loader makes the DataLoader (its
  MegatronPretrainingRandomSampler over len(dataset)), and the training loop's
  cyclic_iter (cut out of training.py) iterates it, one global batch of micro-batches
  per iteration, until the exit test of checkpoint_and_decide_exit (cut out by name)
  ends the launch at the next transition, or train_iters (update_train_iters) ends
  the run.

Recorded per case: each phase's sizes (num_samples asked, len(dataset), the
consumed offset of its relaunch), a digest of every sample any layout read
(sha256 of its tokens as int64 and its last label, first 16 hex digits: the same
digest as phases.json), and per layout (dp, mbs, data_sharding) each rank's
micro-batches of the whole run as the phase's own sample indices, phase after
phase; per resume (a layout relaunched at an iteration inside a phase) each rank's
micro-batches to that phase's end. Deterministic: running it twice writes the same
file.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden"
OUT = HERE / "phase_samplers.json"

# phases: (transition iteration, blend), a blend being {prefix: weight} or one bare prefix
# (Megatron's bare GPTDataset); layouts: (dp, mbs, data_sharding); resumes: (layout index,
# iteration the job is relaunched at). start_as: how the tests write each phase's start.
CASES = {
    # the example: dp 2, mbs 2, gbs 8, phase 1 from iteration 6
    "issue_two_phases": {
        "split": "90,8,2", "sequence_length": 32, "seed": 1234,
        "global_batch_size": 8, "train_samples": 96, "eval_interval": 6, "eval_iters": 1,
        "phases": [(0, {"data/u16_docs": 0.7, "data/u16_multiseq": 0.3}),
                   (6, {"data/u16_docs": 0.3, "data/u16_small": 0.7})],
        "start_as": ["start_iteration", "start_iteration"],
        "layouts": [(2, 2, True), (2, 2, False), (1, 8, True), (4, 1, False), (8, 1, True), (8, 1, False),
                    (4, 2, True), (1, 2, False)],
        "resumes": [(0, 3), (0, 6), (0, 8), (3, 4), (5, 7), (4, 10)],
    },
    # a bare prefix between two blends (its GPTDataset far longer than its phase); the last
    # phase ends at train_samples, not a multiple of the global batch
    "bare_middle_phase": {
        "split": "90,8,2", "sequence_length": 64, "seed": 7,
        "global_batch_size": 12, "train_samples": 175, "eval_interval": 7, "eval_iters": 1,
        "phases": [(0, {"data/u16_docs": 0.6, "data/u16_multiseq": 0.4}),
                   (5, "data/u16_small"),
                   (9, {"data/u16_small": 1.0, "data/u16_docs": 2.0})],
        "start_as": ["start_iteration", "start_samples", "start_tokens"],
        "layouts": [(3, 2, True), (3, 2, False), (4, 3, True), (6, 1, False), (6, 2, True), (2, 3, False),
                    (1, 12, True)],
        "resumes": [(0, 5), (1, 6), (2, 7), (3, 9), (4, 12), (5, 2)],
    },
    # data-parallel size 7 (and 1, 2, 3, 6); the first and the last phase a bare prefix,
    # the last one read for more than an epoch of its dataset
    "dp7_bare_first_and_last": {
        "split": "90,8,2", "sequence_length": 256, "seed": 99,
        "global_batch_size": 42, "train_samples": 420, "eval_interval": 5, "eval_iters": 1,
        "phases": [(0, "data/u16_docs"),
                   (3, {"data/u16_multiseq": 0.2, "data/u16_small": 0.5, "data/i32_docs": 0.3}),
                   (6, "data/i32_docs")],
        "start_as": ["start_iteration", "start_tokens", "start_iteration"],
        "layouts": [(7, 1, True), (7, 2, False), (7, 3, True), (3, 2, False), (6, 1, True), (2, 7, True),
                    (1, 6, False)],
        "resumes": [(0, 1), (1, 3), (2, 4), (3, 6), (4, 8), (5, 9)],
    },
    # data-parallel sizes 5 and 8 (and 4); one prefix with a weight (a one-dataset
    # BlendedDataset) beside the same prefix bare; four phases
    "dp5_dp8_four_phases": {
        "split": "95,4,1", "sequence_length": 128, "seed": 3,
        "global_batch_size": 40, "train_samples": 360, "eval_interval": 3, "eval_iters": 1,
        "phases": [(0, {"data/u16_small": 1.0}),
                   (2, "data/u16_small"),
                   (5, {"data/u16_docs": 0.5, "data/i32_docs": 0.25, "data/u16_multiseq": 0.25}),
                   (6, "data/u16_multiseq")],
        "start_as": ["start_iteration", "start_iteration", "start_samples", "start_tokens"],
        "layouts": [(5, 1, True), (5, 2, False), (5, 8, True), (8, 1, False), (8, 5, True), (4, 2, False),
                    (4, 5, True)],
        "resumes": [(0, 1), (1, 2), (3, 4), (4, 5), (5, 7), (6, 8)],
    },
}


# -- megatron-core and Megatron-LM's training code, loaded without the training stack --


def load_megatron(lm_root: Path | None) -> tuple[types.ModuleType, dict]:
    """The dataset modules of megatron-core (package __init__ files skipped, as
    record_phases.py does), data_samplers.py with get_args and mpu answering for
    the recorder, and training.py's functions by name."""
    root = Path(importlib.util.find_spec("megatron").submodule_search_locations[0])
    lm_root = lm_root or root.parent
    sys.path.insert(0, str(HERE))
    from record_phases import load_megatron as load_datasets

    load_datasets()
    state = SimpleNamespace(args=None, rank=0, dp=1)
    core = sys.modules["megatron.core"]
    core.mpu = SimpleNamespace(get_data_parallel_rank=lambda: state.rank,
                               get_data_parallel_world_size=lambda: state.dp)
    training = types.ModuleType("megatron.training")
    training.__path__ = []
    training.get_args = lambda: state.args
    handler = types.ModuleType("megatron.training.dist_signal_handler")
    handler.DistributedSignalHandler = object
    sys.modules["megatron.training"] = training
    sys.modules["megatron.training.dist_signal_handler"] = handler
    spec = importlib.util.spec_from_file_location(
        "megatron_data_samplers", lm_root / "megatron/training/datasets/data_samplers.py")
    samplers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samplers)
    code = training_code(lm_root / "megatron/training/training.py", state)
    code["state"] = state
    return samplers, code


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def training_code(path: Path, state: SimpleNamespace) -> dict:
    """training.py's get_train_valid_test_num_samples, update_train_iters and
    cyclic_iter; the statements of build_train_valid_test_data_loaders up to the one
    that sets consumed_train_samples_in_current_phase; the phase-transition exit test
    of checkpoint_and_decide_exit."""
    tree = ast.parse(path.read_text())
    names = {"get_args": lambda: state.args, "print_rank_0": lambda *a, **k: None}
    for name in ("get_train_valid_test_num_samples", "update_train_iters", "cyclic_iter"):
        exec(compile(ast.Module(body=[_function(tree, name)], type_ignores=[]), str(path), "exec"), names)
    loaders = _function(tree, "build_train_valid_test_data_loaders")
    body = []
    for statement in loaders.body:
        if isinstance(statement, ast.Expr):  # prints and the docstring
            continue
        body.append(statement)
        if "consumed_train_samples_in_current_phase =" in ast.unparse(statement):
            break
    consumed = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec")
    decide = _function(tree, "checkpoint_and_decide_exit")
    exit_test = next(n.test for n in ast.walk(decide)
                     if isinstance(n, ast.If) and "phase_transition_iterations" in ast.unparse(n.test))

    def consumed_in_phase() -> int:
        scope = dict(names)
        exec(consumed, scope)
        return scope["consumed_train_samples_in_current_phase"]

    def exits(iteration: int) -> bool:
        return bool(eval(compile(ast.Expression(exit_test), str(path), "eval"),
                         {"args": state.args, "iteration": iteration}))

    return {"num_samples": names["get_train_valid_test_num_samples"], "update_train_iters":
            names["update_train_iters"], "cyclic_iter": names["cyclic_iter"], "consumed_in_phase": consumed_in_phase,
            "exits": exits}


# -- one launch ------------------------------------------------------------------------


def launch_args(case: dict, iteration: int, dp: int, mbs: int, sharding: bool) -> SimpleNamespace:
    """The arguments of a launch of the case at args.iteration = `iteration` (what a
    checkpoint restores), after validate_args (transitions sorted ints)."""
    gbs = case["global_batch_size"]
    return SimpleNamespace(
        train_samples=case["train_samples"], train_iters=None, global_batch_size=gbs, micro_batch_size=mbs,
        full_validation=False, skip_train=False, eval_interval=case["eval_interval"], eval_iters=case["eval_iters"],
        start_eval_at_iter=None, phase_transition_iterations=sorted(t for t, _ in case["phases"][1:]),
        iteration=iteration, consumed_train_samples=iteration * gbs, consumed_valid_samples=0,
        dataloader_type="cyclic", data_sharding=sharding, num_workers=0, hybrid_context_parallel=False,
        exit_signal_handler=False, exit_interval=None, step_batch_size_schedule=None, data_parallel_size=dp)


def build_phase(case: dict, blend, sizes: list[int], cache: str):
    from record_phases import build

    return build(blend, sizes, {"seed": case["seed"], "sequence_length": case["sequence_length"],
                                "split": case["split"]}, cache)[0]


class Indexed:
    """The train dataset with each item's index beside its fields, so the DataLoader's
    collated batch says which samples it holds (attributes are the dataset's)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __getattr__(self, name):
        return getattr(self.dataset, name)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx):
        return {"index": idx, **self.dataset[idx]}


def digest(tokens, labels) -> str:
    tokens = np.ascontiguousarray(np.asarray(tokens), dtype=np.int64)
    last = np.ascontiguousarray(np.asarray(labels)[-1:], dtype=np.int64)
    return hashlib.sha256(tokens.tobytes() + last.tobytes()).hexdigest()[:16]


def run_launch(samplers, code, case: dict, datasets: dict, iteration: int, dp: int, mbs: int, sharding: bool,
               seen: dict) -> tuple[int, list[list[int]], int, int]:
    """One launch from args.iteration = `iteration` to its exit: (its phase, each rank's
    sample indices of its phase's dataset, the iteration it exits at, its consumed offset). seen[phase]:
    {index: digest} of what the DataLoaders delivered."""
    args = launch_args(case, iteration, dp, mbs, sharding)
    code["state"].args = args
    code["update_train_iters"](args)
    num_samples = code["num_samples"]()[0]
    consumed = code["consumed_in_phase"]()
    phase = sum(iteration >= t for t, _ in case["phases"][1:])
    dataset = datasets[phase]
    assert len(dataset) >= num_samples and dataset_size(case, phase) == num_samples
    per_iteration = case["global_batch_size"] // (mbs * dp)
    end = iteration
    while end < args.train_iters:  # the launch's iterations: train()'s loop until the exit test
        end += 1
        if code["exits"](end):
            break
    ranks = []
    for rank in range(dp):
        code["state"].rank, code["state"].dp = rank, dp
        loader = samplers.build_pretraining_data_loader(Indexed(dataset), consumed)
        batches = code["cyclic_iter"](loader)
        ids = []
        for _ in range((end - iteration) * per_iteration):
            batch = next(batches)
            for row, index in enumerate(batch["index"].tolist()):
                got = digest(batch["tokens"][row], batch["labels"][row])
                assert seen[phase].setdefault(index, got) == got
                ids.append(index)
        ranks.append(ids)
    return phase, ranks, end, consumed


def dataset_size(case: dict, phase: int) -> int:
    gbs = case["global_batch_size"]
    bounds = [t * gbs for t, _ in case["phases"]] + [case["train_samples"]]
    return bounds[phase + 1] - bounds[phase]


def record_case(samplers, code, case: dict, cache: str) -> dict:
    gbs = case["global_batch_size"]
    datasets = {}
    for k, (start, blend) in enumerate(case["phases"]):  # the launch at each transition sizes its phase
        args = launch_args(case, start, 1, 1, True)
        code["state"].args = args
        code["update_train_iters"](args)
        train, valid, test = code["num_samples"]()
        datasets[k] = build_phase(case, blend, [train, valid, test], cache)
    seen: dict[int, dict[int, str]] = {k: {} for k in datasets}
    layouts = []
    for dp, mbs, sharding in case["layouts"]:
        assert gbs % (dp * mbs) == 0
        iteration, per_phase = 0, []
        ranks = [[] for _ in range(dp)]
        offsets = []
        while True:  # relaunch after relaunch, as the user does at each transition
            launch = launch_args(case, iteration, dp, mbs, sharding)
            code["state"].args = launch
            code["update_train_iters"](launch)
            if iteration >= launch.train_iters:
                break
            phase, got, iteration, consumed = run_launch(samplers, code, case, datasets, iteration, dp, mbs,
                                                         sharding, seen)
            offsets.append(consumed)
            per_phase.append(len(got[0]))
            for r in range(dp):
                ranks[r].extend(got[r])
        layouts.append({"dp": dp, "mbs": mbs, "data_sharding": sharding, "relaunch_consumed": offsets,
                        "phase_microbatches": [n // mbs for n in per_phase], "ranks": ranks})
    resumes = []
    for layout, iteration in case["resumes"]:
        dp, mbs, sharding = case["layouts"][layout]
        phase, got, end, consumed = run_launch(samplers, code, case, datasets, iteration, dp, mbs, sharding, seen)
        resumes.append({"layout": layout, "iteration": iteration, "phase": phase, "consumed_in_phase": consumed,
                        "exit_iteration": end, "ranks": got})
    phases = []
    for k in datasets:
        phases.append({"num_samples": dataset_size(case, k), "dataset_length": len(datasets[k]),
                       "megatron_dataset": type(datasets[k]).__name__,
                       "digests": {str(i): d for i, d in sorted(seen[k].items())}})
    out = {key: case[key] for key in ("split", "sequence_length", "seed", "global_batch_size", "train_samples",
                                       "eval_interval", "eval_iters", "start_as")}
    out["phases"] = [[t, blend] for t, blend in case["phases"]]
    out["phase_datasets"] = phases
    out["layouts"] = layouts
    out["resumes"] = resumes
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm-root", type=Path, default=None,
                        help="a Megatron-LM checkout at core_v0.19.0 (default: the megatron-core wheel's copies)")
    options = parser.parse_args()
    samplers, code = load_megatron(options.lm_root)
    import tempfile

    import torch

    os.chdir(GOLDEN)
    cases = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, case in CASES.items():
            cases[name] = record_case(samplers, code, case, cache)
    OUT.write_text(json.dumps({
        "about": "Megatron-LM core_v0.19.0's relaunched phases with the cyclic sampler (megatron-core 0.19.2), "
                 "recorded by record_phase_samplers.py",
        "torch_version": torch.__version__,
        "digest": "sha256(tokens as int64 + the last label)[:16]",
        "ids": "each phase's own sample indices (its relaunch's dataset), phase after phase",
        "cases": cases}, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
