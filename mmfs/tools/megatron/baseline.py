"""megatron-core's own GPTDataset, built for an mmfs config: the baseline
`mmfs bench` and benchmarks/megatron_loader.py measure mmfs against (when
megatron-core is installed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mmfs.config.schema import SPLITS


class _Tokenizer:
    """The little of a tokenizer GPTDataset reads: eod, pad, identifiers."""

    def __init__(self, eod: int, pad: int | None) -> None:
        self.eod = eod
        if pad is not None and pad >= 0:
            self.pad = pad
        self.vocab_size = None
        self.unique_identifiers = {"class": "mmfs.bench", "eod": eod, "pad": pad}


def megatron_dataset(corpus: Any, split: str, cache_dir: str, **settings: Any) -> Any:
    """megatron-core's own top-level dataset of `split` for the corpus's config,
    built by BlendedMegatronDatasetBuilder (indices cached in `cache_dir`; `settings`:
    more GPTDatasetConfig fields). ImportError when megatron-core is not installed."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    import torch

    # One thread: idle OpenMP workers spinning after each tensor op would steal
    # the CPU from the other methods measured in the same process.
    torch.set_num_threads(1)
    cfg = corpus.config
    names = SPLITS

    def blend(b: Any) -> Any:
        return None if b is None else ([d.file for d in b.datasets], b.weights)

    kwargs: dict[str, Any] = {}
    if cfg.blend_per_split is not None:
        kwargs["blend_per_split"] = [blend(cfg.blend_per_split.get(n)) for n in names]
    else:
        kwargs["blend"] = blend(cfg.blend)
        kwargs["split"] = cfg.split
    config = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.sequence_length,
        path_to_cache=cache_dir,
        tokenizer=_Tokenizer(cfg.eod, cfg.pad),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        add_extra_token_to_sequence=cfg.add_extra_token,
        drop_last_partial_validation_sequence=cfg.drop_last_partial_validation_sequence,
        mid_level_dataset_surplus=cfg.mid_level_dataset_surplus,
        **kwargs, **settings,
    )
    sizes = [cfg.samples.get(n) for n in names]
    built = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return built[names.index(split)]


def megatron_reader(corpus: Any, split: str, cache_dir: str,
                     notes: list[str]) -> Callable[[np.ndarray], int] | None:
    try:
        ds = megatron_dataset(corpus, split, cache_dir)
    except ImportError as exc:
        notes.append(
            f"megatron-core is not installed here ({exc.name or exc}), so its "
            "GPTDataset.__getitem__ was not run; on this machine it read 12,000-17,000 "
            "samples/s (sequence_length 4096, uint16, 500 MB; tests/golden/README.md)"
        )
        return None
    except Exception as exc:  # its asserts on configs it does not support
        notes.append(f"megatron-core could not build this config: {type(exc).__name__}: {exc}")
        return None
    import megatron.core

    notes.append(f"megatron-core {getattr(megatron.core, '__version__', '?')}: "
                 "GPTDataset.__getitem__ (tokens, labels, masks as torch tensors), in-process")

    def read(part: np.ndarray) -> int:
        total = 0
        for i in part:
            total += int(ds[int(i)]["tokens"].numel())
        return total

    return read
