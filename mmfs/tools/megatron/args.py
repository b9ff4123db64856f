"""`mmfs config --from-megatron ARGS...`: Megatron-LM's launch arguments (as
pretrain_gpt.py takes them, megatron-core 0.19) turned into the YAML config that
mounts the same samples.

Only arguments that shape the samples are read (mmfs/tools/megatron/flags.py lists
every data flag and what is done with it). Those that change how a loader builds its
batch fields, or how Megatron loads, are named in a comment of the output; those
after which no view would show what Megatron reads are one line and exit 2; those
after which some views do not show what a rank trains on are a comment and a warning;
everything else (model, optimiser, logging, torchrun's own flags) is ignored silently. `@FILE` reads
arguments from a file, any number per line, with shell quoting and `#` comments
(as launch scripts hold them).
"""

from __future__ import annotations

import math
import os
import re
import sys
from typing import Any

import yaml

from mmfs.config.blend import parse_data_words, parse_split
from mmfs.config.checker import Checker
from mmfs.config.training import TRAINING_KEYS, parse_training, with_schedule
from mmfs.tools.megatron import tokenizer
from mmfs.tools.megatron.flags import (
    HONOURED,
    NOTED,
    REFUSED,
    SILENT,
    WARNED,
    refused_line,
    warned_line,
)
from mmfs.tools.megatron.words import (
    ENTRY_DEFAULTS,
    ENTRY_SCRIPT,
    MegatronArgsError,
    check_words,
    expand_args,
)

__all__ = ["MegatronArgsError", "expand_args", "print_warnings", "render", "to_config"]


WORLD_SIZE_UNKNOWN = ("data_parallel_size: 1 because the launch line gives no world size: add --world-size N "
                      "(or torchrun's --nproc_per_node and --nnodes), or set WORLD_SIZE, and run this again")


# Every flag read: the data flags and the tokenizer's (its identifiers).
TAKEN = {**HONOURED, **tokenizer.FLAGS}
# Flags Megatron-LM main knows that the recorded parser may not (flags.py names each).
MMFS_FLAGS = (*HONOURED, *NOTED, *REFUSED, *WARNED, *SILENT)


def parse_args(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """{flag: value(s)} of the honoured flags, and the noted and warned flags in order."""
    check_words(argv, MMFS_FLAGS)
    values: dict[str, Any] = {}
    noted: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, inline = arg.partition("=")
        if flag in REFUSED:
            raise MegatronArgsError(refused_line(flag))
        if (flag in NOTED or flag in WARNED) and flag not in noted:
            noted.append(flag)
        if flag not in TAKEN:
            i += 1
            continue
        n = TAKEN[flag]
        if eq:
            taken, i = [inline], i + 1
        elif n is None:
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            taken, i = argv[i + 1:j], j
        else:
            taken, i = argv[i + 1:i + 1 + n], i + 1 + n
            if len(taken) < n or any(t.startswith("--") for t in taken):
                raise MegatronArgsError(f"{flag}: expected {n} value(s)")
        values[flag] = True if n == 0 else taken[0] if n == 1 else taken
    return values, noted


def _int(values: dict, flag: str, default: int | None = None) -> int | None:
    if flag not in values:
        return default
    try:
        return int(values[flag])
    except (TypeError, ValueError):
        raise MegatronArgsError(f"{flag}: {values[flag]!r} is not an integer") from None


def _float(values: dict, flag: str) -> float:
    try:
        return float(values[flag])
    except (TypeError, ValueError):
        raise MegatronArgsError(f"{flag}: {values[flag]!r} is not a number") from None


def data_parallel_size(values: dict, environ: dict, comments: list[str]) -> int:
    """world size // (tensor x pipeline x context), as Megatron-LM's validate_args."""
    world = _int(values, "--world-size")
    if world is None:
        if environ.get("WORLD_SIZE"):
            world = _int({"WORLD_SIZE": environ["WORLD_SIZE"]}, "WORLD_SIZE")
        elif "--nproc_per_node" in values or "--nproc-per-node" in values:  # torchrun's own flags
            flag = "--nproc_per_node" if "--nproc_per_node" in values else "--nproc-per-node"
            per_node, nodes = _int(values, flag), _int(values, "--nnodes", 1)
            for name, n in ((flag, per_node), ("--nnodes", nodes)):
                if n < 1:
                    raise MegatronArgsError(f"{name}: {n}: torchrun starts at least one process (give 1 or more)")
            world = per_node * nodes
        else:
            world = 1  # Megatron's default WORLD_SIZE
            comments.append(WORLD_SIZE_UNKNOWN)
    model = 1
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"):
        size = _int(values, flag, 1)
        if size < 1:
            raise MegatronArgsError(f"{flag}: {size}: must be at least 1 (Megatron asserts)")
        model *= size
    if world < 1 or world % model:
        raise MegatronArgsError(f"--world-size: {world} is not a multiple of tensor x pipeline x context "
                                f"parallel sizes = {model} (Megatron asserts)")
    return world // model


def _blend_words(values: dict, flag: str) -> list[str] | None:
    words = values.get(flag)
    if words is None:
        return None
    if not words:
        raise MegatronArgsError(f"{flag}: no dataset given")
    for blend in parse_data_words(list(words), FlagChecker(), flag):  # as the config would check them
        if "weight" in blend and not (math.isfinite(blend["weight"]) and blend["weight"] > 0):
            raise MegatronArgsError(f"{flag}: the weight {blend['weight']} of {blend['path']} is not a positive "
                                    "number; give each dataset a weight above 0")
    return list(words)


def data_section(values: dict, comments: list[str]) -> dict[str, Any]:
    """The config's data keys (data_path, data_args_path, blend_per_split or
    per_split_data_args_path, and split) for the honoured flags' values."""
    config: dict[str, Any] = {}
    sources = [f for f in ("--data-path", "--data-args-path") if f in values]
    per_split = [f for f in ("--train-data-path", "--valid-data-path", "--test-data-path",
                             "--per-split-data-args-path") if f in values]
    if len(sources) > 1:
        raise MegatronArgsError("--data-args-path: give it or --data-path, not both (Megatron asserts)")
    if sources and per_split:
        comments.append(f"ignored {', '.join(per_split)}: Megatron reads {sources[0]} when it is given")
    if sources:
        if "--data-path" in values:
            config["data_path"] = _blend_words(values, "--data-path")
        else:
            config["data_args_path"] = values["--data-args-path"]
        # Megatron-LM's validate_args: the legacy default, spaces included (hashed into cache names)
        config["split"] = values.get("--split", "969, 30, 1")
    elif per_split:
        if "--per-split-data-args-path" in values:
            if len(per_split) > 1:
                raise MegatronArgsError("--per-split-data-args-path: give it or --train/valid/test-data-path, "
                                        "not both (Megatron asserts)")
            config["per_split_data_args_path"] = values["--per-split-data-args-path"]
        else:
            config["blend_per_split"] = {
                split: None if f"--{split}-data-path" not in values
                else " ".join(_blend_words(values, f"--{split}-data-path"))
                for split in ("train", "valid", "test")
            }
        if "--split" in values:
            comments.append("ignored --split: Megatron does not split per-split data paths")
    else:
        raise MegatronArgsError("--data-path: missing (or --data-args-path, --per-split-data-args-path, "
                                "--train-data-path ...): mmfs serves datasets read from files")
    return config


def seed(values: dict) -> int:
    value = _int(values, "--seed", 1234)
    if not 0 <= value < 2**32:
        raise MegatronArgsError(f"--seed: {value}: Megatron seeds numpy with it, which takes 0 to 2**32 - 1")
    return value


def values_of(namespace: Any) -> dict[str, Any]:
    """Megatron-LM's parsed arguments (the namespace get_args() returns) as parse_args
    gives a launch line's: {flag: value(s)} of the honoured flags that are set, so that
    a running job's arguments map to a config by the same functions as its launch line."""
    values: dict[str, Any] = {}
    for flag, n in HONOURED.items():
        if flag == "--no-data-sharding":
            if getattr(namespace, "data_sharding", True) is False:
                values[flag] = True
            continue
        value = getattr(namespace, flag[2:].replace("-", "_"), None)
        if value is None or value is False:
            continue
        if n == 0:
            values[flag] = True
        elif isinstance(value, (list, tuple)):
            values[flag] = [str(v) for v in value]
        else:
            values[flag] = [str(value)] if n is None else str(value)
    return values


def to_config(argv: list[str], environ: dict | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the YAML config as a dict, comment lines) for Megatron's arguments."""
    environ = os.environ if environ is None else environ
    values, noted = parse_args(expand_args(argv))
    comments = [f"ignored {flag}: {NOTED[flag]}" for flag in noted if flag in NOTED]
    config = data_section(values, comments)
    config["sequence_length"] = sequence_length(values)
    config["seed"] = seed(values)
    if "--mid-level-dataset-surplus" in values:
        config["mid_level_dataset_surplus"] = _float(values, "--mid-level-dataset-surplus")
    if "--tokenizer-type" not in values:  # the entry script's default (parse_and_validate_args' args_defaults)
        values["--tokenizer-type"] = ENTRY_DEFAULTS["--tokenizer-type"]
        comments.append(f"--tokenizer-type {values['--tokenizer-type']}: {ENTRY_SCRIPT}'s default (not on the line)")
    try:
        config["tokenizer"] = tokenizer.tokenizer_block(values)
    except tokenizer.TokenizerFlagError as exc:
        raise MegatronArgsError(str(exc)) from None
    if "--data-cache-path" in values:
        config["cache_dir"] = values["--data-cache-path"]
    if "--object-storage-cache-path" in values:  # where megatron-core keeps the .idx of s3:// and msc:// data
        config["storage"] = {"cache_dir": values["--object-storage-cache-path"]}
    config["training"] = training_block(values, environ, comments)
    if "--hybrid-context-parallel" in noted:  # the mount then withholds train's ranks/ and streams/
        config["training"]["hybrid_context_parallel"] = True
    checker = FlagChecker()
    if "split" in config:  # the config's own check: printed, it was refused only by mmfs build
        parse_split(config["split"], checker)
    with_schedule(parse_training(config["training"], checker), config["sequence_length"], None, checker)
    comments += [warned_line(flag) for flag in noted if flag in WARNED]
    return config, comments


class FlagChecker(Checker):
    """The config's own checks of the training: block, each error naming the flags
    the keys came from (the YAML is not written yet)."""

    def __init__(self) -> None:
        super().__init__("")

    def fail(self, key: str, message: str) -> MegatronArgsError:
        if key == "split":
            return MegatronArgsError(f"--split: {message}")
        return MegatronArgsError(f"{_as_flags(key.split('[')[0])}: {_as_flags(message)}")


def _as_flags(text: str) -> str:
    """`text` with the training: block's keys named as the Megatron flags they came from."""
    def flag(m: re.Match) -> str:
        if m.group(1) == "data_parallel_size":
            return "the data-parallel size (world size / tensor x pipeline x context)"
        return f"--{m.group(1).replace('_', '-')}" if m.group(1) in TRAINING_KEYS else m.group(0)
    return re.sub(r"\b(?:training\.)?([a-z]+(?:_[a-z]+)+)\b", flag, text)


def sequence_length(values: dict) -> int:
    """--seq-length, checked as Megatron-LM's validate_args and its dataset do."""
    seq = _int(values, "--seq-length")
    if seq is not None and "--encoder-seq-length" in values:
        raise MegatronArgsError("--encoder-seq-length: give it or --seq-length, not both (Megatron asserts)")
    if seq is None:  # validate_args: seq_length = encoder_seq_length
        seq = _int(values, "--encoder-seq-length")
    if seq is None:
        raise MegatronArgsError("--seq-length: missing: the number of tokens per sample")
    if seq < 1:
        raise MegatronArgsError(f"--seq-length: {seq}: a sample holds at least 1 token")
    if seq > 2**31 - 2:  # as the config checks sequence_length: Megatron's int32 sample index, extra token included
        raise MegatronArgsError(f"--seq-length: {seq}: more than 2**31 - 2 tokens (with the extra token, Megatron's "
                                "sample index holds int32 lengths)")
    cp = _int(values, "--context-parallel-size", 1)
    if cp > 1 and seq % (2 * cp):
        raise MegatronArgsError(f"--seq-length: {seq} is not a multiple of 2 x --context-parallel-size = {2 * cp} "
                                "(Megatron asserts)")
    positions = _int(values, "--max-position-embeddings")
    if positions is not None and positions < seq:
        raise MegatronArgsError(f"--seq-length: {seq} is more than --max-position-embeddings {positions} "
                                "(Megatron asserts)")
    return seq


def training_block(values: dict, environ: dict, comments: list[str]) -> dict[str, Any]:
    mbs = _int(values, "--micro-batch-size")
    if mbs is None or mbs < 1:
        raise MegatronArgsError(f"--micro-batch-size: {'missing' if mbs is None else mbs}: Megatron asserts "
                                "a micro-batch size of 1 or more")
    training: dict[str, Any] = {"data_parallel_size": data_parallel_size(values, environ, comments),
                                "micro_batch_size": mbs}
    kind = values.get("--dataloader-type", "single")
    if kind == "external":
        raise MegatronArgsError("--dataloader-type: external is how a job reads the mount (docs/megatron.md); give "
                                "the line with the sampler it replaces (single, Megatron's default, or cyclic)")
    if kind not in ("single", "cyclic"):
        raise MegatronArgsError(f"--dataloader-type: {kind}: mmfs serves Megatron's single and cyclic samplers")
    training["dataloader_type"] = kind
    if "--no-data-sharding" in values:
        if kind == "cyclic":
            training["data_sharding"] = False
        else:
            comments.append("ignored --no-data-sharding: only the cyclic sampler shards")
    if "--step-batch-size-schedule" in values:
        if "--global-batch-size" in values:
            raise MegatronArgsError("--step-batch-size-schedule: Megatron-LM refuses it with --global-batch-size "
                                    "(ValueError at start-up); drop one")
        training["step_batch_size_schedule"] = values["--step-batch-size-schedule"]
    else:
        training["global_batch_size"] = _int(values, "--global-batch-size", mbs * training["data_parallel_size"])
    if "--rampup-batch-size" in values:
        comments.append("ignored --rampup-batch-size: megatron-core 0.18 and later ignore it (deprecated); "
                        "for megatron-core <= 0.17 add training.rampup_batch_size")
    iters, samples = _int(values, "--train-iters"), _int(values, "--train-samples")
    if iters is not None and samples is not None:
        raise MegatronArgsError("--train-samples: give it or --train-iters, not both (Megatron asserts)")
    if iters is not None or samples is not None:
        if iters is not None:
            training["train_iters"] = iters
        else:
            training["train_samples"] = samples
        if "--eval-interval" not in values:
            raise MegatronArgsError("--eval-interval: missing: Megatron sizes the validation split with it")
        training["eval_interval"] = _int(values, "--eval-interval")
        training["eval_iters"] = _int(values, "--eval-iters", 100)
    return training


# libyaml's dumper where PyYAML has it: ten times faster on a data_path of a million words
SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def render(config: dict[str, Any], comments: list[str]) -> str:
    head = [f"# mmfs config from Megatron-LM arguments of {ENTRY_SCRIPT} (mmfs config --from-megatron).",
            "# Paths are as Megatron got them; mmfs reads relative ones from this file's folder,",
            "# so save it in the folder Megatron is launched from (the paths go into cache names)."]
    head += [f"# {c}" for c in comments]
    return "\n".join(head) + "\n" + yaml.dump(config, Dumper=SAFE_DUMPER, sort_keys=False)


WARNINGS = {WORLD_SIZE_UNKNOWN, *map(warned_line, WARNED)}


def print_warnings(comments: list[str]) -> None:
    """The comments that mean the config may not be what the user meant, also on stderr."""
    for line in comments:
        if line in WARNINGS:
            print(f"mmfs: warning: {line}", file=sys.stderr)
