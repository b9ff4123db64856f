"""Record what Megatron-Bridge 0.6.2 reads for GPT pretraining (issue 42 item 5) into
bridge.json and bridge_run_config.yaml beside this file (tests/test_bridge.py checks a
mount of `mmfs config --from-bridge` and mmfs.adapters.bridge against them).

    python tests/reference/record_bridge.py

in a Python 3.11 venv with torch 2.13.0 (CPU), megatron-core 0.19.2 and
megatron-bridge 0.6.2, both installed with --no-deps --ignore-requires-python (their
wheels say Python >= 3.12), plus numpy, pyyaml, packaging, triton, transformers,
datasets, omegaconf, hydra-core, einops, rich, tqdm, regex, pillow and tensorboard,
which the imported modules import. What runs is Bridge's own code, unmodified:

- the config: Bridge's ConfigContainer with its GPTDatasetConfig, TrainingConfig,
  ValidationConfig, RNGConfig, TokenizerConfig ... (training/config.py), finalized by
  their own finalize(), written by ConfigContainer.to_yaml as a checkpoint's
  run_config.yaml is; the tokenizer is Bridge's build_tokenizer (NullTokenizer);
- the sample counts: data/loaders.py's get_train_valid_test_num_samples;
- the datasets: data/utils.py's pretrain_train_valid_test_datasets_provider
  (megatron-core's BlendedMegatronDatasetBuilder, GPTDataset, BlendedDataset) over
  IndexedDatasets written by megatron-core's IndexedDatasetBuilder (the documents of
  tests/matrix_cases.py);
- the loaders: data/loaders.py's build_train_valid_test_data_loaders over
  data/samplers.py's build_pretraining_data_loader (its samplers and a torch
  DataLoader), once per data-parallel rank, from a TrainState carrying the consumed
  counts a checkpoint's train_state.pt holds; the batch sampler's global-batch shares
  cut into micro-batches by data/batch_utils.py's split_batch_into_microbatches, as
  train.py's fine-tuning path does.

What is not Bridge's own: Python 3.11 lacks typing.override (3.12), given here as
typing_extensions'; Bridge's model, PEFT and diffusion packages and megatron.energon
(model code and another data source, which need transformer-engine and GPUs) are
empty placeholder modules, and megatron.bridge's package __init__ (which imports the
models) is not run; the model section of the config is megatron-core's
ModelParallelConfig (the parallel sizes) instead of a GPTModelProvider.
build_train_valid_test_data_loaders asks torch.distributed for its ranks and
broadcasts a CUDA flags tensor: the loaders module sees a torch whose distributed
answers the emulated rank and data-parallel size (broadcast: nothing to do on one
process) and whose tensor() keeps the flags on the CPU. Nothing else is replaced.

Recorded compactly as tests/reference/record_matrix.py does: every sample of every split
as a 12-hex digest (sha256 of its sequence_length + 1 tokens as int64), and each rank's
micro-batches as lists of digests, one pass of its DataLoader. Deterministic.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys
import tempfile
import types
import typing
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import matrix_cases as mc  # noqa: E402  (numpy only: the documents of the matrix)

PLACEHOLDERS = ("megatron.bridge.models", "megatron.bridge.peft", "megatron.bridge.diffusion", "megatron.energon")

# The runs recorded: name -> (dataset, train, validation, parallel, train_state). The
# dataset seed (random_seed) differs from rng.seed so that a reader taking the wrong one
# shows other samples; eval batch sizes differ from training's.
BASE_DATASET = {"blend": [["data/web", "data/code"], [0.6, 0.4]], "split": "80,15,5", "random_seed": 31,
                "seq_length": mc.SEQUENCE_LENGTH, "path_to_cache": "cache", "dataloader_type": "single",
                "num_workers": 0}
BASE_TRAIN = {"micro_batch_size": 2, "global_batch_size": 8, "train_iters": 24}
BASE_VALIDATION = {"eval_interval": 5, "eval_iters": 2, "eval_micro_batch_size": 1, "eval_global_batch_size": 4}
RUNS = {
    "single": ({}, {}, {}, {"world_size": 4, "tensor_model_parallel_size": 2}, None),
    "cyclic": ({"dataloader_type": "cyclic"}, {}, {}, {"world_size": 2}, None),
    "cyclic-unsharded": ({"dataloader_type": "cyclic", "data_sharding": False}, {}, {}, {"world_size": 2}, None),
    "dp4": ({"dataloader_type": "cyclic"}, {"micro_batch_size": 1}, {}, {"world_size": 4}, None),
    "samples": ({}, {"train_iters": None, "train_samples": 200}, {"eval_global_batch_size": None}, {"world_size": 2},
                None),
    "resume-single": ({}, {}, {}, {"world_size": 2}, {"consumed_train_samples": 80, "consumed_valid_samples": 12}),
    "resume-cyclic": ({"dataloader_type": "cyclic"}, {}, {}, {"world_size": 2},
                      {"consumed_train_samples": 168, "consumed_valid_samples": 36}),
    # Bridge's fine-tuning sampler (global batches reshuffled each epoch with seed + epoch)
    "batch": ({"dataloader_type": "batch"}, {}, {}, {"world_size": 2}, None),
    "batch-dp4": ({"dataloader_type": "batch"}, {"micro_batch_size": 1}, {"eval_global_batch_size": 8},
                  {"world_size": 4}, None),
    "resume-batch": ({"dataloader_type": "batch"}, {}, {}, {"world_size": 2},
                     {"consumed_train_samples": 176, "consumed_valid_samples": 8}),
}
FIXTURE = "cyclic"  # the run whose run_config.yaml is saved as bridge_run_config.yaml
RESUMED = "resume-cyclic"  # the run whose counts bridge_train_state.pt holds


class _Placeholder(types.ModuleType):
    """A module of Bridge's model side: any name is an empty class."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


class _Placeholders(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == p or name.startswith(p + ".") for p in PLACEHOLDERS):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Placeholder(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_bridge() -> types.SimpleNamespace:
    import typing_extensions

    typing.override = typing_extensions.override
    sys.meta_path.insert(0, _Placeholders())
    import megatron.core

    root = importlib.util.find_spec("megatron.core").submodule_search_locations[0].rsplit("/core", 1)[0]
    package = types.ModuleType("megatron.bridge")
    package.__path__ = [f"{root}/bridge"]
    sys.modules["megatron.bridge"] = package
    megatron.bridge = package
    from megatron.bridge.data import batch_utils, loaders, samplers, utils
    from megatron.bridge.training import config, state
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
    return types.SimpleNamespace(batch_utils=batch_utils, loaders=loaders, samplers=samplers, utils=utils,
                                 config=config, state=state, TokenizerConfig=TokenizerConfig,
                                 build_tokenizer=build_tokenizer)


class EmulatedTorch(types.ModuleType):
    """torch as the loaders module sees it: distributed answers one emulated rank."""

    def __init__(self, torch, rank: int, size: int) -> None:
        super().__init__("torch")
        self._torch, self._rank, self._size = torch, rank, size
        self.distributed = types.SimpleNamespace(get_rank=lambda group=None: self._rank,
                                                 get_world_size=lambda group=None: self._size,
                                                 broadcast=lambda tensor, src, group=None: None,
                                                 ProcessGroup=object)

    def tensor(self, *args, **kwargs):
        kwargs.pop("device", None)
        return self._torch.tensor(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def digest(tokens) -> str:
    import numpy as np
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:12]


def sample_digest(item) -> str:
    """A GPTDataset item's sequence_length + 1 tokens: its tokens and its last label."""
    import numpy as np
    tokens = np.asarray(item["tokens"]).tolist() + [int(np.asarray(item["labels"])[-1])]
    return digest(tokens)


def batch_digests(batch) -> list[str]:
    import numpy as np
    tokens, labels = np.asarray(batch["tokens"]), np.asarray(batch["labels"])
    return [digest(list(t) + [int(last[-1])]) for t, last in zip(tokens, labels)]


def flatten(tree: dict, prefix: str = "") -> dict:
    """{dotted key: value} of a YAML mapping's leaves (lists are leaves)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def as_value(value) -> str:
    """A value as an override's YAML text (flow style: `false`, `[4, 4, 48]`)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def write_data(folder: Path) -> dict:
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    folder.mkdir(parents=True, exist_ok=True)
    sums = {}
    for name in mc.DATASETS:
        builder = IndexedDatasetBuilder(str(folder / f"{name}.bin"), dtype=np.uint16)
        for doc in mc.tokens(name):
            builder.add_document(doc, [len(doc)])
        builder.finalize(str(folder / f"{name}.idx"))
        sums[name] = {ext: hashlib.sha256((folder / f"{name}.{ext}").read_bytes()).hexdigest()
                      for ext in ("bin", "idx")}
    return sums


def make_config(b, name: str):
    """Bridge's ConfigContainer of a run, finalized by its own sub-configs' finalize()."""
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    dataset_over, train_over, validation_over, parallel, _ = RUNS[name]
    c = b.config
    dataset = c.GPTDatasetConfig(**{**BASE_DATASET, **dataset_over}, reset_position_ids=False,
                                 reset_attention_mask=False, eod_mask_loss=False)
    train = c.TrainingConfig(**{k: v for k, v in {**BASE_TRAIN, **train_over}.items()})
    validation = c.ValidationConfig(**{**BASE_VALIDATION, **validation_over})
    model = ModelParallelConfig(tensor_model_parallel_size=parallel.get("tensor_model_parallel_size", 1))
    cfg = c.ConfigContainer(
        train=train, validation=validation, dataset=dataset, model=model, rng=c.RNGConfig(seed=1234),
        optimizer=OptimizerConfig(), scheduler=c.SchedulerConfig(), logger=c.LoggerConfig(),
        tokenizer=b.TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=mc.EOD + 1),
        checkpoint=c.CheckpointConfig())
    train.finalize()
    dataset.finalize()
    if validation.eval_global_batch_size is None:  # ConfigContainer.validate's defaults
        validation.eval_global_batch_size = train.global_batch_size
    if validation.eval_micro_batch_size is None:
        validation.eval_micro_batch_size = train.micro_batch_size
    return cfg, parallel["world_size"] // parallel.get("tensor_model_parallel_size", 1)


def one_pass(b, loader, micro_batch_size: int) -> list[list[str]]:
    """Each micro-batch of one pass of the loader; the batch sampler yields a rank's share
    of a global batch, which train.py cuts into micro-batches (split_batch_into_microbatches)."""
    if loader is None:
        return []
    out = []
    for batch in loader:
        rows = len(batch["tokens"])
        for micro in b.batch_utils.split_batch_into_microbatches(batch, rows // micro_batch_size):
            out.append(batch_digests(micro))
    return out


def record_run(b, name: str, folder: Path) -> tuple[dict, str]:
    import torch
    cfg, dp = make_config(b, name)
    yaml_path = folder / f"{name}.run_config.yaml"
    cfg.dataset.tokenizer = b.build_tokenizer(cfg.tokenizer)  # as setup() does before any checkpoint
    cfg.to_yaml(str(yaml_path))
    counts = list(b.loaders.get_train_valid_test_num_samples(cfg))
    state_counts = RUNS[name][4] or {}
    out: dict = {"num_samples": counts, "data_parallel_size": dp, "train_state": state_counts, "ranks": {}}
    real_torch = b.loaders.torch
    datasets = None
    for rank in range(dp):
        train_state = b.state.TrainState(**state_counts)
        b.loaders.torch = EmulatedTorch(torch, rank, dp)
        try:
            loaders = b.loaders.build_train_valid_test_data_loaders(
                cfg, train_state, b.utils.pretrain_train_valid_test_datasets_provider, dp_group=None)
        finally:
            b.loaders.torch = real_torch
        if datasets is None:
            datasets = [loader.dataset for loader in loaders]
        sizes = (cfg.train.micro_batch_size, cfg.validation.eval_micro_batch_size,
                 cfg.validation.eval_micro_batch_size)
        out["ranks"][rank] = {split: one_pass(b, loader, mbs)
                              for split, loader, mbs in zip(("train", "valid", "test"), loaders, sizes)}
    out["samples"] = {split: [sample_digest(ds[i]) for i in range(len(ds))]
                      for split, ds in zip(("train", "valid", "test"), datasets)}
    return out, yaml_path.read_text()


def main() -> None:
    b = import_bridge()
    from importlib.metadata import version

    import megatron.core
    import numpy
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.chdir(folder)  # dataset paths as a launch would give them: relative to where Bridge runs
        data = write_data(folder / "data")
        runs, texts = {}, {}
        for name in RUNS:
            runs[name], texts[name] = record_run(b, name, folder)
    # Each run as Bridge's launcher gives it: the fixture's run_config.yaml and KEY=VALUE
    # overrides (every key whose value differs), checked to give the run's own file.
    fixture = yaml.safe_load(texts[FIXTURE])
    for name, text in texts.items():
        own = flatten(yaml.safe_load(text))
        base = flatten(fixture)
        assert own.keys() == base.keys(), name
        runs[name]["overrides"] = [f"{key}={as_value(value)}" for key, value in sorted(own.items())
                                   if value != base[key]]
    reference = {
        "provenance": {
            "recorded_by": "tests/reference/record_bridge.py",
            "date": datetime.date.today().isoformat(),
            "python": platform.python_version(),
            "packages": {p: version(p) for p in ("megatron-bridge", "megatron-core", "torch", "numpy")},
            "megatron_core_file": megatron.core.__file__.split("site-packages/")[-1],
            # the sha256 of each Bridge module that ran, as the 0.6.2 wheel ships it
            "bridge_modules": {m.__name__: hashlib.sha256(Path(m.__file__).read_bytes()).hexdigest()
                               for m in (b.samplers, b.loaders, b.utils, b.config, b.state, b.batch_utils)},
            "how": "Bridge's ConfigContainer and sub-configs finalized by their own finalize(); counts by "
                   "loaders.get_train_valid_test_num_samples; datasets by utils.pretrain_train_valid_test_"
                   "datasets_provider; loaders by loaders.build_train_valid_test_data_loaders per emulated "
                   "data-parallel rank (see the recorder's docstring for what is not Bridge's own)",
            "torch": torch.__version__, "numpy": numpy.__version__,
        },
        "data": data,
        "fixture": f"bridge_run_config.yaml: run {FIXTURE!r}'s run_config.yaml; bridge_train_state.pt: run "
                   f"{RESUMED!r}'s train_state.pt",
        "runs": {name: {**run, "world_size": RUNS[name][3]["world_size"]} for name, run in runs.items()},
    }
    (HERE / "bridge.json").write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")
    (HERE / "bridge_run_config.yaml").write_text(texts[FIXTURE])
    # A checkpoint's train_state.pt, saved as Bridge's checkpointing saves it (TrainState.state_dict,
    # floating_point_operations_so_far as float32), with the counts of the resumed run RESUMED.
    state = b.state.TrainState(step=RUNS[RESUMED][4]["consumed_train_samples"] // BASE_TRAIN["global_batch_size"],
                               **RUNS[RESUMED][4]).state_dict()
    state["floating_point_operations_so_far"] = torch.tensor(0.0, dtype=torch.float32)
    torch.save(state, HERE / "bridge_train_state.pt")
    print(f"wrote {HERE / 'bridge.json'} and {HERE / 'bridge_run_config.yaml'}")


if __name__ == "__main__":
    main()
