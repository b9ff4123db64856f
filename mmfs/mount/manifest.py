"""mmfs.json: everything a loader needs to read a mount's files, built in one
place (the mount serves it; `mmfs build --json` prints it)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mmfs import __version__
from mmfs.megatron.samplers import describe_training
from mmfs.mount.views import XATTR_DOCS, dataset_dir, name_width, sample_dir


def manifest(corpus: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The contents of mmfs.json for an opened corpus (mmfs.megatron.Corpus);
    `extra` adds sections (a view's own description)."""
    dtype = np.dtype(corpus.dtype)
    info: dict[str, Any] = {
        "mmfs_version": __version__,
        "dtype": dtype.name,
        "byte_order": "little",  # whatever the source, the files are little-endian
        "sequence_length": int(corpus.sequence_length),
        "add_extra_token_to_sequence": bool(corpus.config.add_extra_token),
        "tokens_per_sample": int(corpus.sample_tokens),
        "bytes_per_sample": int(corpus.sample_tokens) * dtype.itemsize,
        "eod_id": int(corpus.eod),
        "pad_id": int(corpus.pad),
        "pad_value_in_dtype": int(np.array(corpus.pad).astype(dtype)),
        "samples": {name: len(s) for name, s in corpus.indices.items() if len(s) > 0},
        "splits": describe_splits(corpus),
        "datasets": [_dataset(e) for e in corpus.datasets],
        "file_names": "zero-padded decimal id, width max(7, digits of the largest id), then .bin",
        "xattrs": dict(XATTR_DOCS),
        "config_path": os.path.abspath(str(corpus.config_path)),
        "config": corpus.config_dict,
    }
    training = corpus.config.training
    if training is not None:
        info["training"] = describe_training(
            training, info["samples"], info["bytes_per_sample"])
    info.update(extra or {})
    return info


def describe_splits(corpus: Any) -> dict[str, dict[str, Any]]:
    """How each split's indices were built (mmfs.json's `splits`)."""
    return {name: _split(name, s) for name, s in corpus.indices.items()}


def _split(name: str, s: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "top_level": "BlendedDataset" if s.blend else "GPTDataset",
        "samples": len(s),
        "gpt_datasets": [
            {
                "dataset": g.spec.name,
                "sequences": [g.params.beg, g.params.end],
                "num_samples_requested": g.params.num_samples,
                "samples": len(g),
                "epochs": g.shape("document_index")[0] // (g.params.end - g.params.beg),
                "cache": g.cache.path("*"),
            }
            for g in s.gpts
        ],
    }
    if s.blend:
        out["blend"] = {"weights": s.blend.weights, "size": s.blend.size,
                        "cache": s.blend.cache.path("*")}
    if len(s) > 0:
        out["path"] = sample_dir(name).lstrip("/")
        out["name_width"] = name_width(len(s))
    return out


def _dataset(e: Any) -> dict[str, Any]:
    ds = e.dataset
    return {
        "name": e.name,
        "path": e.path,
        "format": ds.format_name,
        "dtype": np.dtype(ds.dtype).name,
        "sequences": int(ds.num_sequences),
        "documents": int(ds.num_documents),
        "tokens": int(ds.num_tokens),
        "documents_path": dataset_dir(e.name, "documents").lstrip("/"),
        "documents_name_width": name_width(int(ds.num_documents)),
        "sequences_path": dataset_dir(e.name, "sequences").lstrip("/"),
        "sequences_name_width": name_width(int(ds.num_sequences)),
    }
