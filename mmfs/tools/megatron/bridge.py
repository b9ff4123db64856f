"""`mmfs config --from-bridge RUN_CONFIG.yaml [KEY=VALUE ...]`: the mmfs config of a
Megatron-Bridge 0.6.x GPT pretraining run, from the run_config.yaml every Bridge
checkpoint holds (ConfigContainer.to_yaml) and the KEY=VALUE overrides its
run_recipe.py launches take.

What Bridge 0.6.x reads, and so what the config says (data/loaders.py, samplers.py,
utils.py; recorded in tests/reference/bridge.json):
- train: `dataset.dataloader_type` (single or cyclic) on train.micro_batch_size and the
  data-parallel size (world size / tensor x pipeline x context parallel sizes);
- valid: always the cyclic sampler for a GPTDatasetConfig, on the eval micro-batch and
  global batch sizes (validation.eval_*, by default training's); test: the training's
  sampler on the eval sizes;
- the counts: train_samples, else train_iters x global_batch_size; valid
  (train_iters // eval_interval + 1) x eval_iters x eval_global_batch_size; test
  eval_iters x eval_global_batch_size (the training: block derives the same);
- the dataset seed: dataset.random_seed (rng.seed seeds the model, not the data);
- rampup_batch_size and step_batch_size_schedule: no effect on the samplers in 0.6.x;
- dataloader_type batch (fine-tuning recipes'): whole global batches of
  randperm(split, dataset.random_seed + epoch), rank r reading G[r::dp] in order.
"""

from __future__ import annotations

import math
import os
import re
import sys
from typing import Any

import yaml

from mmfs.config.blend import parse_split
from mmfs.config.checker import Checker
from mmfs.config.safe_yaml import read_yaml_source, show
from mmfs.config.schema import MAX_SURPLUS
from mmfs.config.training import parse_training, with_schedule
from mmfs.errors import MmfsError
from mmfs.tools.megatron.args import SAFE_DUMPER
from mmfs.tools.megatron.tokenizer import tokenizer_block

GPT_DATASET = "megatron.bridge.training.config.GPTDatasetConfig"
TRAIN_STATE = "train_state.pt"  # beside run_config.yaml in every Bridge checkpoint
TOKENIZER_FLAGS = {"tokenizer_type": "--tokenizer-type", "vocab_size": "--vocab-size",
                   "tokenizer_model": "--tokenizer-model", "vocab_file": "--vocab-file", "merge_file": "--merge-file",
                   "tiktoken_pattern": "--tiktoken-pattern", "null_tokenizer_eod_id": "--null-tokenizer-eod-id"}
# dataset keys whose non-default value changes what a rank reads in a way mmfs does not serve
REFUSED = {
    "mock": ((None, False), "Bridge trains on generated mock samples, not on files"),
    "allow_ambiguous_pad_tokens": ((None, False), "mmfs keeps megatron-core's default pad handling"),
    "full_validation": ((None, False), "megatron-core's full validation reads the whole valid split"),
    "multiple_validation_sets": ((None, False), "each valid dataset would be its own validation set"),
}
NOTED = {
    "rampup_batch_size": "has no effect on Bridge 0.6.x's samplers (the global batch is constant)",
    "step_batch_size_schedule": "has no effect on Bridge 0.6.x's samplers (the global batch is constant)",
}


class BridgeConfigError(MmfsError):
    """A run_config.yaml (or override) mmfs cannot turn into a config: one line, exit 2."""


# the training: block's keys as Bridge's run_config.yaml names them
BRIDGE_KEYS = {"micro_batch_size": "train.micro_batch_size", "global_batch_size": "train.global_batch_size",
               "train_iters": "train.train_iters", "train_samples": "train.train_samples",
               "eval_interval": "validation.eval_interval", "eval_iters": "validation.eval_iters",
               "eval_micro_batch_size": "validation.eval_micro_batch_size",
               "eval_global_batch_size": "validation.eval_global_batch_size",
               "dataloader_type": "dataset.dataloader_type", "data_sharding": "dataset.data_sharding",
               "data_parallel_size": "the data-parallel size (world size / model.tensor x pipeline x context "
                                     "parallel sizes)"}


class BridgeChecker(Checker):
    """The config's own checks of the training: block, naming Bridge's keys."""

    def __init__(self) -> None:
        super().__init__("")

    def fail(self, key: str, message: str) -> BridgeConfigError:
        if key == "split":
            return BridgeConfigError(f"dataset.split: {message}")

        def name(m: re.Match) -> str:
            return BRIDGE_KEYS.get(m.group(1), m.group(0))
        return BridgeConfigError(re.sub(r"\b(?:training\.)?([a-z]+(?:_[a-z]+)+)\b", name, f"{key}: {message}"))


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """`KEY=VALUE` overrides as run_recipe.py takes them (Hydra's dotted keys; `+KEY`
    adds a key): the value is read as YAML."""
    for item in overrides:
        key, eq, text = item.partition("=")
        add = key.startswith("+")
        key = key.lstrip("+")
        if not eq or not key or key.startswith(("~", "+")) or not all(key.split(".")):
            raise BridgeConfigError(f"{item}: an override is KEY=VALUE (e.g. train.train_iters=1000)")
        try:
            value = yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            raise BridgeConfigError(f"{item}: the value is not a YAML scalar, list or mapping") from None
        node, parts = tree, key.split(".")
        for i, part in enumerate(parts[:-1]):
            if not isinstance(node.get(part), dict):
                raise BridgeConfigError(f"{item}: {'.'.join(parts[:i + 1])} is not a section of the config")
            node = node[part]
        if parts[-1] not in node and not add:
            raise BridgeConfigError(f"{item}: {key} is not in the config (Hydra: +{key}=... adds a key)")
        node[parts[-1]] = value
    return tree


def section(tree: dict, name: str) -> dict:
    value = tree.get(name)
    if not isinstance(value, dict):
        raise BridgeConfigError(f"{name}: missing or not a mapping (Bridge writes every section into run_config.yaml)")
    return value


def _int(block: dict, where: str, key: str, default: int | None = None) -> int | None:
    value = block.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BridgeConfigError(f"{where}.{key}: expected an integer, got {show(value)}")
    return value


def _blend(value: Any, key: str) -> list[dict] | str:
    """Bridge's blend ([[paths], [weights] or null]) or data_path (a string or list of
    words) as the config's datasets or data_path."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list):
        paths, weights = value
        if weights is not None and (not isinstance(weights, list) or len(weights) != len(paths)):
            raise BridgeConfigError(f"{key}: the weights must be a list as long as the paths")
        for i, p in enumerate(paths):
            if not isinstance(p, str) or not p:
                raise BridgeConfigError(f"{key}[0][{i}]: expected a dataset path, got {show(p)}")
        for i, w in enumerate(weights or []):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise BridgeConfigError(f"{key}[1][{i}]: the weight {show(w)} of {paths[i]} is not a positive "
                                        "number; give each dataset a weight above 0")
        return [{"path": p, **({} if weights is None else {"weight": w})} for p, w in
                zip(paths, weights or [None] * len(paths))]
    raise BridgeConfigError(f"{key}: expected [[paths...], [weights...] or null], got {show(value)}")


def data_block(ds: dict, comments: list[str]) -> dict[str, Any]:
    """The config's dataset keys from the dataset: section."""
    out: dict[str, Any] = {}
    if ds.get("blend_per_split"):
        splits = ds["blend_per_split"]
        if not isinstance(splits, list) or len(splits) != 3:
            raise BridgeConfigError("dataset.blend_per_split: expected [train, valid, test], each a blend or null")
        out["blend_per_split"] = {name: None if b is None else _blend(b, f"dataset.blend_per_split[{i}]")
                                  for i, (name, b) in enumerate(zip(("train", "valid", "test"), splits))}
    elif ds.get("blend") is not None:
        out["datasets"] = _blend(ds["blend"], "dataset.blend")
    elif ds.get("data_path") is not None:
        words = ds["data_path"]
        if not isinstance(words, (str, list)) or isinstance(words, list) and \
                not all(isinstance(w, (str, int, float)) and not isinstance(w, bool) for w in words):
            raise BridgeConfigError(f"dataset.data_path: expected a string or a list of words, got {show(words)}")
        # GPTDatasetConfig.finalize: a string is split on whitespace; both go to get_blend_from_list
        out["data_path"] = words.split() if isinstance(words, str) else [str(w) for w in words]
    else:
        raise BridgeConfigError("dataset.blend: missing (or blend_per_split, data_path): mmfs serves datasets "
                                "read from files")
    if "blend_per_split" not in out:
        if ds.get("split") is None:
            raise BridgeConfigError("dataset.split: missing: megatron-core needs it with a blend")
        out["split"] = str(ds["split"])
        parse_split(out["split"], BridgeChecker())
    seq = _int(ds, "dataset", "seq_length", _int(ds, "dataset", "sequence_length"))
    if seq is None:
        raise BridgeConfigError("dataset.seq_length: missing: the number of tokens per sample")
    if not 1 <= seq <= 2**31 - 2:  # as the config checks it: Megatron's int32 sample index, extra token included
        raise BridgeConfigError(f"dataset.seq_length: {seq}: give 1 to 2**31 - 2 tokens (Megatron's int32 sample "
                                "index holds the length with the extra token)")
    out["sequence_length"] = seq
    out["seed"] = _int(ds, "dataset", "random_seed")
    if out["seed"] is None:
        raise BridgeConfigError("dataset.random_seed: missing: Bridge's dataset seed (not rng.seed)")
    if not 0 <= out["seed"] < 2**32:
        raise BridgeConfigError(f"dataset.random_seed: {out['seed']}: megatron-core seeds numpy with it, which takes "
                                "0 to 2**32 - 1")
    for key in ("add_extra_token_to_sequence", "drop_last_partial_validation_sequence"):
        if ds.get(key) is not None:
            if not isinstance(ds[key], bool):
                raise BridgeConfigError(f"dataset.{key}: expected true or false, got {show(ds[key])}")
            out[key] = ds[key]
    surplus = ds.get("mid_level_dataset_surplus")
    if surplus is not None:
        if isinstance(surplus, bool) or not isinstance(surplus, (int, float)) or not 0 <= surplus <= MAX_SURPLUS:
            raise BridgeConfigError(f"dataset.mid_level_dataset_surplus: {show(surplus)}: give a number from 0 to "
                                    f"{MAX_SURPLUS:g}")
        out["mid_level_dataset_surplus"] = surplus
    if ds.get("path_to_cache") is not None:
        out["cache_dir"] = ds["path_to_cache"]
    if ds.get("object_storage_cache_path") is not None:
        out["storage"] = {"cache_dir": ds["object_storage_cache_path"]}
    if ds.get("hybrid_context_parallel"):
        comments.append("warning: dataset.hybrid_context_parallel: ranks/ and streams/ show what each rank's sampler "
                        "reads, not the sub-samples redistributed between data x context parallel ranks")
    return out


def data_parallel_size(model: dict, world_size: int | None, dp: int | None, comments: list[str]) -> int:
    if dp is not None:
        return dp
    sizes = {k: _int(model, "model", k, 1) or 1 for k in
             ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")}
    if world_size is None:
        env = os.environ.get("WORLD_SIZE")
        world_size = int(env) if env and env.isdigit() else None
    if world_size is None:
        comments.append("warning: no --world-size or --data-parallel-size (nor WORLD_SIZE): data-parallel size 1")
        return 1
    model_size = sizes["tensor_model_parallel_size"] * sizes["pipeline_model_parallel_size"] * \
        sizes["context_parallel_size"]
    if world_size % model_size:
        raise BridgeConfigError(f"--world-size: {world_size} is not a multiple of model.tensor x pipeline x context "
                                f"parallel sizes = {model_size} (Bridge asserts)")
    return world_size // model_size


def training_block(tree: dict, dp: int, comments: list[str]) -> dict[str, Any]:
    ds, train, val = section(tree, "dataset"), section(tree, "train"), section(tree, "validation")
    kind = ds.get("dataloader_type")
    if kind not in ("single", "cyclic", "batch"):
        raise BridgeConfigError(f"dataset.dataloader_type: {show(kind)}: mmfs serves Bridge's single, cyclic and "
                                "batch samplers")
    if train.get("num_epochs") is not None:
        raise BridgeConfigError("train.num_epochs: Bridge sizes such a run from a finite SFT dataset "
                                "(GPTSFTDatasetConfig only); give train_iters or train_samples")
    if val.get("skip_train"):
        raise BridgeConfigError("validation.skip_train: Bridge then validates with the training sampler from 0; "
                                "mmfs serves a training run's validation")
    if (section(tree, "dist") if "dist" in tree else {}).get("eval_context_parallel_size") is not None:
        raise BridgeConfigError("dist.eval_context_parallel_size: evaluation would run on another data-parallel "
                                "size than training; mmfs serves one")
    mbs, gbs = _int(train, "train", "micro_batch_size"), _int(train, "train", "global_batch_size")
    if mbs is None or gbs is None:
        raise BridgeConfigError(f"train.{'micro_batch_size' if mbs is None else 'global_batch_size'}: missing")
    block: dict[str, Any] = {"data_parallel_size": dp, "micro_batch_size": mbs, "dataloader_type": kind,
                             "global_batch_size": gbs}
    if kind in ("single", "batch") and ds.get("drop_last") is False:
        raise BridgeConfigError(f"dataset.drop_last: false: the {kind} sampler would read a last partial batch; "
                                "mmfs serves whole ones")
    # data_sharding: Bridge passes it to every cyclic sampler, valid's included
    block["data_sharding"] = ds.get("data_sharding", True) is not False
    samples = _int(train, "train", "train_samples")
    if samples is not None:  # Bridge: train_iters = train_samples // global_batch_size
        block["train_samples"] = samples
    elif _int(train, "train", "train_iters") is not None:
        block["train_iters"] = train["train_iters"]
    else:
        raise BridgeConfigError("train.train_iters: missing (or train.train_samples)")
    interval = _int(val, "validation", "eval_interval")
    if not interval:
        raise BridgeConfigError("validation.eval_interval: missing or 0: Bridge then builds no validation samples; "
                                "mmfs needs it to size the valid split")
    block["eval_interval"] = interval
    block["eval_iters"] = _int(val, "validation", "eval_iters", 0)
    block["eval_micro_batch_size"] = _int(val, "validation", "eval_micro_batch_size") or mbs
    block["eval_global_batch_size"] = _int(val, "validation", "eval_global_batch_size") or gbs
    block["valid_dataloader_type"] = "cyclic"  # loaders.py: a GPTDatasetConfig validates with the cyclic sampler
    comments += [f"ignored train.{k}: {why}" for k, why in NOTED.items() if train.get(k)]
    return block


def to_config(path: str, overrides: list[str], world_size: int | None = None, dp: int | None = None,
              consumed: tuple[int, int] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the mmfs config as a dict, comment lines) of a Bridge run_config.yaml."""
    tree = apply_overrides(read_yaml_source(path)[0], overrides)
    if not isinstance(tree, dict):
        raise BridgeConfigError(f"{path}: expected Bridge's run_config.yaml (a mapping of sections)")
    ds = section(tree, "dataset")
    target = ds.get("_target_")
    if target != GPT_DATASET:
        raise BridgeConfigError(f"dataset._target_: {show(target)}: mmfs serves Bridge's GPT pretraining dataset "
                                f"({GPT_DATASET})")
    for key, (allowed, why) in REFUSED.items():
        if ds.get(key) not in allowed:
            raise BridgeConfigError(f"dataset.{key}: {show(ds[key])}: {why}")
    comments: list[str] = []
    config = data_block(ds, comments)
    tok = section(tree, "tokenizer")
    values = {flag: str(tok[key]) for key, flag in TOKENIZER_FLAGS.items() if tok.get(key) is not None}
    if tok.get("null_tokenizer_pad_id") not in (None, -1):
        values["--null-tokenizer-pad-id"] = str(tok["null_tokenizer_pad_id"])
    try:
        config["tokenizer"] = tokenizer_block(values, megatron_lm=False)
    except MmfsError as exc:  # name Bridge's keys, not Megatron-LM's flags
        text = str(exc)
        for key, flag in TOKENIZER_FLAGS.items():
            text = text.replace(flag, f"tokenizer.{key}")
        raise BridgeConfigError(text) from None
    dp = data_parallel_size(section(tree, "model"), world_size, dp, comments)
    config["training"] = training_block(tree, dp, comments)
    checker = BridgeChecker()
    with_schedule(parse_training(config["training"], checker), config["sequence_length"], None, checker)
    if consumed is not None:
        t = config["training"]
        train, valid = consumed
        comments.append(f"resumed at consumed_train_samples {train}: rank R reads train/streams/dp={dp},"
                        f"mbs={t['micro_batch_size']},from={train}/RRR")
        comments.append(f"and validates from consumed_valid_samples {valid}: valid/streams/dp={dp},"
                        f"mbs={t['eval_micro_batch_size']},from={valid}/RRR (test: test/ranks/RRR, from 0)")
    return config, comments


def read_train_state(path: str) -> tuple[int, int]:
    """(consumed_train_samples, consumed_valid_samples) of a Bridge train_state.pt (needs torch)."""
    try:
        import torch
    except ImportError:
        raise BridgeConfigError(f"{path}: reading train_state.pt needs torch; give --consumed-train-samples and "
                                "--consumed-valid-samples instead") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return int(state["consumed_train_samples"]), int(state["consumed_valid_samples"])
    except (OSError, KeyError, TypeError, RuntimeError, ValueError) as exc:
        raise BridgeConfigError(f"{path}: not a Bridge train_state.pt ({exc.__class__.__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def render(config: dict[str, Any], comments: list[str], path: str) -> str:
    head = [f"# mmfs config from Megatron-Bridge's {os.path.basename(path)} (mmfs config --from-bridge).",
            "# Paths are as Bridge got them; mmfs reads relative ones from this file's folder,",
            "# so save it in the folder Bridge is launched from (the paths go into cache names)."]
    head += [f"# {c}" for c in comments]
    return "\n".join(head) + "\n" + yaml.dump(config, Dumper=SAFE_DUMPER, sort_keys=False)


def config_command(args) -> int:
    """`mmfs config --from-bridge RUN_CONFIG.yaml [KEY=VALUE ...]` (else --from-megatron's)."""
    if args.from_bridge is None:
        from mmfs.tools.megatron.phase_args import config_command as megatron_config
        return megatron_config(args)
    path, overrides = args.from_bridge[0], args.from_bridge[1:]
    for value, flag in ((args.world_size, "--world-size"), (args.data_parallel_size, "--data-parallel-size")):
        if value is not None and value < 1:
            raise BridgeConfigError(f"{flag}: {value}: give 1 or more")
    consumed = None
    if args.train_state is not None:
        if args.consumed_train_samples is not None:
            raise BridgeConfigError("--consumed-train-samples: give it or --train-state, not both")
        consumed = read_train_state(args.train_state)
    elif args.consumed_train_samples is not None:
        consumed = (args.consumed_train_samples, args.consumed_valid_samples)
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), TRAIN_STATE)
    note = None
    if consumed is None and os.path.isfile(beside):  # a checkpoint's own: where its resumed job reads
        try:
            consumed = read_train_state(beside)
        except BridgeConfigError as exc:
            note = f"not read: {exc}"
    config, comments = to_config(path, overrides, args.world_size, args.data_parallel_size, consumed)
    if note:
        comments.append(note)
    for line in comments:
        if line.startswith("warning: "):
            print(f"mmfs: {line}", file=sys.stderr)
    sys.stdout.write(render(config, comments, path))
    return 0
