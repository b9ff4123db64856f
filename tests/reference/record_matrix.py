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
- the batch sizes: validate_args' batch defaults, update_train_iters, train()'s
  per-iteration microbatch update and the calculator of that version (0.17 for the
  ramp-up, else 0.19); evaluate() itself, its forward_backward_func reading its
  micro-batches from the data iterator as Megatron's schedules do.

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
import ast
import contextlib
import copy
import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import sys
import tempfile
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from record_batch_schedules import _Anything, _function, batch_size_defaults, evaluate_function  # noqa: E402
from record_phases import load_megatron  # noqa: E402

import matrix_cases as mc  # noqa: E402

OUT = HERE / "matrix.json"
DIGITS = 12
STREAM_SAMPLES = 16  # how far a resumed job's micro-batches are recorded from its consumed_samples


def digest(tokens: np.ndarray, last_label: np.ndarray) -> str:
    data = np.ascontiguousarray(tokens, dtype=np.int64).tobytes() + np.ascontiguousarray(last_label,
                                                                                          dtype=np.int64).tobytes()
    return hashlib.sha256(data).hexdigest()[:DIGITS]


class Indexed:
    """A Megatron dataset whose items also carry their index (to record the ids the
    sampler chose); everything else is the dataset's own (its split decides whether
    build_pretraining_data_loader takes the eval batch sizes)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        import torch

        return {**self.dataset[i], "mmfs_index": torch.tensor(int(i))}

    def __getattr__(self, name):
        return getattr(self.dataset, name)


class Tokenizer:
    eod = mc.EOD
    pad = -1
    vocab_size = mc.EOD + 1
    unique_identifiers = {"class": "matrix-recorder", "eod": mc.EOD}


class Megatron:
    """One version's training-side code, cut out of Megatron-LM by name, and the
    datasets it builds (digests kept by dataset)."""

    def __init__(self, lm: Path, calc: types.ModuleType, samplers: types.ModuleType, data: Path, cache: str):
        self.lm, self.calc, self.samplers, self.data, self.cache = lm, calc, samplers, data, cache
        self.datasets: dict[str, list[str]] = {}  # key -> sample digests
        self._keys: dict[str, str] = {}  # the dataset's unique_description_hash -> key
        self.rank = 0
        self.args = SimpleNamespace()
        mpu = SimpleNamespace(get_data_parallel_rank=lambda: self.rank,
                              get_data_parallel_world_size=lambda: self.args.data_parallel_size,
                              get_tensor_model_parallel_rank=lambda: 0)
        self.mpu = mpu
        import torch

        fake_torch = SimpleNamespace(tensor=lambda data, dtype=None, device=None: torch.tensor(data, dtype=dtype),
                                     long=torch.long, distributed=SimpleNamespace(broadcast=lambda *a, **k: None))
        space = {"get_args": lambda: self.args, "print_rank_0": lambda *a, **k: None, "mpu": mpu,
                 "torch": fake_torch, "build_pretraining_data_loader": samplers.build_pretraining_data_loader,
                 "update_num_microbatches": calc.update_num_microbatches,
                 "get_current_global_batch_size": calc.get_current_global_batch_size}
        training = lm / "megatron/training/training.py"
        names = ["get_train_valid_test_num_samples", "build_train_valid_test_datasets",
                 "build_train_valid_test_data_loaders", "cyclic_iter", "update_train_iters"]
        functions = [_function(training, name) for name in names]
        exec(compile(ast.Module(body=functions, type_ignores=[]), str(training), "exec"), space)
        self.space = space

    # -- the datasets provider, as pretrain_gpt.py's ------------------------------------

    def provider(self, num_samples):
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.utils import get_blend_from_list

        config = GPTDatasetConfig(random_seed=self.args.seed, sequence_length=self.args.seq_length,
                                  blend=get_blend_from_list(self.args.data_path), split=self.args.split,
                                  path_to_cache=self.cache, tokenizer=Tokenizer(), reset_position_ids=False,
                                  reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
        built = BlendedMegatronDatasetBuilder(GPTDataset, num_samples, lambda: True, config).build()
        return tuple(None if d is None else Indexed(d) for d in built)

    def key(self, dataset) -> str:
        """The digests of every sample of a dataset Megatron built, stored once."""
        inner = dataset.dataset if isinstance(dataset, Indexed) else dataset
        if inner.unique_description_hash not in self._keys:
            digests = [digest(s["tokens"].numpy(), s["labels"].numpy()[-1:]) for s in map(inner.__getitem__,
                                                                                        range(len(inner)))]
            key = hashlib.sha256(" ".join(digests).encode()).hexdigest()[:10]
            self.datasets.setdefault(key, digests)
            self._keys[inner.unique_description_hash] = key
        return self._keys[inner.unique_description_hash]

    def read(self, batch, dataset_key: str) -> list[int]:
        """The sample ids of a micro-batch the loader gave, each checked against its digest."""
        ids = [int(i) for i in batch["mmfs_index"]]
        for row, i in enumerate(ids):
            got = digest(batch["tokens"][row].numpy(), batch["labels"][row].numpy()[-1:])
            assert got == self.datasets[dataset_key][i], (dataset_key, i)
        return ids

    # -- one launch of pretrain(), on one data-parallel rank -----------------------------

    def configure(self, sampler: str, schedule: str, dp: int, mbs: int, transitions: list[int] | None) -> None:
        dataloader_type, sharding = mc.SAMPLERS[sampler]
        keys = mc.SCHEDULES[schedule]
        a = SimpleNamespace(
            micro_batch_size=mbs, data_parallel_size=dp, global_batch_size=keys.get("global_batch_size"),
            rampup_batch_size=keys.get("rampup_batch_size"), step_batch_size_schedule=keys.get(
                "step_batch_size_schedule"), train_samples=mc.TRAIN_SAMPLES, train_iters=None,
            eval_interval=mc.EVAL_INTERVAL, eval_iters=mc.EVAL_ITERS, full_validation=False, skip_train=False,
            start_eval_at_iter=None, phase_transition_iterations=transitions, iteration=0,
            consumed_train_samples=0, consumed_valid_samples=0, perform_rl_step=False,
            multiple_validation_sets=False, dataloader_type=dataloader_type, data_sharding=sharding,
            hybrid_context_parallel=False, num_workers=0, exit_signal_handler=False, seq_length=mc.SEQUENCE_LENGTH,
            seed=mc.SEED, split=mc.SPLIT, data_path=None, rl_use_sequence_packing=False, save=None,
            gtp_weight_remat_size=1, cuda_graph_impl="none", moe_expert_rank_capacity_factor=None,
            empty_unused_memory_level=0, decoder_seq_length=None, sft=False, exit_duration_in_mins=None,
            cuda_graph_scope=[], cuda_graph_warmup_steps=0, reuse_grad_buf_for_mxfp8_param_ag=False,
            overlap_param_gather=False, vision_pretraining=False, vision_pretraining_type=None,
        )
        explicit = a.global_batch_size is not None
        if "eval_micro_batch_size" in (self.lm / "megatron/training/arguments.py").read_text():
            a.eval_global_batch_size = a.eval_micro_batch_size = None
        self.args = a
        self.samplers.get_args, self.samplers.mpu = (lambda: self.args), self.mpu  # one module, two versions
        exec(compile(batch_size_defaults(self.lm), "arguments.py", "exec"),
             {"args": a, "print_rank_0": lambda *x: None, "is_global_batch_size_explicitly_specified": explicit})
        self.init_calculator()
        self.space["update_train_iters"](a)

    def init_calculator(self) -> None:
        a = self.args
        self.calc.destroy_num_microbatches_calculator()
        wanted = inspect.signature(self.calc.init_num_microbatches_calculator).parameters
        given = {"rank": 0, "rampup_batch_size": a.rampup_batch_size, "global_batch_size": a.global_batch_size,
                 "micro_batch_size": a.micro_batch_size, "data_parallel_size": a.data_parallel_size,
                 "decrease_batch_size_if_needed": False, "step_batch_size_schedule": a.step_batch_size_schedule,
                 "seq_length": a.seq_length}
        self.calc.init_num_microbatches_calculator(**{k: v for k, v in given.items() if k in wanted})

    def consumed_before_iterations(self) -> list[int]:
        """consumed_train_samples before each iteration 1..train_iters, and at the end, as train()'s
        loop counts it (its microbatch update statements run as they are)."""
        from record_batch_schedules import loop_microbatch_statements

        a = self.args
        self.init_calculator()
        code = compile(loop_microbatch_statements(self.lm), "training.py", "exec")
        space = {"args": SimpleNamespace(**vars(a)), "update_num_microbatches": self.calc.update_num_microbatches,
                 "get_num_microbatches": self.calc.get_num_microbatches, "print_rank_0": lambda *x: None,
                 "num_microbatches": self.calc.get_num_microbatches(), "iteration": 0}
        out = []
        while space["iteration"] < a.train_iters:
            exec(code, space)
            out.append(space["args"].consumed_train_samples)
            space["args"].consumed_train_samples += a.data_parallel_size * a.micro_batch_size * \
                self.calc.get_num_microbatches()
            space["iteration"] += 1
        out.append(space["args"].consumed_train_samples)
        self.init_calculator()
        return out

    def loaders(self, data_path: list[str], iteration: int, consumed_train: int, consumed_valid: int):
        """build_train_valid_test_data_loaders of a launch resumed at `iteration`."""
        a = self.args
        a.data_path, a.iteration = data_path, iteration
        a.consumed_train_samples, a.consumed_valid_samples = consumed_train, consumed_valid
        train, valid, test = self.space["build_train_valid_test_data_loaders"](self.provider)
        return train, valid[0], test

    def iterate(self, loader):
        """The training loop's iterator of a loader (build_train_valid_test_data_iterators)."""
        return self.space["cyclic_iter"](loader) if self.args.dataloader_type == "cyclic" else iter(loader)

    def evaluate(self, data_iterator) -> list[list]:
        """evaluate() itself: each eval step's micro-batches, as its forward_backward_func reads them."""
        steps: list[list] = []

        def forward_backward_func(*, data_iterator, num_microbatches, **_):
            steps.append([next(data_iterator) for _ in range(num_microbatches)])
            return []

        fn = evaluate_function(self.lm)
        anything = _Anything()
        space = {name: anything for name in {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}}
        space.update(__builtins__=__builtins__, len=len, getattr=getattr, ValueError=ValueError,
                     get_args=lambda: self.args, get_forward_backward_func=lambda **_: forward_backward_func,
                     has_nvidia_modelopt=False, is_last_rank=lambda: False, is_pp_last_stage=lambda *a: False,
                     torch=SimpleNamespace(no_grad=contextlib.nullcontext),
                     _otel_managed_span=lambda *a, **k: contextlib.nullcontext())
        exec(compile(ast.Module(body=[fn], type_ignores=[]), "training.py", "exec"), space)
        space["evaluate"](None, data_iterator, [anything], None, anything)
        return steps


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


def load_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_samplers(lm: Path) -> types.ModuleType:
    """Megatron-LM's data_samplers.py over the real megatron.core.datasets.utils (its Split
    decides eval batch sizes); get_args and mpu are set per launch."""
    sys.modules["megatron.core"].mpu = SimpleNamespace()
    training = types.ModuleType("megatron.training")
    training.__path__ = []
    training.get_args = None
    handler = types.ModuleType("megatron.training.dist_signal_handler")
    handler.DistributedSignalHandler = object
    sys.modules.update({"megatron.training": training, "megatron.training.dist_signal_handler": handler})
    return load_module(lm / "megatron/training/datasets/data_samplers.py", "matrix_data_samplers")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lm", required=True, type=Path)
    parser.add_argument("--lm-0.17", dest="lm017", required=True, type=Path)
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
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        written = write_data(data)
        cache = str(Path(tmp) / "cache")
        new = Megatron(a.lm, calc["0.19"], samplers, data, cache)
        old = Megatron(a.lm017, calc["0.17"], samplers, data, cache)
        old.datasets, old._keys = new.datasets, new._keys  # one store of digests
        continued = continue_datasets(new)
        for sampler, mode, schedule in mc.cells():
            name = f"{sampler}/{mode}/{schedule}"
            if (mode, schedule) in mc.REFUSED:
                cells[name] = {"refused": mc.REFUSED[(mode, schedule)]}
                continue
            m = old if schedule == "rampup" else new
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
           "digest": f"sha256 of the sample's tokens and last label as int64, first {DIGITS} hex digits",
           "data": written, "datasets": new.datasets, "cells": cells}
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
