"""Megatron-LM's training-side code, cut out of a checkout by name and run without its
training stack (no GPU, no torch.distributed, Python 3.11): the datasets provider of
pretrain_gpt.py, get_train_valid_test_num_samples, build_train_valid_test_data_loaders
(each launch's phase-sized train split and consumed offset), cyclic_iter,
update_train_iters, the train() loop's microbatch update, evaluate(), data_samplers.py's
build_pretraining_data_loader with its samplers over a real torch DataLoader, and the
num_microbatches calculator of that version. Used by record_matrix.py; needs torch and
megatron-core 0.19.2 (its dataset modules loaded as record_phases.load_megatron does).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from record_batch_schedules import (  # noqa: E402
    _Anything,
    _function,
    batch_size_defaults,
    evaluate_function,
    loop_microbatch_statements,
)

import matrix_cases as mc  # noqa: E402

DIGITS = 12


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
        self.parsed: dict[tuple, dict] = {}  # args_key -> vars(args) of Megatron's parse_args/validate_args
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
        """The args of one launch: Megatron-LM's parse_args and validate_args of the cell's launch
        line (self.parsed, made by matrix_args.py), then the ramp-up (core_v0.19.0 has no
        --rampup-batch-size: its value set, and core_v0.17.0's validate_args batch-size statements
        run on it) and update_train_iters; self.made says how."""
        keys = mc.SCHEDULES[schedule]
        fields = self.parsed.get(args_key(sampler, schedule, dp, mbs, transitions))
        if fields is None:
            raise KeyError(f"no parsed args for {(sampler, schedule, dp, mbs, transitions)}: list it in arg_requests")
        a = SimpleNamespace(**fields)
        # the training loop's state (pretrain() sets it from the checkpoint; loaders() per launch)
        a.iteration, a.consumed_train_samples, a.consumed_valid_samples, a.data_path = 0, 0, 0, None
        a.rampup_batch_size = keys.get("rampup_batch_size")
        self.args = a
        self.samplers.get_args, self.samplers.mpu = (lambda: self.args), self.mpu  # one module, two versions
        if a.rampup_batch_size is not None:
            if "eval_micro_batch_size" not in (self.lm / "megatron/training/arguments.py").read_text():
                del a.eval_micro_batch_size, a.eval_global_batch_size  # core_v0.17.0 has neither
            exec(compile(batch_size_defaults(self.lm), "arguments.py", "exec"),
                 {"args": a, "print_rank_0": lambda *x: None, "is_global_batch_size_explicitly_specified": True})
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


def args_key(sampler: str, schedule: str, dp: int, mbs: int, transitions: list[int] | None) -> tuple:
    """The launch line's key: what its arguments depend on (the data path is set per launch)."""
    return sampler, "constant" if schedule == "rampup" else schedule, dp, mbs, tuple(transitions or ())


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
