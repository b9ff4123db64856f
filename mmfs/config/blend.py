"""The datasets of a config: blends (`datasets`, `data_path`, `blend_per_split`),
Megatron's string and file forms of them, the split string, text datasets."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, replace
from typing import Any

from mmfs.config.checker import Checker
from mmfs.config.safe_yaml import show
from mmfs.config.tokenizer import TokenizerBlock
from mmfs.formats import dataset_problem, dataset_stem
from mmfs.storage import StorageError, StorageUnavailable, scheme_of
from mmfs.storage.file import read_text_file
from mmfs.text.dataset import TextDataset, text_dataset, text_stem
from mmfs.text.source import is_text_input

SPLITS = ("train", "valid", "test")
DATASET_KEYS = {"path", "weight", "name", "json_key"}

MAX_NAME = 255  # bytes of a dataset's name: a folder of the mount


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


def parse_split(text: str, checker: Checker) -> list[float]:
    """Megatron's --split: up to three non-negative numbers, normalised. megatron-core's
    parse_and_normalize_split reads the numbers of the string and nothing else (a
    launch script's literal quotes, "'99,1,0'", pass), so mmfs does too."""
    try:
        parts = [float(p) for p in re.findall(r"[.0-9]+", text)]
    except ValueError:
        raise checker.fail("split", f"{show(text)} has a part that is not a number") from None
    if not parts:
        raise checker.fail("split", f"{text!r} is not a split; write up to three numbers like \"969,30,1\"")
    if len(parts) > 3:
        raise checker.fail("split", f"{text!r} is not a split: {len(parts)} numbers, Megatron asserts at most "
                                    "three; write them like \"969,30,1\"")
    parts += [0.0] * (3 - len(parts))
    if not math.isfinite(sum(parts)):
        raise checker.fail("split", f"{show(text)} has a part too large for a float; "
                                    "write shares like \"969,30,1\"")
    if sum(parts) <= 0:
        raise checker.fail("split", f"{show(text)} gives every split a zero share")
    return parts


def parse_data_path(text: str, checker: Checker, key: str) -> list[dict]:
    """Megatron's string form (get_blend_from_list): "PREFIX ...", or "W1 PREFIX1 W2
    PREFIX2 ..." when the word count is even and the first word is a number."""
    return parse_data_words(text.split(), checker, key)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def parse_data_words(words: list[str], checker: Checker, key: str) -> list[dict]:
    """Megatron's get_blend_from_list on the words of --data-path."""
    words = [w.strip() for w in words]
    if not words:
        raise checker.fail(key, "is empty")
    if len(words) % 2:
        if len(words) >= 3 and all(_is_number(w) for w in words[::2]) and not any(_is_number(w) for w in words[1::2]):
            # WEIGHT PATH pairs and one weight more: Megatron would read every word as a path
            raise checker.fail(key, f"the weight {show(words[-1])} has no path after it ({len(words)} words: "
                                    "WEIGHT PATH pairs need an even count); give its path or drop it")
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


def dataset_file(path: str, base_dir: str, real_folders: dict[str, str] | None = None) -> str:
    """Where a dataset path of the config points, the dataset's identity: a URL as
    written, a local path resolved from the config's folder through `.`, `..` and
    symbolic links, so that one dataset written two ways is one. (Megatron hashes the
    path as written: that is DatasetSpec.path, kept beside.)

    real_folders: folders resolved already, by this same look at the config: ten
    thousand datasets in one folder resolve it once, then each prefix is one lstat
    (os.path.realpath would lstat every part of every path)."""
    if scheme_of(path) is not None:
        return path
    joined = os.path.join(base_dir, path)
    folder, name = os.path.split(joined)
    if real_folders is None or name in ("", ".", ".."):
        return os.path.realpath(joined)
    try:
        if stat.S_ISLNK(os.lstat(joined).st_mode):
            return os.path.realpath(joined)
    except OSError:
        pass  # no such file (a prefix usually is none): as realpath, the name is kept
    real = real_folders.get(folder)
    if real is None:
        real = real_folders[folder] = os.path.realpath(folder)
    return os.path.join(real, name)


def _json_key(entry: dict, file: str, checker: Checker, where: str) -> str | None:
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


def parse_blend(value: Any, checker: Checker, key: str, base_dir: str,
                checked: dict[str, str] | None = None) -> Blend:
    """checked: files already found sound, with their default names (a run in
    phases names a dataset in many phases: each is looked at once); the files
    found sound here are added."""
    if isinstance(value, str):
        value = parse_data_path(value, checker, key)
    if not isinstance(value, list) or not value:
        raise checker.fail(key, "expected a non-empty list of datasets ({path, weight, name})")
    specs = []
    real_folders: dict[str, str] = {}
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
        file = dataset_file(path, base_dir, real_folders)
        json_key = _json_key(entry, file, checker, where)
        if json_key is None and path.endswith((".bin", ".idx")):
            raise checker.fail(f"{where}.path", f"{path} ends in {path[-4:]}: Megatron appends .bin and .idx to a "
                                                f"dataset path itself (it would open {path}.idx); give the prefix "
                                                f"{path[:-4]}")
        try:  # (a text file is looked up when its tokenization is named: _with_texts)
            problem = None if json_key is not None or (checked is not None and file in checked) \
                else dataset_problem(file)
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
        if name is None and checked is not None and file in checked:
            name = checked[file]
        if name is None:
            name = text_stem(file) if json_key is not None else os.path.basename(dataset_stem(file))
            if len(name.encode()) > MAX_NAME:  # an object key's last part may be 1,024 bytes: kept unique
                name = f"{name[:MAX_NAME - 41]}-{hashlib.sha256(name.encode()).hexdigest()[:40]}"
            if checked is not None:
                checked[file] = name
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._+-]{1,%d}" % MAX_NAME, name) \
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


def check_names(blends: list[Blend], checker: Checker, key: str) -> None:
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


def with_texts(blend: Blend, tokenizer: TokenizerBlock, folder: str, checker: Checker, key: str) -> Blend:
    """The blend with each text dataset pointing at its tokenized IndexedDataset in
    `folder` (tokenized when the corpus is opened; see megatron/tokenized.py)."""
    specs = []
    for i, d in enumerate(blend.datasets):
        if d.json_key is not None and d.text is None:  # (a phase may reuse a blend already done)
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


# -- Megatron's own forms of the data arguments -----------------------------------

# The largest file of Megatron's data arguments (data_args_path, per_split_data_args_path,
# and `mmfs config --from-megatron @FILE`) read: some 5 million dataset paths.
MAX_ARGS_FILE = 256 << 20

DATA_SOURCES = ("datasets", "data_path", "blend_per_split", "data_args_path", "per_split_data_args_path")


def megatron_data_source(raw: dict, source: str, checker: Checker, base_dir: str) -> tuple[dict, str]:
    """`raw` with Megatron's forms turned into ours: `data_path` as a list of words
    (--data-path's nargs), `data_args_path` (a file of those words) and
    `per_split_data_args_path` (a JSON file {train, valid, test}), read as
    Megatron-LM's get_blend_and_blend_per_split reads them. Relative paths, of the
    files and in them, are relative to the YAML file's folder."""
    value = raw[source]
    if source == "data_path" and isinstance(value, list) and value and all(isinstance(w, str) for w in value):
        return {**raw, "data_path": parse_data_words(value, checker, "data_path")}, source
    if source == "data_args_path":
        text = _read_text(value, checker, source, base_dir)
        return {**raw, "data_path": parse_data_words(text.split(), checker, source)}, "data_path"
    if source == "per_split_data_args_path":
        text = _read_text(value, checker, source, base_dir)
        try:
            per_split = json.loads(text)
        except RecursionError:
            raise checker.fail(source, f"{value} nests deeper than Python's JSON reader goes; "
                                       "give a flat {train, valid, test} object") from None
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
            blends[split] = None if not words else parse_data_words(words, checker, f"{source} {split}")
        return {**raw, "blend_per_split": blends}, "blend_per_split"
    return raw, source


def _read_text(value: Any, checker: Checker, key: str, base_dir: str) -> str:
    path = checker.path_text(value, key, "a file path")
    try:
        return read_text_file(os.path.join(base_dir, path), MAX_ARGS_FILE, "arguments file")
    except StorageError as exc:
        raise checker.fail(key, str(exc)) from None
