"""Record each relaunch's valid and test of a run in phases under Megatron-LM's
--phase-transition-iterations (phase_mode: restart, docs/phases.md), and what every
evaluation of the run reads, into phase_evals.json beside this file.

Each launch k (one per phase) is Megatron-LM core_v0.19.0's own data set-up, run
from the megatron-core 0.19.2 wheel's megatron/training/training.py (the same
functions as the tag's): `get_train_valid_test_num_samples` and
`build_train_valid_test_data_loaders` are taken from the file as they are and run
with `args.iteration` = the phase's first transition, `args.consumed_valid_samples`
as the previous launch's checkpoint left it, a provider that builds the phase's
blend with BlendedMegatronDatasetBuilder (pretrain_gpt's), the real
`build_pretraining_data_loader` and samplers (data_samplers.py) for each
data-parallel rank, and the training loop's `cyclic_iter`. The recorder then walks
the launch as train() and evaluate() do: after each iteration that is a multiple
of eval_interval, eval_iters steps of eval_global_batch_size, each step taking
eval_global_batch_size / (micro_batch_size x dp) micro-batches from every rank's
valid iterator and adding eval_global_batch_size to consumed_valid_samples; at a
transition the launch saves and exits (no final evaluation); the last launch
evaluates valid once more after training, then test (from 0).

Recorded per case: per phase, a digest of every sample of its valid and test
datasets (as that launch builds them) and Megatron's sizes; per sampler (single,
cyclic sharded, cyclic unsharded) and (dp, mbs) layout, each launch's
consumed_valid_samples when it builds its loaders, and per evaluation step of the
run the launch's phase and each rank's micro-batches (sample ids of that phase's
valid or test dataset: what its DataLoader's batch_sampler yields, which the
DataLoader reads).

A sample's digest: the first 16 hex digits of sha256 of its tokens as int64 and
its last label (record_phases.py's).

Run from the repository root with a Python that has torch 2.13.0 (CPU) and
megatron-core 0.19.2:
    python tests/reference/record_phase_evals.py
Deterministic: running it twice writes the same file.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import record_phases  # noqa: E402  (its cases, its Megatron loader, its digest)

OUT = HERE / "phase_evals.json"
SAMPLERS = {"single": ("single", True), "sharded": ("cyclic", True), "unsharded": ("cyclic", False)}
# (dp, mbs) layouts per global batch size
LAYOUTS = {8: [(1, 4), (2, 2), (4, 1)], 10: [(1, 5), (5, 1), (2, 5)], 12: [(1, 6), (3, 2), (2, 3), (6, 1)],
           16: [(1, 8), (4, 2), (8, 1)]}
# Evaluations every few iterations, several per phase: a transition at an evaluation
# (8), one between two (13), a phase with no evaluation (iteration 14 alone), a bare prefix.
EXTRA = {
    "evals_every_four_iterations": {
        "split": "80,15,5", "sequence_length": 32, "seed": 21,
        "training": {"global_batch_size": 8, "train_iters": 30, "eval_interval": 4, "eval_iters": 3},
        "phases": [(0, {"data/u16_docs": 0.5, "data/u16_multiseq": 0.5}),
                   (8, {"data/u16_small": 0.3, "data/u16_docs": 0.7}),
                   (13, "data/u16_multiseq"),
                   (14, {"data/i32_docs": 0.4, "data/u16_multiseq": 0.6})],
    },
}
TAKEN = ("get_train_valid_test_num_samples", "build_train_valid_test_datasets",
         "build_train_valid_test_data_loaders", "cyclic_iter")


def megatron_functions(namespace: dict) -> dict:
    """TAKEN, from the wheel's megatron/training/training.py, defined in `namespace`."""
    path = os.path.join(sys.modules["megatron"].__path__[0], "training", "training.py")
    tree = ast.parse(Path(path).read_text())
    chosen = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in TAKEN]
    assert sorted(n.name for n in chosen) == sorted(TAKEN), path
    exec(compile(ast.Module(body=chosen, type_ignores=[]), path, "exec"), namespace)
    return namespace


class Rank:
    """mpu, as each rank's process sees it (the data-parallel rank is set per rank)."""

    rank = 0
    size = 1

    def get_data_parallel_rank(self):
        return self.rank

    def get_data_parallel_world_size(self):
        return self.size

    def get_tensor_model_parallel_rank(self):
        return 0


class Current:
    """What get_args() returns: the args of the launch being set up."""

    args = None


def load() -> tuple[types.ModuleType, dict, Rank]:
    record_phases.load_megatron()
    import torch

    mpu = Rank()
    core = sys.modules["megatron.core"]
    core.mpu = mpu
    training = types.ModuleType("megatron.training")
    training.__path__ = []
    training.get_args = lambda: Current.args
    handler = types.ModuleType("megatron.training.dist_signal_handler")
    handler.DistributedSignalHandler = object
    sys.modules["megatron.training"] = training
    sys.modules["megatron.training.dist_signal_handler"] = handler
    path = os.path.join(sys.modules["megatron"].__path__[0], "training", "datasets", "data_samplers.py")
    spec = importlib.util.spec_from_file_location("megatron_data_samplers", path)
    samplers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samplers)
    # what training.py's functions reach: no GPU, one process per rank, no collectives
    shim = types.SimpleNamespace(tensor=lambda data, dtype=None, device=None: torch.tensor(data, dtype=dtype),
                                 long=torch.long, distributed=types.SimpleNamespace(broadcast=lambda *a, **k: None))
    namespace = megatron_functions({"get_args": lambda: Current.args, "print_rank_0": lambda *a, **k: None, "mpu": mpu,
                                    "torch": shim, "build_pretraining_data_loader":
                                    samplers.build_pretraining_data_loader})
    return samplers, namespace, mpu


def make_args(case: dict, sampler: str, dp: int, mbs: int):
    t = case["training"]
    gbs, iters = t["global_batch_size"], t["train_iters"]
    kind, sharding = SAMPLERS[sampler]
    # Megatron-LM needs --train-samples with --phase-transition-iterations (the last phase
    # ends there); update_train_iters gives train_iters = train_samples // global_batch_size.
    return types.SimpleNamespace(
        train_samples=iters * gbs, train_iters=iters, global_batch_size=gbs, micro_batch_size=mbs,
        eval_global_batch_size=gbs, eval_micro_batch_size=mbs, eval_interval=t["eval_interval"],
        eval_iters=t["eval_iters"], full_validation=False, skip_train=False, start_eval_at_iter=None,
        phase_transition_iterations=[it for it, _ in case["phases"][1:]], iteration=0,
        consumed_train_samples=0, consumed_valid_samples=0, perform_rl_step=False,
        multiple_validation_sets=False, dataloader_type=kind, data_sharding=sharding, num_workers=0,
        hybrid_context_parallel=False, full_validation_sampler=False, exit_signal_handler=False,
        data_parallel_size=dp)


def provider(blend, case: dict, cache: str, built: list):
    def build(num_samples):
        datasets = record_phases.build(blend, list(num_samples), case, cache)
        built.append((list(num_samples), datasets))
        return datasets
    build.is_distributed = True  # every rank builds (pretrain_gpt's is_dataset_built_on_rank)
    return build


def launches(case: dict, sampler: str, dp: int, mbs: int, cache: str, digests: dict) -> dict:
    args = Current.args = make_args(case, sampler, dp, mbs)
    _, megatron, mpu = LOADED
    mpu.size = dp
    starts = [0, *args.phase_transition_iterations]
    group = mbs * dp
    per_step = args.eval_global_batch_size // group
    out: dict = {"consumed_valid_at_launch": [], "valid": [], "test": []}
    for k, (first, (_, blend)) in enumerate(zip(starts, case["phases"])):
        last_launch = k == len(starts) - 1
        args.iteration = first
        args.consumed_train_samples = first * args.global_batch_size
        carried = args.consumed_valid_samples  # the previous launch's checkpoint
        valid, test = [], []
        built: list = []
        for r in range(dp):
            mpu.rank = r
            args.consumed_valid_samples = carried
            _, valid_loaders, test_loader = megatron["build_train_valid_test_data_loaders"](
                provider(blend, case, cache, built))
            it = megatron["cyclic_iter"] if args.dataloader_type == "cyclic" else iter
            valid.append(iter(it(valid_loaders[0].batch_sampler)))
            test.append(iter(it(test_loader.batch_sampler)))
        out["consumed_valid_at_launch"].append(args.consumed_valid_samples)
        sizes, datasets = built[0]
        phase = digests.setdefault(k, {"sizes": sizes, **{split: [record_phases.digest(d[i]) for i in range(len(d))]
                                                          for split, d in (("valid", datasets[1]),
                                                                           ("test", datasets[2]))}})
        assert phase["sizes"] == sizes
        end = args.train_iters if last_launch else starts[k + 1]
        for iteration in range(first + 1, end + 1):  # train(): evaluate, then exit at a transition
            if args.eval_interval and iteration % args.eval_interval == 0 and args.eval_iters > 0:
                out["valid"] += evaluate(args, k, valid, per_step, counts=True)
        if last_launch:  # after training: valid once more, then test
            out["valid"] += evaluate(args, k, valid, per_step, counts=True)
            out["test"] += evaluate(args, k, test, per_step, counts=False)
    return out


def evaluate(args, phase: int, iterators: list, per_step: int, counts: bool) -> list:
    """evaluate(): eval_iters steps, each taking per_step micro-batches from every rank's
    iterator; a valid step (counts) adds eval_global_batch_size to consumed_valid_samples."""
    steps = []
    for _ in range(args.eval_iters):
        steps.append([phase, [[list(map(int, next(it))) for _ in range(per_step)] for it in iterators]])
        if counts:
            args.consumed_valid_samples += args.eval_global_batch_size
    return steps


def record(name: str, case: dict) -> dict:
    gbs = case["training"]["global_batch_size"]
    digests: dict = {}
    reads = {}
    with tempfile.TemporaryDirectory() as cache:
        for sampler in SAMPLERS:
            for dp, mbs in LAYOUTS[gbs]:
                reads[f"{sampler},dp={dp},mbs={mbs}"] = launches(case, sampler, dp, mbs, cache, digests)
    return {**case, "phases": [list(p) for p in case["phases"]],
            "per_phase": [digests[k] for k in sorted(digests)], "reads": reads}


LOADED: tuple = ()

if __name__ == "__main__":
    LOADED = load()
    import torch

    os.chdir(record_phases.GOLDEN)
    cases = {name: record(name, case) for name, case in {**record_phases.CASES, **EXTRA}.items()}
    OUT.write_text(json.dumps({"megatron_core": "0.19.2", "torch_version": torch.__version__,
                               "digest": "sha256(tokens as int64 + the last label)[:16]",
                               "reads": "per evaluation step: [phase, [rank][micro-batch][sample id of that "
                                        "phase's dataset]]", "cases": cases}, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
