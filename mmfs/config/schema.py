"""The YAML config: parsed into frozen dataclasses and checked before any index
is built. Every error names the YAML file and the key.

Keys follow megatron-core's names (see README.md, "Config"). Relative dataset
paths are relative to the YAML file's folder, but the path *as written* is what
goes into Megatron's cache description (and so into the cache file names).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from mmfs.config.rampup import (
    BatchSchedule,
    ScheduleError,
    constant_schedule,
    rampup_schedule,
    step_schedule,
    train_iters_from_samples,
)
from mmfs.config.safe_yaml import read_yaml, show
from mmfs.config.storage import parse_storage
from mmfs.config.tokenizer import TokenizerBlock, parse_tokenizer
from mmfs.errors import ConfigError
from mmfs.formats import dataset_problem, dataset_stem
from mmfs.storage import StorageError, StorageUnavailable, scheme_of
from mmfs.storage.settings import StorageSettings
from mmfs.storage.settings import configure as configure_storage
from mmfs.text.dataset import TextDataset, text_dataset, text_stem
from mmfs.text.source import is_text_input
from mmfs.text.tokenizer import TokenizerSpec

SPLITS = ("train", "valid", "test")

TOP_LEVEL_KEYS = {
    "datasets",
    "data_path",
    "data_args_path",
    "per_split_data_args_path",
    "blend_per_split",
    "split",
    "samples",
    "sequence_length",
    "seed",
    "add_extra_token_to_sequence",
    "drop_last_partial_validation_sequence",
    "mid_level_dataset_surplus",
    "tokenizer",
    "cache_dir",
    "training",
    "storage",
}
DATASET_KEYS = {"path", "weight", "name", "json_key"}
INT64_MAX = 2**63 - 1  # Megatron holds sample counts and token ids in int64
MAX_SURPLUS = 1e9  # far above any use; keeps (1 + surplus) * samples finite


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a blend."""

    path: str  # as written in the YAML: Megatron's dataset_path, hashed into cache names
    file: str  # where it is on disk (relative paths resolved against the YAML folder)
    name: str
    weight: float | None
    json_key: str | None = None  # a text dataset's JSON key or Parquet column (None: not text)
    text: TextDataset | None = None  # a text dataset's tokenization: `file` is then its output


@dataclass(frozen=True)
class Blend:
    """A list of datasets with all weights or none (Megatron's (prefixes, weights))."""

    datasets: tuple[DatasetSpec, ...]

    @property
    def weights(self) -> list[float] | None:
        if self.datasets[0].weight is None:
            return None
        return [d.weight for d in self.datasets]


@dataclass(frozen=True)
class Config:
    path: str  # the YAML file
    blend: Blend | None  # `datasets` / `data_path`, split by `split`
    blend_per_split: dict[str, Blend | None] | None
    split: str | None  # the split string exactly as written (hashed by Megatron)
    samples: dict[str, int | None]
    sequence_length: int
    seed: int
    add_extra_token: bool
    drop_last_partial_validation_sequence: bool
    mid_level_dataset_surplus: float
    eod: int | None
    pad: int | None  # as configured (None: the tokenizer has no pad)
    tokenizer_identifiers: dict[str, Any]
    cache_dir: str | None  # resolved; None: Megatron's default beside each dataset
    raw: dict[str, Any] = field(default_factory=dict)
    training: TrainingConfig | None = None  # the optional `training:` block
    # The keys a split's sample count comes from, where not `samples.<split>`.
    sample_keys: dict[str, str] = field(default_factory=dict)
    storage: StorageSettings = field(default_factory=StorageSettings)  # the `storage:` block
    tokenizer: TokenizerSpec | None = None  # `tokenizer.type` and its files, when given

    def samples_key(self, split: str) -> str:
        """What to change to change the split's sample count."""
        return self.sample_keys.get(split, f"samples.{split}")

    @property
    def effective_pad(self) -> int:
        """The pad id Megatron writes: the tokenizer's pad, or -1 when there is none
        or when it collides with eod (Megatron warns and falls back)."""
        if self.pad is None or self.pad == self.eod:
            return -1
        return self.pad

    @property
    def all_datasets(self) -> list[DatasetSpec]:
        """Every distinct dataset (by file), in order of first appearance."""
        blends = [self.blend] if self.blend else list((self.blend_per_split or {}).values())
        seen: dict[str, DatasetSpec] = {}
        for blend in blends:
            for d in blend.datasets if blend else ():
                seen.setdefault(d.file, d)
        return list(seen.values())

    def as_dict(self) -> dict[str, Any]:
        """The config as loaded, defaults filled in (JSON-serialisable)."""
        def blend_dict(b: Blend | None):
            if b is None:
                return None
            return [{"path": d.path, "name": d.name, "weight": d.weight,
                     **({} if d.text is None else {"json_key": d.json_key, "tokenized": d.file})}
                    for d in b.datasets]

        spec = self.tokenizer
        tokenizer = {} if spec is None else {
            "type": spec.kind, "model": spec.path, "vocab_file": spec.vocab_file, "merge_file": spec.merge_file,
            "tiktoken_pattern": spec.tiktoken_pattern}

        return {
            "config_file": self.path,
            "datasets": blend_dict(self.blend),
            "blend_per_split": None
            if self.blend_per_split is None
            else {s: blend_dict(b) for s, b in self.blend_per_split.items()},
            "split": self.split,
            "samples": dict(self.samples),
            "sequence_length": self.sequence_length,
            "seed": self.seed,
            "add_extra_token_to_sequence": self.add_extra_token,
            "drop_last_partial_validation_sequence": self.drop_last_partial_validation_sequence,
            "mid_level_dataset_surplus": self.mid_level_dataset_surplus,
            "tokenizer": {"eod": self.eod, "pad": self.pad, **self.tokenizer_identifiers, **tokenizer},
            "cache_dir": self.cache_dir,
            "training": None if self.training is None else self.training.as_dict(),
            "storage": dataclasses.asdict(self.storage),
        }


class _Checker:
    """Typed access to the raw YAML with errors naming the file and the key."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {message}")

    def integer(self, value: Any, key: str, minimum: int | None = None,
                maximum: int | None = INT64_MAX, why: str = "") -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {show(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {show(value)}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be at most {maximum}{why}, got {show(value)}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {show(value)}")
        return value

    def number(self, value: Any, key: str) -> float:
        """A finite float (ints convert); NaN, infinity and bools are refused."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number, got {show(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = float("inf")
        if not math.isfinite(number):
            raise self.fail(key, f"expected a finite number, got {show(value)}")
        return number

    def unknown_keys(self, mapping: dict, allowed: set[str], where: str) -> None:
        extra = sorted((k for k in mapping if k not in allowed), key=repr)
        if extra:
            name = extra[0] if isinstance(extra[0], str) and len(extra[0]) <= 60 \
                and extra[0].isprintable() else show(extra[0])
            raise self.fail(
                f"{where}{name}", f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )

    def path_text(self, value: Any, key: str, what: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected {what}, got {show(value)}")
        if "\0" in value:
            raise self.fail(key, f"{show(value)} holds a NUL byte; give {what}")
        return value


def parse_split(text: str, checker: _Checker) -> list[float]:
    """Megatron's --split: up to three non-negative numbers, normalised."""
    if not re.fullmatch(r"\s*[0-9.]+(\s*[,/]\s*[0-9.]+){0,2}\s*", text):
        raise checker.fail(
            "split", f"{text!r} is not a split; write up to three numbers like \"969,30,1\""
        )
    try:
        parts = [float(p) for p in re.findall(r"[.0-9]+", text)]
    except ValueError:
        raise checker.fail("split", f"{show(text)} has a part that is not a number") from None
    parts += [0.0] * (3 - len(parts))
    if not math.isfinite(sum(parts)):
        raise checker.fail("split", f"{show(text)} has a part too large for a float; "
                                    "write shares like \"969,30,1\"")
    if sum(parts) <= 0:
        raise checker.fail("split", f"{show(text)} gives every split a zero share")
    return parts


def _parse_data_path(text: str, checker: _Checker, key: str) -> list[dict]:
    """Megatron's string form (get_blend_from_list): "PREFIX ...", or "W1 PREFIX1 W2
    PREFIX2 ..." when the word count is even and the first word is a number."""
    return _parse_data_words(text.split(), checker, key)


def _parse_data_words(words: list[str], checker: _Checker, key: str) -> list[dict]:
    """Megatron's get_blend_from_list on the words of --data-path."""
    words = [w.strip() for w in words]
    if not words:
        raise checker.fail(key, "is empty")
    if len(words) % 2:
        return [{"path": w} for w in words]
    weights = []
    for i in range(0, len(words), 2):
        try:
            weights.append(float(words[i]))
        except ValueError:
            weights.append(None)
    if None in weights:
        # Megatron reads every word as a path once one weight is not a number, and
        # asserts when a number follows that word in a weight position.
        first = weights.index(None)
        later = [i for i, w in enumerate(weights) if i > first and w is not None]
        if later:
            raise checker.fail(key, f"{show(words[2 * first])} is not a weight but "
                                    f"{show(words[2 * later[0]])} is: give WEIGHT PATH pairs, "
                                    "or paths only")
        return [{"path": w} for w in words]
    return [{"path": p, "weight": w} for w, p in zip(weights, words[1::2])]


def dataset_file(path: str, base_dir: str) -> str:
    """Where a dataset path of the config points: a URL as written (its string is
    what Megatron hashes), a relative path from the config's folder."""
    if scheme_of(path) is not None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base_dir, path))


def _json_key(entry: dict, file: str, checker: _Checker, where: str) -> str | None:
    """The key a text dataset is tokenized from (None for an IndexedDataset or .pbin)."""
    if not is_text_input(file):
        if entry.get("json_key") is not None:
            raise checker.fail(f"{where}.json_key", f"is for text datasets (.jsonl, .jsonl.gz, .jsonl.zst, "
                                                    f".parquet); {file} is not one")
        return None
    key = entry.get("json_key", "text")
    if not isinstance(key, str) or not key:
        raise checker.fail(f"{where}.json_key", f"expected a JSON key or Parquet column name, got {show(key)}")
    return key


def _parse_blend(value: Any, checker: _Checker, key: str, base_dir: str) -> Blend:
    if isinstance(value, str):
        value = _parse_data_path(value, checker, key)
    if not isinstance(value, list) or not value:
        raise checker.fail(key, "expected a non-empty list of datasets ({path, weight, name})")
    specs = []
    for i, entry in enumerate(value):
        where = f"{key}[{i}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict):
            raise checker.fail(where, "expected a mapping with `path` (and `weight`, `name`)")
        checker.unknown_keys(entry, DATASET_KEYS, f"{where}.")
        if entry.get("path") is None:
            raise checker.fail(f"{where}.path", "missing: the dataset prefix or .pbin file")
        path = checker.path_text(entry.get("path"), f"{where}.path", "the dataset prefix or .pbin file")
        file = dataset_file(path, base_dir)
        json_key = _json_key(entry, file, checker, where)
        try:  # (a text file is looked up when its tokenization is named: _with_texts)
            problem = None if json_key is not None else dataset_problem(file)
        except StorageUnavailable as exc:
            raise checker.fail(f"{where}.path", str(exc)) from None
        if problem is not None:
            raise checker.fail(f"{where}.path", problem)
        weight = entry.get("weight")
        if weight is not None:
            weight = checker.number(weight, f"{where}.weight")
            if not weight > 0:
                raise checker.fail(
                    f"{where}.weight", f"must be a positive number, got {show(entry.get('weight'))}"
                )
        name = entry.get("name")
        if name is None:
            name = text_stem(file) if json_key is not None else os.path.basename(dataset_stem(file))
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._+-]{1,255}", name) \
                or name in (".", ".."):
            raise checker.fail(
                f"{where}.name",
                f"{show(name)} is not a usable name (1 to 255 letters, digits, . _ + -)"
            )
        specs.append(DatasetSpec(path=path, file=file, name=name, weight=weight, json_key=json_key))
    with_weight = [s.weight is not None for s in specs]
    if any(with_weight) and not all(with_weight):
        missing = with_weight.index(False)
        raise checker.fail(
            f"{key}[{missing}].weight", "missing: give every dataset a weight, or none of them"
        )
    if all(with_weight) and not math.isfinite(sum(s.weight for s in specs)):
        raise checker.fail(key, "the weights add up to more than a float holds; scale them down")
    return Blend(tuple(specs))


def _check_names(blends: list[Blend], checker: _Checker, key: str) -> None:
    by_name: dict[str, str] = {}
    by_file: dict[str, str] = {}
    for blend in blends:
        for d in blend.datasets:
            if by_name.setdefault(d.name, d.file) != d.file:
                raise checker.fail(
                    key,
                    f"two datasets are named {d.name!r} ({by_name[d.name]} and {d.file}); "
                    "give them distinct `name:` values",
                )
            if by_file.setdefault(d.file, d.name) != d.name:
                raise checker.fail(
                    key,
                    f"{d.file} is named both {by_file[d.file]!r} and {d.name!r}; "
                    "give it one name everywhere",
                )


def _parse_samples(value: Any, checker: _Checker) -> dict[str, int | None]:
    if value is None:
        return dict.fromkeys(SPLITS)
    if isinstance(value, list):
        if len(value) != 3:
            raise checker.fail("samples", "a list must have three entries: [train, valid, test]")
        value = dict(zip(SPLITS, value))
    if not isinstance(value, dict):
        raise checker.fail("samples", "expected a mapping {train: N, valid: N, test: N}")
    checker.unknown_keys(value, set(SPLITS), "samples.")
    out = {}
    for s in SPLITS:
        v = value.get(s)
        out[s] = None if v is None else checker.integer(
            v, f"samples.{s}", minimum=0, why=" (2**63 - 1, Megatron's int64)")
    return out


def _with_texts(blend: Blend, tokenizer: TokenizerBlock, folder: str, checker: _Checker, key: str) -> Blend:
    """The blend with each text dataset pointing at its tokenized IndexedDataset in
    `folder` (tokenized when the corpus is opened; see megatron/tokenized.py)."""
    specs = []
    for i, d in enumerate(blend.datasets):
        if d.json_key is not None:
            if tokenizer.spec is None:
                raise checker.fail(f"{key}[{i}].path", "a text dataset is tokenized with the config's tokenizer: "
                                                       "give tokenizer.type (and its model, or vocab_file and "
                                                       "merge_file)")
            try:
                text = text_dataset(d.file, d.json_key, tokenizer.spec, tokenizer.append_eod, folder)
            except StorageError as exc:
                raise checker.fail(f"{key}[{i}].path", str(exc)) from None
            d = replace(d, file=text.prefix, text=text)
        specs.append(d)
    return Blend(tuple(specs))


def _check_weighted_sizes(blend: Blend | None, blend_per_split: dict | None,
                          samples: dict[str, int | None], checker: _Checker) -> None:
    """megatron-core asserts "size_is_none => weights_are_none" for every split, also
    one with a zero share of `split`; with blend_per_split, for each split given."""
    for s in SPLITS:
        weighted = blend if blend is not None else (blend_per_split or {}).get(s)
        if weighted is not None and weighted.weights is not None and samples[s] is None:
            source = "the datasets have" if blend is not None else f"blend_per_split.{s} has"
            raise checker.fail(
                f"samples.{s}",
                f"missing: {source} weights, so Megatron needs a {s} sample count (it asserts "
                "without one, even for a split with no share); give one or drop the weights",
            )


def load_config(path: str) -> Config:
    """Read and check a YAML config; raises ConfigError naming the file and key."""
    checker = _Checker(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping of keys (datasets, split, ...)")
    checker.unknown_keys(raw, TOP_LEVEL_KEYS, "")
    base_dir = os.path.dirname(os.path.abspath(path))
    storage = parse_storage(raw.get("storage"), checker, base_dir)
    configure_storage(storage)  # before any dataset is looked at: some may be remote

    sources = [k for k in DATA_SOURCES if raw.get(k) is not None]
    if len(sources) != 1:
        raise checker.fail(
            "datasets",
            "give exactly one of `datasets`, `data_path`, `blend_per_split`, `data_args_path` or "
            "`per_split_data_args_path`" + (f" (found {', '.join(sources)})" if sources else ""),
        )
    label = source = sources[0]  # label: the key errors name
    raw, source = _megatron_data_source(raw, source, checker, base_dir)
    blend = blend_per_split = None
    split = None
    if source == "blend_per_split":
        if raw.get("split") is not None:
            raise checker.fail("split", "cannot be used with blend_per_split (each split has its own blend)")
        value = raw["blend_per_split"]
        if not isinstance(value, dict):
            raise checker.fail("blend_per_split", "expected a mapping {train: [...], valid: [...], test: [...]}")
        checker.unknown_keys(value, set(SPLITS), "blend_per_split.")
        blend_per_split = {
            s: None if value.get(s) is None else _parse_blend(value[s], checker, f"blend_per_split.{s}", base_dir)
            for s in SPLITS
        }
        if not any(blend_per_split.values()):
            raise checker.fail("blend_per_split", "every split is empty; give at least one a blend")
        _check_names([b for b in blend_per_split.values() if b], checker, "blend_per_split")
    else:
        blend = _parse_blend(raw[source], checker, label, base_dir)
        _check_names([blend], checker, label)
        split_value = raw.get("split", "969,30,1")
        if isinstance(split_value, (int, float)) and not isinstance(split_value, bool):
            split_value = str(split_value)
        if not isinstance(split_value, str):
            raise checker.fail("split", f"expected a string like \"969,30,1\", got {show(split_value)}")
        parse_split(split_value, checker)
        split = split_value

    add_extra_token = checker.boolean(
        raw.get("add_extra_token_to_sequence", True), "add_extra_token_to_sequence")
    if raw.get("sequence_length") is None:
        raise checker.fail("sequence_length", "missing: the number of tokens per sample, e.g. 4096")
    # Megatron's sample index helper takes int32 lengths: S + the extra token must fit.
    sequence_length = checker.integer(
        raw.get("sequence_length"), "sequence_length", minimum=1,
        maximum=2**31 - 1 - int(add_extra_token),
        why=" (2**31 - 1 tokens with the extra token: Megatron's int32)")
    seed = checker.integer(raw.get("seed", 1234), "seed", minimum=0, maximum=2**32 - 1,
                           why=" (numpy's RandomState seed range)")
    surplus = checker.number(raw.get("mid_level_dataset_surplus", 0.005), "mid_level_dataset_surplus")
    if not 0 <= surplus <= MAX_SURPLUS:
        raise checker.fail("mid_level_dataset_surplus",
                           f"must be between 0 and {MAX_SURPLUS:g}, got {surplus}")
    tokenizer = parse_tokenizer(raw.get("tokenizer"), checker, base_dir)
    cache_dir = raw.get("cache_dir")
    if cache_dir is not None:
        cache_dir = checker.path_text(cache_dir, "cache_dir", "a directory path")
        cache_dir = os.path.normpath(os.path.join(base_dir, cache_dir))
    text_folder = os.path.join(cache_dir or storage.cache_folder, "text")
    if blend is not None:
        blend = _with_texts(blend, tokenizer, text_folder, checker, label)
    else:
        blend_per_split = {s: b and _with_texts(b, tokenizer, text_folder, checker, f"blend_per_split.{s}")
                           for s, b in blend_per_split.items()}
    training = with_schedule(parse_training(raw.get("training"), checker), sequence_length, checker)
    given = _parse_samples(raw.get("samples"), checker)
    samples = samples_with_training(given, training, checker)
    sample_keys = {} if training is None else \
        {s: training.derived_from(s) for s in SPLITS if given.get(s) is None and samples[s] is not None}
    _check_weighted_sizes(blend, blend_per_split, samples, checker)
    return Config(
        path=path,
        blend=blend,
        blend_per_split=blend_per_split,
        split=split,
        samples=samples,
        sequence_length=sequence_length,
        seed=seed,
        add_extra_token=add_extra_token,
        drop_last_partial_validation_sequence=checker.boolean(
            raw.get("drop_last_partial_validation_sequence", True),
            "drop_last_partial_validation_sequence",
        ),
        mid_level_dataset_surplus=surplus,
        eod=tokenizer.eod,
        pad=tokenizer.pad,
        tokenizer_identifiers=tokenizer.identifiers,
        cache_dir=cache_dir,
        raw=raw,
        training=training,
        sample_keys=sample_keys,
        storage=storage,
        tokenizer=tokenizer.spec,
    )


# -- the optional `training:` block (Megatron's data-parallel samplers) ------------

# keys that shape the global batch size over the run and its length
SCHEDULE_KEYS = {"rampup_batch_size", "step_batch_size_schedule", "train_samples"}
TRAINING_KEYS = {
    "data_parallel_size", "micro_batch_size", "dataloader_type", "data_sharding",
    "global_batch_size", "train_iters", "eval_interval", "eval_iters",
} | SCHEDULE_KEYS
DATALOADER_TYPES = ("single", "cyclic")
MEGATRON_EVAL_ITERS = 100  # megatron's default for --eval-iters


@dataclass(frozen=True)
class TrainingConfig:
    """How Megatron's data loader hands samples to data-parallel ranks."""

    data_parallel_size: int
    micro_batch_size: int
    dataloader_type: str = "single"  # single | cyclic
    data_sharding: bool = True  # cyclic only; Megatron's default
    global_batch_size: int | None = None
    train_iters: int | None = None
    eval_interval: int | None = None
    eval_iters: int | None = None  # None: Megatron's default (100) where it is needed
    rampup_batch_size: tuple[int, int, int] | None = None
    step_batch_size_schedule: str | None = None
    train_samples: int | None = None
    schedule: BatchSchedule | None = None  # global batch size by iteration (set by load_config)

    def derived_samples(self) -> dict[str, int] | None:
        """Sample counts per split as Megatron derives them from train_iters or
        train_samples (get_train_valid_test_num_samples), or None without either."""
        if self.train_iters is None and self.train_samples is None:
            return None
        # Megatron's args.global_batch_size: mbs x dp when not given (always so with a
        # step schedule, which refuses --global-batch-size).
        gbs = self.global_batch_size or self.micro_batch_size * self.data_parallel_size
        iters = self.train_iters
        if iters is None:
            iters = train_iters_from_samples(self.schedule, self.train_samples,
                                             None if self.rampup_batch_size is None else self.rampup_batch_size[2])
        eval_iters = MEGATRON_EVAL_ITERS if self.eval_iters is None else self.eval_iters
        return {
            "train": self.train_samples if self.train_samples is not None else iters * gbs,
            "valid": (iters // self.eval_interval + 1) * eval_iters * gbs,
            "test": eval_iters * gbs,
        }

    def derived_from(self, split: str) -> str:
        """The keys derived_samples() computes the split's count from, as a formula."""
        gbs = "training.global_batch_size" if self.global_batch_size else \
            "training.micro_batch_size × training.data_parallel_size"
        if split == "train":
            return "training.train_samples" if self.train_samples is not None else \
                f"training.train_iters × {gbs}"
        iters = "training.train_iters" if self.train_iters is not None else \
            "the iterations of training.train_samples"
        if split == "valid":
            return f"({iters} ÷ training.eval_interval + 1) × training.eval_iters × {gbs}"
        return f"training.eval_iters × {gbs}"

    def as_dict(self) -> dict[str, Any]:
        scheduled = {k: getattr(self, k) for k in sorted(SCHEDULE_KEYS) if getattr(self, k) is not None}
        if "rampup_batch_size" in scheduled:
            scheduled["rampup_batch_size"] = list(self.rampup_batch_size)
        return {
            **scheduled,
            "data_parallel_size": self.data_parallel_size,
            "micro_batch_size": self.micro_batch_size,
            "dataloader_type": self.dataloader_type,
            "data_sharding": self.data_sharding,
            "global_batch_size": self.global_batch_size,
            "train_iters": self.train_iters,
            "eval_interval": self.eval_interval,
            "eval_iters": self.eval_iters,
        }


# Ranks the mount shows a folder for, at most: each costs the daemon a view (about
# 2 KB), and 16,384 is past the data-parallel size of today's largest jobs.
MAX_DATA_PARALLEL_SIZE = 16384


def parse_training(value: Any, checker: _Checker) -> TrainingConfig | None:
    """The `training:` block, checked; None when it is absent."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise checker.fail("training", "expected a mapping {data_parallel_size: N, micro_batch_size: N, ...}")
    checker.unknown_keys(value, TRAINING_KEYS, "training.")

    def optional_int(key: str, minimum: int) -> int | None:
        v = value.get(key)
        return None if v is None else checker.integer(v, f"training.{key}", minimum=minimum)

    for key in ("data_parallel_size", "micro_batch_size"):
        if value.get(key) is None:
            raise checker.fail(f"training.{key}", "missing: needed to give each data-parallel rank its micro-batches")
    dp = checker.integer(value["data_parallel_size"], "training.data_parallel_size", minimum=1,
                         maximum=MAX_DATA_PARALLEL_SIZE,
                         why=" (the mount holds a folder of micro-batches per rank)")
    mbs = optional_int("micro_batch_size", 1)
    kind = value.get("dataloader_type", "single")
    if kind not in DATALOADER_TYPES:
        raise checker.fail("training.dataloader_type", f"{kind!r} is not a dataloader type (single or cyclic)")
    sharding = value.get("data_sharding")
    if sharding is not None:
        sharding = checker.boolean(sharding, "training.data_sharding")
        if kind != "cyclic":
            raise checker.fail("training.data_sharding", "only applies with dataloader_type: cyclic")
    gbs = optional_int("global_batch_size", 1)
    if gbs is not None and gbs % (mbs * dp):
        raise checker.fail(
            "training.global_batch_size",
            f"{gbs} is not a multiple of micro_batch_size x data_parallel_size = {mbs * dp}",
        )
    train_iters = optional_int("train_iters", 0)
    eval_interval = optional_int("eval_interval", 1)
    eval_iters = optional_int("eval_iters", 0)
    scheduled = _parse_schedule_keys(value, gbs, checker)
    if train_iters is not None and scheduled["train_samples"] is not None:
        raise checker.fail("training.train_samples", "give train_iters or train_samples, not both (Megatron asserts)")
    if train_iters is not None or scheduled["train_samples"] is not None:
        if gbs is None and scheduled["step_batch_size_schedule"] is None:
            raise checker.fail("training.global_batch_size", "missing: train_iters counts iterations of a global batch")
        if eval_interval is None:
            raise checker.fail("training.eval_interval", "missing: with train_iters, Megatron sizes the validation "
                               "split as (train_iters // eval_interval + 1) x eval_iters x global_batch_size")
    else:
        for key in ("eval_interval", "eval_iters"):
            if value.get(key) is not None:
                raise checker.fail(f"training.{key}", "only used with train_iters or train_samples "
                                                      "(to derive the sample counts)")
    return TrainingConfig(dp, mbs, kind, True if sharding is None else sharding, gbs, train_iters,
                          eval_interval, eval_iters, **scheduled)


def samples_with_training(samples: dict[str, int | None], training: TrainingConfig | None,
                          checker: _Checker) -> dict[str, int | None]:
    """`samples` with the counts train_iters derives filled in; a count given in
    both places must agree."""
    derived = None if training is None else training.derived_samples()
    if derived is None:
        return samples
    out = dict(samples)
    source = "train_iters" if training.train_iters is not None else "train_samples"
    for split, n in derived.items():
        if out.get(split) is None:
            out[split] = n
        elif out[split] != n:
            raise checker.fail(
                f"samples.{split}",
                f"{out[split]} disagrees with training.{source}, "
                f"which gives {n} as Megatron derives it; "
                "give one of them",
            )
    return out


# -- the global batch size over the run (training.rampup_batch_size, ...) ----------


def _parse_schedule_keys(value: dict, gbs: int | None, checker: _Checker) -> dict[str, Any]:
    """The keys of `training:` that shape the global batch size and the run's length."""
    out: dict[str, Any] = {"rampup_batch_size": None, "step_batch_size_schedule": None, "train_samples": None}
    ramp = value.get("rampup_batch_size")
    if ramp is not None:
        key = "training.rampup_batch_size"
        if not isinstance(ramp, list) or len(ramp) != 3:
            raise checker.fail(key, f"expected [start, increment, ramp_samples], got {show(ramp)}")
        out["rampup_batch_size"] = tuple(checker.integer(v, f"{key}[{i}]", minimum=0) for i, v in enumerate(ramp))
        if gbs is None:
            raise checker.fail("training.global_batch_size", "missing: the ramp-up ends at global_batch_size")
    step = value.get("step_batch_size_schedule")
    if step is not None:
        key = "training.step_batch_size_schedule"
        if not isinstance(step, str):
            raise checker.fail(key, f"expected a string like \"0:768 250B:1536\", got {show(step)}")
        if ramp is not None:
            raise checker.fail(key, "give rampup_batch_size or step_batch_size_schedule, not both")
        if gbs is not None:
            raise checker.fail(key, "Megatron-LM refuses it with --global-batch-size: leave global_batch_size out")
        out["step_batch_size_schedule"] = step
    samples = value.get("train_samples")
    if samples is not None:
        out["train_samples"] = checker.integer(samples, "training.train_samples", minimum=0)
    return out


def with_schedule(training: TrainingConfig | None, sequence_length: int,
                  checker: _Checker) -> TrainingConfig | None:
    """`training` with its BatchSchedule; every batch size the run reaches must be a
    multiple of micro_batch_size x data_parallel_size (Megatron asserts it)."""
    if training is None:
        return None
    t = training
    key = "training.global_batch_size"
    try:
        if t.rampup_batch_size is not None:
            key = "training.rampup_batch_size"
            schedule = rampup_schedule(*t.rampup_batch_size, t.global_batch_size)
        elif t.step_batch_size_schedule is not None:
            key = "training.step_batch_size_schedule"
            # Megatron-LM passes --seq-length: thresholds are tokens.
            schedule = step_schedule(t.step_batch_size_schedule, sequence_length)
        elif t.global_batch_size is not None:
            schedule = constant_schedule(t.global_batch_size)
        else:
            return t
    except ScheduleError as exc:
        raise checker.fail(key, str(exc)) from None
    step = t.micro_batch_size * t.data_parallel_size
    for size in schedule.batch_sizes:
        if size % step:
            raise checker.fail(key, f"reaches a global batch size of {size}, not a multiple of "
                                    f"micro_batch_size x data_parallel_size = {step} (Megatron asserts)")
    return replace(t, schedule=schedule)


# -- Megatron's own forms of the data arguments -----------------------------------

DATA_SOURCES = ("datasets", "data_path", "blend_per_split", "data_args_path", "per_split_data_args_path")


def _megatron_data_source(raw: dict, source: str, checker: _Checker, base_dir: str) -> tuple[dict, str]:
    """`raw` with Megatron's forms turned into ours: `data_path` as a list of words
    (--data-path's nargs), `data_args_path` (a file of those words) and
    `per_split_data_args_path` (a JSON file {train, valid, test}), read as
    Megatron-LM's get_blend_and_blend_per_split reads them. Relative paths, of the
    files and in them, are relative to the YAML file's folder."""
    value = raw[source]
    if source == "data_path" and isinstance(value, list) and value and all(isinstance(w, str) for w in value):
        return {**raw, "data_path": _parse_data_words(value, checker, "data_path")}, source
    if source == "data_args_path":
        text = _read_text(value, checker, source, base_dir)
        return {**raw, "data_path": _parse_data_words(text.split(), checker, source)}, "data_path"
    if source == "per_split_data_args_path":
        import json

        text = _read_text(value, checker, source, base_dir)
        try:
            per_split = json.loads(text)
        except ValueError as exc:
            raise checker.fail(source, f"{value} is not JSON ({exc})") from None
        if not isinstance(per_split, dict):
            raise checker.fail(source, f"{value} must hold a JSON object {{train, valid, test}}")
        blends = {}
        for split in SPLITS:
            if split not in per_split:  # Megatron reads all three keys
                raise checker.fail(source, f"{value} has no {split!r} key (Megatron reads train, valid and test)")
            words = per_split[split]
            if isinstance(words, str):
                words = words.split()
            if words is not None and (not isinstance(words, list) or not all(isinstance(w, str) for w in words)):
                raise checker.fail(source, f"{value}: {split}: expected a string or a list of strings")
            blends[split] = None if not words else _parse_data_words(words, checker, f"{source} {split}")
        return {**raw, "blend_per_split": blends}, "blend_per_split"
    return raw, source


def _read_text(value: Any, checker: _Checker, key: str, base_dir: str) -> str:
    path = checker.path_text(value, key, "a file path")
    file = os.path.join(base_dir, path)
    try:
        with open(file, encoding="utf-8") as f:
            return f.read(1 << 24)  # 16 MiB: far above any list of datasets
    except (OSError, UnicodeDecodeError) as exc:
        raise checker.fail(key, f"cannot read {file}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
