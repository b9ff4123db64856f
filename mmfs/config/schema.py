"""The YAML config: parsed into frozen dataclasses and checked before any index
is built. Every error names the YAML file and the key.

Keys follow megatron-core's names (see README.md, "Config"). Relative dataset
paths are relative to the YAML file's folder, but the path *as written* is what
goes into Megatron's cache description (and so into the cache file names).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from mmfs.config.blend import (
    DATA_SOURCES,
    SPLITS,
    Blend,
    DatasetSpec,
    check_names,
    megatron_data_source,
    parse_blend,
    parse_split,
    with_texts,
)
from mmfs.config.checker import Checker
from mmfs.config.phases import Phases, first_phase_data, parse_phases
from mmfs.config.safe_yaml import read_yaml_source, show
from mmfs.config.storage import parse_storage
from mmfs.config.tokenizer import parse_tokenizer
from mmfs.config.training import TrainingConfig, parse_training, samples_with_training, with_schedule
from mmfs.errors import ConfigError
from mmfs.storage.settings import StorageSettings
from mmfs.storage.settings import configure as configure_storage
from mmfs.text.tokenizer import TokenizerSpec

__all__ = ["SPLITS", "Blend", "Config", "DatasetSpec", "TrainingConfig", "load_config"]

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
    "phases",
    "phase_mode",
}
MAX_SURPLUS = 1e9  # far above any use; keeps (1 + surplus) * samples finite


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
    phases: Phases | None = None  # `phases:` (config/phases.py); None: one blend for the whole run
    # (the YAML document as parsed, the sha256 of the file's bytes): what a record of
    # the config keeps (megatron/cache/resolved.py)
    source: tuple[Any, str] | None = field(default=None, compare=False, repr=False)

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
        blends += [p.blend for p in self.phases.phases] if self.phases else []
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
            **({} if self.phases is None else
               {"phases": self.phases.as_dict(), "phase_mode": self.phases.mode}),
        }

def _parse_samples(value: Any, checker: Checker) -> dict[str, int | None]:
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

def _check_weighted_sizes(blend: Blend | None, blend_per_split: dict | None,
                          samples: dict[str, int | None], checker: Checker) -> None:
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


def load_config(path: str, known: tuple[Any, str, dict[str, str]] | None = None) -> Config:
    """Read and check a YAML config; raises ConfigError naming the file and key.

    known: (the YAML as parsed, the sha256 of its bytes, {dataset file: its name})
    from a record of this very config and datasets (megatron/cache/resolved.py):
    the YAML is not parsed again and the datasets are not looked at again."""
    checker = Checker(path)
    document = read_yaml_source(path) if known is None else known[:2]
    raw = document[0]
    sound = None if known is None else dict(known[2])  # parse_blend's `checked`
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping of keys (datasets, split, ...)")
    checker.unknown_keys(raw, TOP_LEVEL_KEYS, "")
    base_dir = os.path.dirname(os.path.abspath(path))
    storage = parse_storage(raw.get("storage"), checker, base_dir)
    configure_storage(storage)  # before any dataset is looked at: some may be remote

    named_as = ""  # "phases[0].": the data are the first phase's (valid and test come from it)
    if not any(raw.get(k) is not None for k in DATA_SOURCES):
        raw, named_as = first_phase_data(raw, checker)
    sources = [k for k in DATA_SOURCES if raw.get(k) is not None]
    if len(sources) != 1:
        raise checker.fail(
            "datasets",
            "give exactly one of `datasets`, `data_path`, `blend_per_split`, `data_args_path` or "
            "`per_split_data_args_path`" + (f" (found {', '.join(sources)})" if sources else ""),
        )
    source = sources[0]
    label = named_as + source  # the key errors name
    raw, source = megatron_data_source(raw, source, checker, base_dir)
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
            s: None if value.get(s) is None else parse_blend(value[s], checker, f"blend_per_split.{s}", base_dir,
                                                             sound)
            for s in SPLITS
        }
        if not any(blend_per_split.values()):
            raise checker.fail("blend_per_split", "every split is empty; give at least one a blend")
        check_names([b for b in blend_per_split.values() if b], checker, "blend_per_split")
    else:
        blend = parse_blend(raw[source], checker, label, base_dir, sound)
        check_names([blend], checker, label)
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
        blend = with_texts(blend, tokenizer, text_folder, checker, label)
    else:
        blend_per_split = {s: b and with_texts(b, tokenizer, text_folder, checker, f"blend_per_split.{s}")
                           for s, b in blend_per_split.items()}
    given = _parse_samples(raw.get("samples"), checker)
    training = with_schedule(parse_training(raw.get("training"), checker), sequence_length, given.get("train"),
                             checker)
    samples = samples_with_training(given, training, checker)
    sample_keys = {} if training is None else \
        {s: training.derived_from(s) for s in SPLITS if given.get(s) is None and samples[s] is not None}
    _check_weighted_sizes(blend, blend_per_split, samples, checker)
    if training is not None:  # Megatron-Bridge's batch sampler reshuffles with the config's seed
        training = dataclasses.replace(training, batch_seed=seed)
    phases = parse_phases(raw, checker, base_dir, blend, samples, sequence_length, training)
    if phases is not None and training is not None and training.dataloader_type == "batch":
        raise checker.fail("training.dataloader_type", "batch (Megatron-Bridge's sampler) with phases: Bridge has "
                           "no phases, and mmfs has no reference for the mix")
    if phases is not None and training is not None and training.has_eval_layout:
        raise checker.fail("phases", "Megatron-Bridge's evaluation keys (training.eval_micro_batch_size, "
                           "eval_global_batch_size, valid_dataloader_type) with phases: Bridge has no phases, and "
                           "mmfs has no reference for the mix")
    if phases is not None:
        phases = phases.with_blends(lambda b, key: with_texts(b, tokenizer, text_folder, checker, f"{key}.datasets"))
        check_names([blend, *(p.blend for p in phases.phases)], checker, "phases")
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
        phases=phases,
        source=document,
    )
