"""The YAML config: parsed into frozen dataclasses and checked before any index
is built. Every error names the YAML file and the key.

Keys follow megatron-core's names (see README.md, "Config"). Relative dataset
paths are relative to the YAML file's folder, but the path *as written* is what
goes into Megatron's cache description (and so into the cache file names).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import ConfigError

SPLITS = ("train", "valid", "test")

DEFAULT_TOKENIZER_CLASS = "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText"

TOP_LEVEL_KEYS = {
    "datasets",
    "data_path",
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
}
DATASET_KEYS = {"path", "weight", "name"}
TOKENIZER_KEYS = {"eod", "pad", "vocab_size", "class", "tokenizer_path", "unique_identifiers"}


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a blend."""

    path: str  # as written in the YAML: Megatron's dataset_path, hashed into cache names
    file: str  # where it is on disk (relative paths resolved against the YAML folder)
    name: str
    weight: float | None


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
            return [{"path": d.path, "name": d.name, "weight": d.weight} for d in b.datasets]

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
            "tokenizer": {"eod": self.eod, "pad": self.pad, **self.tokenizer_identifiers},
            "cache_dir": self.cache_dir,
        }


class _Checker:
    """Typed access to the raw YAML with errors naming the file and the key."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {message}")

    def integer(self, value: Any, key: str, minimum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number, got {value!r}")
        return float(value)

    def unknown_keys(self, mapping: dict, allowed: set[str], where: str) -> None:
        extra = sorted(set(mapping) - allowed)
        if extra:
            raise self.fail(
                f"{where}{extra[0]}", f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )


def parse_split(text: str, checker: _Checker) -> list[float]:
    """Megatron's --split: up to three non-negative numbers, normalised."""
    if not re.fullmatch(r"\s*[0-9.]+(\s*[,/]\s*[0-9.]+){0,2}\s*", text):
        raise checker.fail(
            "split", f"{text!r} is not a split; write up to three numbers like \"969,30,1\""
        )
    try:
        parts = [float(p) for p in re.findall(r"[.0-9]+", text)]
    except ValueError:
        raise checker.fail("split", f"{text!r} has a part that is not a number") from None
    parts += [0.0] * (3 - len(parts))
    if sum(parts) <= 0:
        raise checker.fail("split", f"{text!r} gives every split a zero share")
    return parts


def _dataset_file_exists(file: str) -> bool:
    if file.endswith(".pbin"):
        return os.path.isfile(file)
    prefix = file[:-4] if file.endswith((".bin", ".idx")) else file
    return os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")


def _parse_data_path(text: str, checker: _Checker, key: str) -> list[dict]:
    """Megatron's string form: "PREFIX" or "W1 PREFIX1 W2 PREFIX2 ..."."""
    words = text.split()
    if not words:
        raise checker.fail(key, "is empty")
    if len(words) == 1:
        return [{"path": words[0]}]
    if len(words) % 2:
        raise checker.fail(key, "expected pairs of WEIGHT PATH, e.g. \"0.7 data/a 0.3 data/b\"")
    entries = []
    for i in range(0, len(words), 2):
        try:
            weight = float(words[i])
        except ValueError:
            raise checker.fail(key, f"{words[i]!r} is not a weight (expected WEIGHT PATH pairs)") from None
        entries.append({"path": words[i + 1], "weight": weight})
    return entries


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
        path = entry.get("path")
        if not isinstance(path, str) or not path:
            raise checker.fail(f"{where}.path", "missing: the dataset prefix or .pbin file")
        file = path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))
        if not _dataset_file_exists(file):
            raise checker.fail(
                f"{where}.path",
                f"no dataset at {file} (expected {file}.bin and {file}.idx, or a .pbin file)",
            )
        weight = entry.get("weight")
        if weight is not None:
            weight = checker.number(weight, f"{where}.weight")
            if not weight > 0 or weight != weight or weight == float("inf"):
                raise checker.fail(
                    f"{where}.weight", f"must be a positive number, got {entry.get('weight')!r}"
                )
        name = entry.get("name")
        if name is None:
            name = os.path.basename(file[:-5] if file.endswith(".pbin") else file)
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._+-]+", name) or name in (".", ".."):
            raise checker.fail(
                f"{where}.name", f"{name!r} is not a usable name (letters, digits, . _ + -)"
            )
        specs.append(DatasetSpec(path=path, file=file, name=name, weight=weight))
    with_weight = [s.weight is not None for s in specs]
    if any(with_weight) and not all(with_weight):
        missing = with_weight.index(False)
        raise checker.fail(
            f"{key}[{missing}].weight", "missing: give every dataset a weight, or none of them"
        )
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
        out[s] = None if v is None else checker.integer(v, f"samples.{s}", minimum=0)
    return out


def _parse_tokenizer(value: Any, checker: _Checker) -> tuple[int | None, int | None, dict]:
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise checker.fail("tokenizer", "expected a mapping {eod: ID, pad: ID or null}")
    checker.unknown_keys(value, TOKENIZER_KEYS, "tokenizer.")
    eod = value.get("eod")
    eod = None if eod is None else checker.integer(eod, "tokenizer.eod", minimum=0)
    pad = value.get("pad")
    pad = None if pad is None else checker.integer(pad, "tokenizer.pad", minimum=-1)
    if pad == -1:
        pad = None  # Megatron's "no pad"
    vocab = value.get("vocab_size")
    vocab = None if vocab is None else checker.integer(vocab, "tokenizer.vocab_size", minimum=1)
    custom = value.get("unique_identifiers")
    if custom is not None:
        if not isinstance(custom, dict):
            raise checker.fail("tokenizer.unique_identifiers", "expected a mapping")
        return eod, pad, dict(custom)
    # What megatron-core's default text tokenizer puts into the cache description
    # (strings, as it stores them).
    identifiers = {
        "class": value.get("class", DEFAULT_TOKENIZER_CLASS),
        "tokenizer_path": value.get("tokenizer_path"),
        "vocab_size": None if vocab is None else str(vocab),
        "eod_id": None if eod is None else str(eod),
        "pad_id": str(-1 if pad is None else pad),
    }
    return eod, pad, identifiers


# libyaml when present: a blend of thousands of datasets parses in a tenth of the time
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_config(path: str) -> Config:
    """Read and check a YAML config; raises ConfigError naming the file and key."""
    checker = _Checker(path)
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.load(f, Loader=_YAML_LOADER)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a YAML config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping of keys (datasets, split, ...)")
    checker.unknown_keys(raw, TOP_LEVEL_KEYS, "")
    base_dir = os.path.dirname(os.path.abspath(path))

    sources = [k for k in ("datasets", "data_path", "blend_per_split") if raw.get(k) is not None]
    if len(sources) != 1:
        raise checker.fail(
            "datasets",
            "give exactly one of `datasets`, `data_path` or `blend_per_split`"
            + (f" (found {', '.join(sources)})" if sources else ""),
        )
    source = sources[0]
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
        blend = _parse_blend(raw[source], checker, source, base_dir)
        _check_names([blend], checker, source)
        split_value = raw.get("split", "969,30,1")
        if isinstance(split_value, (int, float)) and not isinstance(split_value, bool):
            split_value = str(split_value)
        if not isinstance(split_value, str):
            raise checker.fail("split", f"expected a string like \"969,30,1\", got {split_value!r}")
        parse_split(split_value, checker)
        split = split_value

    sequence_length = checker.integer(raw.get("sequence_length"), "sequence_length", minimum=1) \
        if raw.get("sequence_length") is not None else None
    if sequence_length is None:
        raise checker.fail("sequence_length", "missing: the number of tokens per sample, e.g. 4096")
    seed = checker.integer(raw.get("seed", 1234), "seed", minimum=0)
    if seed >= 2**32:
        raise checker.fail("seed", "must be below 2**32 (numpy's RandomState seed range)")
    surplus = checker.number(raw.get("mid_level_dataset_surplus", 0.005), "mid_level_dataset_surplus")
    if surplus < 0:
        raise checker.fail("mid_level_dataset_surplus", f"must not be negative, got {surplus}")
    eod, pad, identifiers = _parse_tokenizer(raw.get("tokenizer"), checker)
    cache_dir = raw.get("cache_dir")
    if cache_dir is not None:
        if not isinstance(cache_dir, str) or not cache_dir:
            raise checker.fail("cache_dir", "expected a directory path")
        cache_dir = os.path.normpath(os.path.join(base_dir, cache_dir))

    return Config(
        path=path,
        blend=blend,
        blend_per_split=blend_per_split,
        split=split,
        samples=_parse_samples(raw.get("samples"), checker),
        sequence_length=sequence_length,
        seed=seed,
        add_extra_token=checker.boolean(
            raw.get("add_extra_token_to_sequence", True), "add_extra_token_to_sequence"
        ),
        drop_last_partial_validation_sequence=checker.boolean(
            raw.get("drop_last_partial_validation_sequence", True),
            "drop_last_partial_validation_sequence",
        ),
        mid_level_dataset_surplus=surplus,
        eod=eod,
        pad=pad,
        tokenizer_identifiers=identifiers,
        cache_dir=cache_dir,
        raw=raw,
    )
