"""mmfs.json: everything a loader needs to read a mount's files, built in one
place (the mount serves it; `mmfs build --json` prints it)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mmfs import __version__
from mmfs.megatron.phases.evaluations import eval_schedule
from mmfs.megatron.phases.facts import describe_phases
from mmfs.megatron.phases.sampling import beyond_count
from mmfs.megatron.sampling.rankplan import plan_kind
from mmfs.mount.contract import (
    DOCUMENTS,
    FILE_NAMES,
    KEY_ADD_EXTRA_TOKEN,
    KEY_BEYOND,
    KEY_BEYOND_SAMPLES,
    KEY_BYTES_PER_MICROBATCH,
    KEY_BYTES_PER_SAMPLE,
    KEY_DATA_PARALLEL_SIZE,
    KEY_DTYPE,
    KEY_EOD,
    KEY_MICRO_BATCH_SIZE,
    KEY_MICROBATCH_NAME_WIDTH,
    KEY_MICROBATCHES,
    KEY_NAME_WIDTH,
    KEY_PAD,
    KEY_PATH,
    KEY_PHASE_NAME_WIDTH,
    KEY_PHASES,
    KEY_RANK_NAME_WIDTH,
    KEY_RANKS_PATH,
    KEY_SAMPLES,
    KEY_SEQUENCE_LENGTH,
    KEY_SPLIT_LAYOUTS,
    KEY_SPLITS,
    KEY_STREAMS_PATH,
    KEY_TOKENS_PER_SAMPLE,
    KEY_TRAINING,
    RANKS,
    SAMPLES,
    SEQUENCES,
    XATTR_DOCS,
    beyond_dir,
    dataset_dir,
    name_width,
    phase_dir,
    phase_name_width,
    rank_name_width,
    ranks_dir,
    sample_dir,
    streams_dir,
)


def manifest(corpus: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The contents of mmfs.json for an opened corpus (mmfs.megatron.Corpus);
    `extra` adds sections (a view's own description)."""
    dtype = np.dtype(corpus.dtype)
    info: dict[str, Any] = {
        "mmfs_version": __version__,
        KEY_DTYPE: dtype.name,
        "byte_order": "little",  # whatever the source, the files are little-endian
        KEY_SEQUENCE_LENGTH: int(corpus.sequence_length),
        KEY_ADD_EXTRA_TOKEN: bool(corpus.config.add_extra_token),
        KEY_TOKENS_PER_SAMPLE: int(corpus.sample_tokens),
        KEY_BYTES_PER_SAMPLE: int(corpus.sample_tokens) * dtype.itemsize,
        KEY_EOD: int(corpus.eod),
        KEY_PAD: int(corpus.pad),
        "pad_value_in_dtype": int(np.array(corpus.pad).astype(dtype)),
        KEY_SAMPLES: {name: len(s) for name, s in corpus.indices.items() if len(s) > 0},
        KEY_SPLITS: describe_splits(corpus),
        "datasets": [_dataset(e) for e in corpus.datasets],
        "file_names": FILE_NAMES,
        "xattrs": dict(XATTR_DOCS),
        "config_path": os.path.abspath(str(corpus.config_path)),
        "config": corpus.config_dict,
    }
    training = corpus.config.training
    if training is not None:
        info[KEY_TRAINING] = describe_training(
            training, info[KEY_SAMPLES], info[KEY_BYTES_PER_SAMPLE])
    train = corpus.indices.get("train")
    if getattr(train, "phases", None) is not None:
        info[KEY_PHASES] = describe_phases(train, eval_schedule(training, train.phases.train_samples))
        if train.evals:
            describe_phase_splits(info[KEY_PHASES], train.evals, training)
    info.update(extra or {})
    return info


def describe_phase_splits(section: dict[str, Any], evals: list[dict[str, Any]], training: Any) -> None:
    """Under restart, each phase's own valid and test in the `phases` section: what
    `splits` says of a split, where the mount serves it (its samples, its streams of
    any layout), and its micro-batches on the config's layout."""
    width = section[KEY_PHASE_NAME_WIDTH] = phase_name_width(len(evals))
    for k, (phase, own) in enumerate(zip(section["phases"], evals)):
        for name, s in own.items():
            if len(s) == 0:
                continue
            folder = phase_dir(name, k, width).lstrip("/")
            entry = phase[KEY_SPLITS][name]
            entry.update(_split(name, s), **{KEY_PATH: f"{folder}/{SAMPLES}",
                                             KEY_STREAMS_PATH: streams_dir(folder).lstrip("/")})
            if training is not None:
                files = training.files_per_rank(name, len(s))
                entry[KEY_MICROBATCHES] = files
                entry[KEY_MICROBATCH_NAME_WIDTH] = name_width(files)
                if files > 0:
                    entry[KEY_RANKS_PATH] = f"{folder}/{RANKS}"


def describe_splits(corpus: Any) -> dict[str, dict[str, Any]]:
    """How each split's indices were built (mmfs.json's `splits`)."""
    return {name: _split(name, s) for name, s in corpus.indices.items()}


def top_level(s: Any) -> str:
    """What a split's top-level dataset is."""
    if not s.blend:
        return "GPTDataset"
    return "phases" if getattr(s, "phases", None) is not None else "BlendedDataset"


def epochs(g: Any) -> int:
    """The epochs of its dataset's split that a GPTDataset's document index holds."""
    return g.shape("document_index")[0] // max(1, g.params.end - g.params.beg)


def _split(name: str, s: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "top_level": top_level(s),
        "samples": len(s),
        "gpt_datasets": [
            {
                "dataset": g.spec.name,
                "sequences": [g.params.beg, g.params.end],
                "num_samples_requested": g.params.num_samples,
                "samples": len(g),
                "epochs": epochs(g),
                "cache": g.cache.path("*"),
            }
            for g in s.gpts
        ],
    }
    if s.blend:
        out["blend"] = {"weights": s.blend.weights, "size": s.blend.size,  # (weights None: phased)
                        "cache": s.blend.cache.path("*")}
    if len(s) > 0:
        out[KEY_PATH] = sample_dir(name).lstrip("/")
        out[KEY_NAME_WIDTH] = name_width(len(s))
    beyond = beyond_count(s)
    if beyond:  # ids len(s) on: a restart phase's dataset past its samples (docs/phases.md)
        out[KEY_BEYOND] = {KEY_PATH: beyond_dir(name).lstrip("/"), KEY_NAME_WIDTH: name_width(beyond),
                           KEY_BEYOND_SAMPLES: beyond}
    return out


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """np.dtype(dtype).name, found once per dtype (numpy makes it anew each time it is asked)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def _dataset(e: Any) -> dict[str, Any]:
    ds = e.dataset
    return {
        "name": e.name,
        "path": e.path,
        "format": ds.format_name,
        "dtype": _dtype_name(ds.dtype),
        "sequences": int(ds.num_sequences),
        "documents": int(ds.num_documents),
        "tokens": int(ds.num_tokens),
        "documents_path": dataset_dir(e.name, DOCUMENTS).lstrip("/"),
        "documents_name_width": name_width(int(ds.num_documents)),
        "sequences_path": dataset_dir(e.name, SEQUENCES).lstrip("/"),
        "sequences_name_width": name_width(int(ds.num_sequences)),
    }


KEY_NOT_SERVED = "not_served"  # {view: why it is not served for this config}
HYBRID_CP_WHY = ("training.hybrid_context_parallel (Megatron's --hybrid-context-parallel): Megatron-LM wraps the "
                 "train iterator in HybridCPDataLoaderWrapper, which re-deals each step's packed sub-samples "
                 "between the data x context parallel ranks, so what a rank trains on is not what its sampler "
                 "reads; train/samples and each global batch's samples are still Megatron's, and valid and test "
                 "are read as without it")


def describe_training(training_cfg: Any, split_lengths: dict[str, int], bytes_per_sample: int) -> dict[str, Any]:
    """mmfs.json's `training` section.

    training_cfg: the config's TrainingConfig (config.training);
    split_lengths: {split: samples} of the splits the mount shows (Corpus.splits);
    bytes_per_sample: the size of one sample file."""
    mbs, dp = training_cfg.micro_batch_size, training_cfg.data_parallel_size
    layouts = {split: training_cfg.layout(split) for split in split_lengths}
    files = {split: training_cfg.files_per_rank(split, int(n)) for split, n in split_lengths.items()}
    out: dict[str, Any] = dict(training_cfg.as_dict())
    out.update({
        KEY_MICRO_BATCH_SIZE: mbs,
        KEY_DATA_PARALLEL_SIZE: dp,
        "sampler": plan_kind(training_cfg.dataloader_type, training_cfg.data_sharding),
        KEY_RANK_NAME_WIDTH: rank_name_width(dp),
        KEY_MICROBATCHES: files,
        KEY_MICROBATCH_NAME_WIDTH: {split: name_width(f) for split, f in files.items()},
        KEY_RANKS_PATH: {split: ranks_dir(split).lstrip("/") for split, f in files.items() if f > 0},
        KEY_BYTES_PER_MICROBATCH: mbs * int(bytes_per_sample),
    })
    # each split's sampler and micro-batch size (evaluation may read on its own: Megatron-Bridge)
    out[KEY_SPLIT_LAYOUTS] = {split: {KEY_MICRO_BATCH_SIZE: m, "dataloader_type": kind,
                                      "sampler": plan_kind(kind, training_cfg.data_sharding),
                                      KEY_BYTES_PER_MICROBATCH: m * int(bytes_per_sample)}
                              for split, (kind, m) in layouts.items()}
    if training_cfg.global_batch_size is not None and training_cfg.rampup_batch_size is None:
        out["microbatches_per_iteration"] = training_cfg.global_batch_size // (mbs * dp)
    if training_cfg.schedule is not None:  # iteration -> consumed_samples
        out["batch_schedule"] = training_cfg.schedule.describe()
    if training_cfg.hybrid_context_parallel:
        out[KEY_RANKS_PATH].pop("train", None)
        out[KEY_NOT_SERVED] = {"train/ranks": HYBRID_CP_WHY, "train/streams": HYBRID_CP_WHY}
    return out
