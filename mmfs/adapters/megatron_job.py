"""What the datasets provider (mmfs/adapters/megatron.py) checks of a Megatron-LM
job's arguments before it serves a batch: each number it reads is a whole number
(not None, NaN, infinite or missing), and the data the job names are the mount's
(data path or blend, per-split paths, split, seed, tokenizer). The job's arguments
map to a config by `mmfs config --from-megatron`'s own functions
(mmfs/tools/megatron/args.py), imported when the provider runs: one mapping."""

from __future__ import annotations

import json
import math
import os
import re
import types
from typing import Any

from mmfs.errors import MmfsError
from mmfs.loader import LoaderError, Mount

# (attribute, flag, least value, default where None or missing; REQUIRED: none)
REQUIRED = object()
NUMBERS = (
    ("seq_length", "--seq-length", 1, REQUIRED),
    ("micro_batch_size", "--micro-batch-size", 1, REQUIRED),
    ("global_batch_size", "--global-batch-size", 1, None),
    ("eval_micro_batch_size", "--eval-micro-batch-size", 1, None),
    ("eval_global_batch_size", "--eval-global-batch-size", 1, None),
    ("consumed_train_samples", "consumed_train_samples (of the checkpoint)", 0, 0),
    ("consumed_valid_samples", "consumed_valid_samples (of the checkpoint)", 0, 0),
    ("iteration", "iteration (of the checkpoint)", 0, 0),
)
DATA_FLAGS = ("--data-path", "--data-args-path", "--train-data-path", "--valid-data-path", "--test-data-path",
              "--per-split-data-args-path")


class MegatronJobError(LoaderError):
    """A Megatron-LM job that does not fit the mount it reads: one line, what to do."""


def whole_number(value: Any, what: str, least: int) -> int:
    """An integer argument (an integral float too, as argparse never gives one, but
    a script setting args may), refused in one line otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise MegatronJobError(f"{what} is {value!r}: expected a whole number of at least {least}")
    if value < least:
        raise MegatronJobError(f"{what} is {int(value)}: expected a whole number of at least {least}")
    return int(value)


def checked_args(args: Any) -> Any:
    """A copy of the job's arguments with each number the provider reads checked (one
    line naming the flag where it is None, NaN, infinite, negative or missing)."""
    try:
        given = dict(vars(args))
    except TypeError:
        raise MegatronJobError(f"the job's arguments are a {type(args).__name__}, not Megatron-LM's namespace "
                               "(get_args())") from None
    for name, flag, least, default in NUMBERS:
        value = given.get(name)
        if value is None:
            if default is REQUIRED:
                raise MegatronJobError(f"the job's {flag} is {'missing' if name not in given else 'None'}: "
                                       "launch through Megatron-LM's pretrain(), whose parse_args sets it")
            given[name] = default
            continue
        given[name] = whole_number(value, f"the job's {flag}", least)
    given["rampup_batch_size"] = _numbers(given.get("rampup_batch_size"), "--rampup-batch-size", 3)
    transitions = given.get("phase_transition_iterations")
    if isinstance(transitions, str):  # as given, before Megatron's validate_args parses it
        transitions = [w.strip() for w in transitions.split(",")]
        if not all(w.isdigit() for w in transitions):
            raise MegatronJobError(f"the job's --phase-transition-iterations is "
                                   f"{given['phase_transition_iterations']!r}: expected iterations separated by commas")
        transitions = sorted(int(w) for w in transitions)
    given["phase_transition_iterations"] = _numbers(transitions, "--phase-transition-iterations", None)
    schedule = given.get("step_batch_size_schedule")
    if schedule is not None and not isinstance(schedule, str):
        raise MegatronJobError(f"the job's --step-batch-size-schedule is {schedule!r}: expected a string of "
                               "THRESHOLD:BATCH_SIZE entries")
    if given.get("global_batch_size") is None and not given.get("step_batch_size_schedule"):
        raise MegatronJobError("the job's --global-batch-size is None: give it (or --step-batch-size-schedule)")
    return types.SimpleNamespace(**given)


def _numbers(value: Any, flag: str, count: int | None) -> list[int] | None:
    """A list argument of whole numbers (`count` of them), None or empty for none."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return None
    if not isinstance(value, (list, tuple)) or (count is not None and len(value) != count):
        raise MegatronJobError(f"the job's {flag} is {value!r}: expected "
                               f"{'a list of' if count is None else count} whole numbers")
    out = []
    for v in value:
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v)
        out.append(whole_number(v, f"the job's {flag} entry", 0))
    return out


def checked_samples(train_val_test_num_samples: Any) -> list[int]:
    """Megatron's [train, valid, test] sample counts, each a whole number."""
    try:
        counts = list(train_val_test_num_samples)
    except TypeError:
        counts = []
    if len(counts) != 3:
        raise MegatronJobError(f"train_val_test_num_samples is {train_val_test_num_samples!r}: expected three "
                               "counts [train, valid, test], as Megatron passes them")
    return [0 if n is None else whole_number(n, f"the job's {split} sample count", 0)
            for split, n in zip(("train", "valid", "test"), counts)]


# -- the data the job names against the mount's ------------------------------------------------


def check_identity(mount: Mount, args: Any) -> None:
    """Refuse a mount of another seed, data path or blend, split or tokenizer than the
    job's, in one line naming both values."""
    from mmfs.tools.megatron.args import data_section, seed, values_of

    where = f"{mount.path}/mmfs.json"
    cfg = mount.info.get("config") or {}
    try:
        values = values_of(args)
        job_seed = seed(values)
        section = data_section(values, []) if any(f in values for f in DATA_FLAGS) else None
    except MmfsError as exc:
        raise MegatronJobError(f"the job's {exc}") from None
    if "--seed" in values and cfg.get("seed") is not None and job_seed != int(cfg["seed"]):
        raise MegatronJobError(f"{where}: the mount's seed is {cfg['seed']}, the job's --seed {job_seed}: give the job "
                               f"--seed {cfg['seed']} or mount a config with seed: {job_seed}")
    if section is not None:  # a job that names no data (the mount is its data) has nothing to compare
        _check_data(cfg, section, where)
    _check_tokenizer(cfg, values, where)
    # the sampler: a job on the mount says external; only its --no-data-sharding can
    # contradict the mount's cyclic sampler (the flag's default says nothing)
    sampler = (mount.training or {}).get("sampler")
    if "--no-data-sharding" in values and sampler == "sharded":
        raise MegatronJobError(f"{where}: the mount's sampler is cyclic with data_sharding, the job's "
                               "--no-data-sharding: mount a config with training.data_sharding: false, or leave "
                               "the flag out")


def _job_blend(words: list[str], flag: str) -> list[dict]:
    from mmfs.config.blend import parse_data_words
    from mmfs.tools.megatron.args import FlagChecker

    return parse_data_words(list(words), FlagChecker(), flag)


def _read_words(path: str, flag: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f) if flag == "--per-split-data-args-path" else f.read().split()
    except (OSError, ValueError) as exc:
        raise MegatronJobError(f"the job's {flag} {path}: cannot read it: {exc}") from None


def _check_data(cfg: dict, section: dict, where: str) -> None:
    base = os.path.dirname(str(cfg.get("config_file") or ""))
    per_split = cfg.get("blend_per_split")
    if "data_path" in section or "data_args_path" in section:
        flag = "--data-path" if "data_path" in section else "--data-args-path"
        words = section.get("data_path") or _read_words(section["data_args_path"], flag)
        if per_split is not None:
            raise MegatronJobError(f"{where}: the mount's data are per split (blend_per_split), the job's {flag} one "
                                   "blend: give the job --train-data-path, --valid-data-path, --test-data-path as "
                                   "the mount's config, or mount a config with the job's data_path")
        job = _job_blend(words, flag)
        blends = [cfg.get("datasets") or []] + [p.get("datasets") or [] for p in cfg.get("phases") or []]
        if not any(_same_blend(job, b, base) for b in blends):
            raise MegatronJobError(f"{where}: the mount's datasets are {_show(blends[0])}, the job's {flag} "
                                   f"{_show(job)}: give the job the mount's data or mount a config of the job's")
        job_split, mount_split = _fractions(section["split"]), _fractions(cfg.get("split"))
        if mount_split is not None and job_split != mount_split:
            raise MegatronJobError(f"{where}: the mount's split is {cfg.get('split')!r}, the job's --split "
                                   f"{section['split']!r}: give the job --split {cfg.get('split')!r} or mount a "
                                   "config with the job's split")
        return
    if "per_split_data_args_path" in section:
        table = _read_words(section["per_split_data_args_path"], "--per-split-data-args-path")
        job_splits = {s: (table or {}).get(s) for s in ("train", "valid", "test")}
    else:
        job_splits = {s: None if w is None else w.split() for s, w in section["blend_per_split"].items()}
    if per_split is None:
        raise MegatronJobError(f"{where}: the mount's data are one blend split by --split, the job's per split "
                               "(--train-data-path ...): give the job the mount's --data-path and --split, or "
                               "mount a config with the job's blend_per_split")
    for split, words in job_splits.items():
        mine = per_split.get(split)
        job = None if not words else _job_blend(words, f"--{split}-data-path")
        if (job is None) != (not mine) or (job is not None and not _same_blend(job, mine, base)):
            raise MegatronJobError(f"{where}: the mount's {split} datasets are {_show(mine)}, the job's "
                                   f"--{split}-data-path {_show(job)}: give the job the mount's data or mount a "
                                   "config of the job's")


def _same_path(job: str, mine: str, base: str) -> bool:
    if job == mine:
        return True
    if "://" in job or "://" in mine:
        return False
    return os.path.realpath(job) == os.path.realpath(os.path.join(base, mine))


def _same_blend(job: list[dict], mine: list[dict], base: str) -> bool:
    if len(job) != len(mine) or not all(_same_path(j["path"], str(m.get("path")), base) for j, m in zip(job, mine)):
        return False
    jw, mw = [j.get("weight") for j in job], [m.get("weight") for m in mine]
    if len(job) == 1 or (None in jw or None in mw):
        return len(job) == 1 or jw == mw
    return all(math.isclose(a / sum(jw), b / sum(mw), rel_tol=1e-9) for a, b in zip(jw, mw))


def _fractions(split: Any) -> list[float] | None:
    """Megatron's parse of a split string, normalised (None: no split)."""
    if not isinstance(split, str):
        return None
    parts = [float(x) for x in re.findall(r"[.0-9]+", split)]
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    return [round(p / total, 12) for p in parts] if total else parts


def _show(blend: list[dict] | None) -> str:
    if not blend:
        return "none"
    shown = ", ".join(f"{d.get('path')}" + (f" (weight {d['weight']:g})" if d.get("weight") is not None else "")
                      for d in blend[:3])
    return f"[{shown}{f' and {len(blend) - 3} more' if len(blend) > 3 else ''}]"


def _check_tokenizer(cfg: dict, values: dict, where: str) -> None:
    """The tokenizer the job names (type, model and vocabulary files) against the one the
    mount's config names; a config that gives eod and pad by hand names none."""
    mine = cfg.get("tokenizer") or {}
    base = os.path.dirname(str(cfg.get("config_file") or ""))
    kind = values.get("--tokenizer-type")
    if mine.get("type") and kind and kind != mine["type"]:
        raise MegatronJobError(f"{where}: the mount's tokenizer is {mine['type']}, the job's --tokenizer-type {kind}: "
                               "give the job the mount's tokenizer or mount a config with the job's")
    vocab = values.get("--vocab-size")
    if kind == "NullTokenizer" and not mine.get("type") and vocab and mine.get("vocab_size") is not None \
            and str(mine["vocab_size"]) != vocab:  # `mmfs config` of a NullTokenizer line: its identifiers
        raise MegatronJobError(f"{where}: the mount's tokenizer has vocab_size {mine['vocab_size']}, the job's "
                               f"--vocab-size {vocab} (NullTokenizer): give the job the mount's or mount a config "
                               "with the job's")
    for key, flag in (("model", "--tokenizer-model"), ("vocab_file", "--vocab-file"), ("merge_file", "--merge-file")):
        job = values.get(flag)
        if mine.get(key) and job and not _same_path(job, str(mine[key]), base):
            raise MegatronJobError(f"{where}: the mount's tokenizer {key} is {mine[key]}, the job's {flag} {job}: "
                                   "give the job the mount's tokenizer or mount a config with the job's")
