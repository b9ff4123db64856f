"""Record the reference matrix (issue 31 item 5) into matrix.json beside this file:
what Megatron reads in every cell of {single, cyclic sharded, cyclic unsharded} x
{no phases, continue, restart} x {constant batch, ramp-up, step schedule} over the
generated datasets of tests/matrix_cases.py (tests/test_matrix.py checks every view
of mmfs against it).

    python tests/reference/record_matrix.py --lm LM_ROOT --lm-0.17 LM_ROOT_0.17

with torch 2.13.0 (CPU) and megatron-core 0.19.2. LM_ROOT: a Megatron-LM checkout at
core_v0.19.0 (megatron/training/{training,arguments}.py, datasets/data_samplers.py,
megatron/core/num_microbatches_calculator.py); LM_ROOT_0.17: the same files at
core_v0.17.0, whose calculator is the last with the ramp-up (0.18+ ignore
--rampup-batch-size). What runs is Megatron's own code:

- the datasets: megatron-core 0.19.2's BlendedMegatronDatasetBuilder, GPTDataset and
  BlendedDataset, built by a datasets provider as pretrain_gpt.py's (get_blend_from_list
  of --data-path), over IndexedDatasets written by megatron-core's IndexedDatasetBuilder;
- the data loaders: Megatron-LM's get_train_valid_test_num_samples,
  build_train_valid_test_datasets, build_train_valid_test_data_loaders (each launch's
  phase-sized train split and its consumed offset under --phase-transition-iterations)
  and cyclic_iter, cut out of training.py by name, over data_samplers.py's
  build_pretraining_data_loader (its samplers and a real torch DataLoader) on each
  data-parallel rank;
- the arguments: Megatron-LM core_v0.19.0's parse_args and validate_args of each
  cell's launch line (matrix_args.py, in a process of its own); the ramp-up, which
  core_v0.19.0's parser no longer has, set on them with core_v0.17.0's validate_args
  batch-size statements (the provenance says so per cell);
- the batch sizes: update_train_iters, train()'s per-iteration microbatch update and
  the calculator of that version (0.17 for the ramp-up, else 0.19); evaluate() itself,
  its forward_backward_func reading its micro-batches from the data iterator as
  Megatron's schedules do.

A run under `restart` is Megatron-LM relaunched at each transition (its checkpoint's
iteration, consumed_train_samples and consumed_valid_samples carried over, the next
phase's --data-path): each launch trains to its transition and exits; the last
evaluates valid and test after training. Under `continue` (mmfs's own mode, one
launch) Megatron defines the first phase: a stock run of the first phase's arguments,
which is the no-phases cell (its blend is the first phase's); recorded beside it:
each dataset's GPTDataset as the continue rule uses it (the one megatron-core builds
for the first phase that names the dataset, sized to the run). Cells Megatron refuses
(restart under a batch-size schedule) are recorded with the reason.

Recorded compactly: every sample of every dataset Megatron built as a 12-hex digest
(sha256 of its tokens and last label as int64: the sample's sequence_length + 1
tokens), and each rank's micro-batches as [launch, sample ids...] into its launch's
datasets; the batches the loader gave were checked against those digests as they were
read. Deterministic: running it twice writes the same file.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from matrix_args import cell_line  # noqa: E402
from megatron_training import DIGITS, Megatron, args_key, load_module, load_samplers  # noqa: E402
from record_phases import load_megatron  # noqa: E402

import matrix_cases as mc  # noqa: E402

OUT = HERE / "matrix.json"
# How the matrix's Megatron arguments are made (matrix_args.py, megatron_training.py's configure)
ARGS_MADE = ("Megatron-LM core_v0.19.0's parse_args and validate_args (pretrain_gpt.py's args_defaults) of each "
             "cell's launch line (matrix_args.py's cell_line: --data-path of the launch's phase, --train-samples, "
             "--global-batch-size or --step-batch-size-schedule, --dataloader-type, --no-data-sharding, "
             "--phase-transition-iterations, world size = data-parallel size), in a process of its own; then "
             "the training loop's state (iteration, consumed samples, --data-path per launch) as pretrain() "
             "sets it, and update_train_iters")
ARGS_RAMPUP = ("the same parse_args/validate_args of core_v0.19.0 for the line without --rampup-batch-size, "
               "which core_v0.19.0's parser no longer has (0.18+ dropped the ramp-up); core_v0.17.0's own "
               "parse_args would import its whole training stack beside 0.19's: rampup_batch_size is set on the "
               "parsed args, the eval batch sizes (which 0.17 lacks) removed, and core_v0.17.0's validate_args "
               "batch-size statements (cut out of its arguments.py) run on them")
STREAM_SAMPLES = 16  # how far a resumed job's micro-batches are recorded from its consumed_samples


def run_cell(m: Megatron, sampler: str, mode: str, schedule: str) -> dict:
    """What each rank reads in one cell of the matrix, launch by launch."""
    dp, mbs = mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE
    restart = mode == "restart"
    m.configure(sampler, schedule, dp, mbs, mc.PHASE_STARTS if restart else None)
    consumed = m.consumed_before_iterations()
    iters = m.args.train_iters
    bounds = [0, *(mc.PHASE_STARTS if restart else []), iters]
    blends = mc.PHASES if restart else [mc.PHASES[0]]
    out: dict = {"train_iters": iters, "consumed_before_iteration": consumed,
                 "phase_starts": [consumed[t] for t in mc.PHASE_STARTS], "launches": [],
                 "train": [[] for _ in range(dp)], "valid": [], "test": []}
    for rank in range(dp):
        m.rank = rank
        m.configure(sampler, schedule, dp, mbs, mc.PHASE_STARTS if restart else None)
        valid_consumed, eval_step = 0, 0
        for launch, (first, last) in enumerate(zip(bounds, bounds[1:])):
            path = mc.data_words(blends[launch], lambda name: str(m.data / name))
            train, valid, test = m.loaders(path, first, consumed[first], valid_consumed)
            keys = [m.key(loader.dataset) for loader in (train, valid, test)]
            if rank == 0:
                out["launches"].append({"first_iteration": first, "train": keys[0], "valid": keys[1],
                                        "test": keys[2], "train_sampler_consumed": train.batch_sampler.consumed_samples,
                                        "valid_sampler_consumed": valid.batch_sampler.consumed_samples})
            train_it, valid_it = m.iterate(train), m.iterate(valid)
            for iteration in range(first, last):
                m.calc.update_num_microbatches(m.args.consumed_train_samples, consistency_check=True)
                for _ in range(m.calc.get_num_microbatches()):
                    out["train"][rank].append([launch, *m.read(next(train_it), keys[0])])
                m.args.consumed_train_samples += dp * mbs * m.calc.get_num_microbatches()
                if (iteration + 1) % mc.EVAL_INTERVAL == 0:
                    _evaluations(m, out, rank, launch, keys[1], m.evaluate(valid_it), eval_step)
                    eval_step += mc.EVAL_ITERS
            if launch == len(bounds) - 2:  # after training: the last valid evaluation
                _evaluations(m, out, rank, launch, keys[1], m.evaluate(valid_it), eval_step)
            # the test evaluation this launch's test iterator gives (only the last launch runs it;
            # evaluate() counts it into consumed_valid_samples, which the next launch must not see)
            valid_consumed = m.args.consumed_valid_samples
            steps = m.evaluate(m.iterate(test))
            if rank == 0:
                out["test"].append([])
            for k, step in enumerate(steps):
                if rank == 0:
                    out["test"][launch].append([[] for _ in range(dp)])
                out["test"][launch][k][rank] = [m.read(batch, keys[2]) for batch in step]
    return out


def _evaluations(m: Megatron, out: dict, rank: int, launch: int, key: str, steps: list, first_step: int) -> None:
    for k, step in enumerate(steps):
        if len(out["valid"]) <= first_step + k:
            out["valid"].append({"launch": launch, "ranks": [[] for _ in range(m.args.data_parallel_size)]})
        out["valid"][first_step + k]["ranks"][rank] = [m.read(batch, key) for batch in step]


def resumed(m: Megatron, sampler: str, mode: str, schedule: str, base: dict, dp: int, mbs: int, iteration: int
            ) -> dict:
    """A job relaunched at `iteration` on another layout (dp, mbs): each rank's first
    micro-batches (STREAM_SAMPLES samples of all ranks, into the next launch if its
    phase ends first), and, for resume-check, what it and the old job read in the pass
    it resumes in."""
    restart = mode == "restart"
    m.configure(sampler, schedule, dp, mbs, mc.PHASE_STARTS if restart else None)
    consumed = base["consumed_before_iteration"]
    bounds = [0, *(mc.PHASE_STARTS if restart else []), base["train_iters"]]
    blends = mc.PHASES if restart else [mc.PHASES[0]]
    launch = max(k for k, b in enumerate(bounds[:-1]) if b <= iteration)
    streams, after = [], []
    for rank in range(dp):
        m.rank = rank
        got, k, first = [], launch, iteration
        while len(got) * dp * mbs < STREAM_SAMPLES and k < len(bounds) - 1:
            path = mc.data_words(blends[k], lambda name: str(m.data / name))
            train, _, _ = m.loaders(path, first, consumed[first], 0)
            key = m.key(train.dataset)
            if k == launch:  # the pass resume-check compares: to the end of the launch's sampler pass or phase
                after.append(_pass(train.batch_sampler, consumed[bounds[k + 1]] - consumed[first] if restart
                                   else None, dp * mbs))
            loader_it = m.iterate(train)
            for _ in range((consumed[bounds[k + 1]] - consumed[first]) // (dp * mbs)):
                if len(got) * dp * mbs >= STREAM_SAMPLES:
                    break
                got.append([k, *m.read(next(loader_it), key)])
            k, first = k + 1, bounds[k + 1]
        streams.append(got)
    return {"streams": streams, "after": after, "launch": launch}


def _pass(batch_sampler, samples: int | None, group: int) -> list[int]:
    """The ids of one pass of a sampler (cut after `samples` consumed by all ranks: a restart
    phase's end, where its launch exits), on a copy (the cyclic sampler counts as it yields)."""
    batches = iter(copy.copy(batch_sampler))
    if samples is not None:
        batches = itertools.islice(batches, samples // group)
    return [int(i) for batch in batches for i in batch]


def resume_counts(m: Megatron, sampler: str, mode: str, schedule: str, base: dict, job: dict,
                  iteration: int) -> dict:
    """resume-check's answer from Megatron's samplers (mmfs/megatron/sampling/resume.py's rule, a
    restart phase being its relaunch's own pass): ids read more than once by the old job in the
    pass and the relaunched one together, and ids of the old layout's uninterrupted pass never read."""
    restart = mode == "restart"
    launch = job["launch"]
    dp, mbs = mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE
    consumed = base["consumed_before_iteration"]
    bounds = [0, *(mc.PHASE_STARTS if restart else []), base["train_iters"]]
    first = bounds[launch]
    cyclic = mc.SAMPLERS[sampler][0] == "cyclic"
    before = []
    for rank in range(dp):  # the old job, in its launch, up to the resume
        steps = (consumed[iteration] - consumed[first]) // (dp * mbs)
        mine = [mb for mb in base["train"][rank] if mb[0] == launch]
        before += [i for mb in mine[:steps] for i in mb[1:]]
    after = [i for ids in job["after"] for i in ids]
    # the old layout's uninterrupted pass of that launch
    m.configure(sampler, schedule, dp, mbs, mc.PHASE_STARTS if restart else None)
    blends = mc.PHASES if restart else [mc.PHASES[0]]
    expected = []
    for rank in range(dp):
        m.rank = rank
        train, _, _ = m.loaders(mc.data_words(blends[launch], lambda name: str(m.data / name)), first,
                                consumed[first], 0)
        expected += _pass(train.batch_sampler, consumed[bounds[launch + 1]] - consumed[first] if restart else None,
                          dp * mbs)
    if not restart and cyclic:  # only what the old job read in the epoch the new sampler resumes in (epoch 0 here)
        assert consumed[iteration] < len(expected)
    counts = np.bincount(np.array(before + after, dtype=np.int64), minlength=max(expected + before + after) + 1)
    wanted = np.unique(expected)
    return {"repeated": int((counts > 1).sum()), "skipped": int((counts[wanted] == 0).sum())}


def continue_datasets(m: Megatron) -> dict[str, str]:
    """Each dataset's GPTDataset as the continue rule reads it: the one megatron-core builds for
    the first phase that names the dataset, sized to the run (a bare prefix: the GPTDataset itself)."""
    m.configure("single", "constant", mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE, None)
    sizes = m.space["get_train_valid_test_num_samples"]()
    out: dict[str, str] = {}
    for blend in mc.PHASES:
        m.args.data_path = mc.data_words(blend, lambda name: str(m.data / name))
        train = m.provider(sizes)[0].dataset
        names = [blend] if isinstance(blend, str) else list(blend)
        members = [train] if isinstance(blend, str) else train.datasets
        for name, gpt in zip(names, members):
            out.setdefault(name, m.key(gpt))
    return out


def arg_requests() -> list[tuple]:
    """(sampler, schedule, dp, mbs, transitions) of every launch line the recorder configures."""
    out = {("single", "constant", mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE, None)}  # continue_datasets
    for sampler, mode, schedule in mc.cells():
        if (mode, schedule) in mc.REFUSED or mode == "continue":
            continue
        for dp, mbs in ((mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE), mc.OTHER_LAYOUT):
            out.add((sampler, schedule, dp, mbs, tuple(mc.PHASE_STARTS) if mode == "restart" else None))
    return sorted(out, key=repr)


def parse_all(lm: Path, data: Path) -> dict[tuple, dict]:
    """vars(args) of Megatron's parse_args/validate_args for every launch line (matrix_args.py)."""
    requests = arg_requests()
    first = mc.data_words(mc.PHASES[0], lambda name: str(data / name))
    lines = [cell_line(mc.SAMPLERS[s], mc.SCHEDULES[b], dp, mbs, t and list(t), first, mc)
             for s, b, dp, mbs, t in requests]
    done = subprocess.run([sys.executable, str(HERE / "matrix_args.py"), str(lm)], check=True, text=True,
                          input=json.dumps({"lines": lines, "world_sizes": [r[2] for r in requests]}),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return {args_key(s, b, dp, mbs, t and list(t)): fields
            for (s, b, dp, mbs, t), fields in zip(requests, json.loads(done.stdout))}


def write_data(folder: Path) -> dict:
    """The generated datasets as megatron-core's IndexedDatasetBuilder writes them."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    out = {}
    for name in mc.DATASETS:
        builder = IndexedDatasetBuilder(str(folder / f"{name}.bin"), dtype=np.uint16)
        for doc in mc.tokens(name):
            builder.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
        builder.finalize(str(folder / f"{name}.idx"))
        out[name] = {ext: hashlib.sha256((folder / f"{name}.{ext}").read_bytes()).hexdigest() for ext in ("bin", "idx")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lm", required=True, type=Path)
    parser.add_argument("--lm-0.17", dest="lm017", required=True, type=Path)
    parser.add_argument("--lm-commit", help="the commit of a `git archive` given as --lm")
    parser.add_argument("--lm-0.17-commit", dest="lm017_commit", help="the commit of --lm-0.17's archive")
    a = parser.parse_args()
    load_megatron()
    import megatron.core.datasets.utils  # noqa: F401  (the real Split)
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # the DataLoader's, on a machine without a GPU
    samplers = load_samplers(a.lm)
    calc = {"0.19": load_module(a.lm / "megatron/core/num_microbatches_calculator.py", "calc_019"),
            "0.17": load_module(a.lm017 / "megatron/core/num_microbatches_calculator.py", "calc_017")}
    cells: dict = {}
    made: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        written = write_data(data)
        cache = str(Path(tmp) / "cache")
        new = Megatron(a.lm, calc["0.19"], samplers, data, cache)
        old = Megatron(a.lm017, calc["0.17"], samplers, data, cache)
        old.datasets, old._keys = new.datasets, new._keys  # one store of digests
        new.parsed = old.parsed = parse_all(a.lm, data)
        continued = continue_datasets(new)
        for sampler, mode, schedule in mc.cells():
            name = f"{sampler}/{mode}/{schedule}"
            if (mode, schedule) in mc.REFUSED:
                cells[name] = {"refused": mc.REFUSED[(mode, schedule)]}
                made[name] = "not run: Megatron-LM refuses the cell"
                continue
            m = old if schedule == "rampup" else new
            made[name] = "rampup" if schedule == "rampup" else "parse_args"
            if mode == "continue":  # Megatron defines its first phase: the no-phases run of the same cell
                base = cells[f"{sampler}/none/{schedule}"]
                cells[name] = {"stock": f"{sampler}/none/{schedule}", "train_iters": base["train_iters"],
                               "consumed_before_iteration": base["consumed_before_iteration"],
                               "phase_starts": [base["consumed_before_iteration"][t] for t in mc.PHASE_STARTS],
                               "continue_gpt": continued}
                continue
            cell = run_cell(m, sampler, mode, schedule)
            cell["resumed"] = {}
            for t in mc.PHASE_STARTS:
                for iteration in (t - 1, t, t + 1):
                    for dp, mbs in ((mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE), mc.OTHER_LAYOUT):
                        at = cell["consumed_before_iteration"][iteration]
                        job = resumed(m, sampler, mode, schedule, cell, dp, mbs, iteration)
                        entry = {"streams": job["streams"]}
                        if (dp, mbs) == mc.OTHER_LAYOUT:
                            entry.update(resume_counts(m, sampler, mode, schedule, cell, job, iteration))
                        cell["resumed"][f"dp={dp},mbs={mbs},from={at}"] = entry
            cells[name] = cell
            print(name, "recorded", flush=True)
    out = {"about": "Megatron's reads in every cell of the reference matrix, recorded by record_matrix.py",
           "megatron_core": "0.19.2", "megatron_lm": "core_v0.19.0 (ramp-up: core_v0.17.0's calculator and loop)",
           "torch_version": torch.__version__,
           "provenance": {"megatron-core": metadata.version("megatron-core"), "torch": torch.__version__,
                          "python": platform.python_version(),
                          "megatron_lm": {"core_v0.19.0": a.lm_commit or "core_v0.19.0",
                                          "core_v0.17.0": a.lm017_commit or "core_v0.17.0"},
                          "args": {"how": ARGS_MADE, "rampup": ARGS_RAMPUP, "cells": made}},
           "digest": f"sha256 of the sample's tokens and last label as int64, first {DIGITS} hex digits",
           "data": written, "datasets": new.datasets, "cells": cells}
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
