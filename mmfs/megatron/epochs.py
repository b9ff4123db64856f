"""Where a run reads more of a dataset than its documents hold: a warning for each
dataset and split, with the iteration (said by `mmfs config --from-megatron`, `mmfs
build` and `mmfs mount`).

Megatron does not stop there: megatron-core's GPTDataset builds as many epochs of a
dataset's documents as the samples asked of it need (its document index repeats
them, shuffled), and a BlendedDataset draws from each dataset by weight however many
epochs that takes: the model sees those documents again. A GPTDataset's samples cut
the stream of its document index into sequence_length tokens (plus the extra token),
so one epoch's worth is the samples whose tokens fit in the tokens its documents
hold, (tokens - extra) // sequence_length; the run reads past it with the next
sample it draws of the dataset, whose iteration is said (the split's order, which
the single sampler reads; the cyclic sampler reads the split shuffled). Which
documents come again is the shuffle's (the document index shuffles its epochs
together): the iteration says when the run has read more tokens of the dataset than
its documents hold.

The blend's order is its greedy index (BlendedDataset's build_blending_indices),
read up to the draw looked for; past EXACT_UP_TO samples into the run the position
is estimated from the weight (said "about"): `mmfs config` does not build a blend
index of hundreds of millions of samples to say it, `mmfs build` reads the built one.

A run in phases: its train lines are each phase's (mmfs/megatron/phases/epochs.py),
its valid and test the top level's splits, said as here.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from mmfs.megatron.epoch_lines import MEGATRON_GOES_ON, Member, tokens_of, where
from mmfs.megatron.phases.epochs import corpus_phase_warnings, planned_phase_warnings

EXACT_UP_TO = 16_000_000  # blend positions read (or computed) exactly, at most


def split_warnings(split: str, run: int, members: list[Member], weights: list[float] | None,
                   blend_prefix: Callable[[int], np.ndarray] | None, schedule: Any, cyclic: bool) -> list[str]:
    """The lines of one split read for `run` samples (blend_prefix(n): the blend's first
    n dataset ids; None: one GPTDataset, the split itself)."""
    out = []
    for d, m in enumerate(members):
        epoch = m.one_epoch
        if blend_prefix is None:
            taken, first, about = run, epoch, False
        else:
            w = weights[d]
            if w <= 0 or w * run <= epoch - 1:  # the greedy blend draws within 1 of weight x samples
                continue
            need = min(run, math.ceil((epoch + 2) / w) + len(members) + 2)
            if need <= EXACT_UP_TO:
                drawn = np.flatnonzero(blend_prefix(need) == d)
                first, about = (int(drawn[epoch]) if drawn.size > epoch else None), False
            else:
                first, about = min(run - 1, math.ceil((epoch + 1) / w) - 1), True
            if first is None:
                continue
            taken = int(np.count_nonzero(blend_prefix(run) == d)) if run <= EXACT_UP_TO else round(w * run)
        if taken <= epoch:
            continue
        out.append(f"{split}: {m.name} is read past its documents {where(split, first, schedule, cyclic, about)}"
                   f": the run reads {'about ' if about or taken != run and run > EXACT_UP_TO else ''}"
                   f"{taken:,} of its samples, its documents hold {epoch:,} ({m.epochs(taken):.2f} epochs). "
                   f"{MEGATRON_GOES_ON}")
    return out


def run_warnings(config: Any, datasets: dict, splits: dict[str, tuple[list, list | None, Any]],
                 phased: Callable[[Any, bool], list[str]] | None = None) -> list[str]:
    """The lines of every split: splits[name] = ([(spec, params)], weights or None,
    blend_prefix or None); datasets: {spec.file: opened dataset}; phased(schedule,
    cyclic): the train lines of a run in phases (mmfs/megatron/phases/epochs.py), whose
    valid and test are the top level's splits."""
    training = config.training
    cyclic = training is not None and training.dataloader_type == "cyclic"
    out = []
    if config.phases is not None and phased is not None:
        out += phased(None if training is None else training.split_schedule("train"), cyclic)
    for split, (gpts, weights, prefix) in splits.items():
        if split == "train" and config.phases is not None:
            continue
        run = config.samples.get(split)
        if not run or not gpts:
            continue
        members = [Member(spec.name, tokens_of(datasets[spec.file], p.beg, p.end), p.sequence_length,
                          int(p.add_extra_token)) for spec, p in gpts]
        schedule = None if training is None else training.split_schedule(split)
        out += split_warnings(split, run, members, weights, prefix, schedule, cyclic)
    return out


def corpus_warnings(corpus: Any) -> list[str]:
    """run_warnings of an opened corpus (its blends read from their built indices)."""

    splits = {}
    for name, indices in corpus.indices.items():
        if len(indices) == 0 or (name == "train" and corpus.config.phases is not None):
            continue
        blend = indices.blend
        prefix = None if blend is None else (lambda n, b=blend: np.asarray(b.dataset_index[:n]))
        weights = None if blend is None else _normalized(blend.weights, [len(g) for g in indices.gpts])
        splits[name] = ([(g.spec, g.params) for g in indices.gpts], weights, prefix)
    by_name = {e.name: e.dataset for e in corpus.datasets}
    datasets = {s.file: by_name[s.name] for s in corpus.config.all_datasets}

    def phased(schedule: Any, cyclic: bool) -> list[str]:
        gpts = corpus.indices["train"].gpts
        members = [Member(g.spec.name, tokens_of(datasets[g.spec.file], g.params.beg, g.params.end),
                          g.params.sequence_length, int(g.params.add_extra_token)) for g in gpts]
        return corpus_phase_warnings(corpus, members, schedule, cyclic)

    return run_warnings(corpus.config, datasets, splits, phased)


def planned_warnings(config: Any, datasets: dict) -> list[str]:
    """run_warnings of a config before anything is built (`mmfs config`): its splits as
    the builder plans them, each blend's order computed (up to EXACT_UP_TO samples)."""
    from mmfs.megatron.build.builder import Builder
    from mmfs.megatron.indices.blend import build_blending_indices

    splits = {}
    wanted = ("valid", "test") if config.phases is not None else ("train", "valid", "test")
    for p in Builder(config, datasets).plan_splits(wanted):
        if p.get("by_length"):
            continue  # weighted by the GPTDatasets' lengths: known once built (`mmfs build` says it)
        weights = p.get("weights") if p.get("blend_task") else None
        prefix = None if weights is None else (lambda n, w=weights: build_blending_indices(w, n)["dataset_index"])
        splits[p["split"]] = (list(zip(p["specs"], p["params"])), weights, prefix)
    return run_warnings(config, datasets, splits,
                        lambda schedule, cyclic: planned_phase_warnings(config, datasets, schedule, cyclic))


def _normalized(weights: list | None, lengths: list[int]) -> list[float]:
    w = np.asarray(lengths if weights is None else weights, dtype=np.float64)
    return (w / w.sum()).tolist() if w.sum() > 0 else w.tolist()


def say(lines: list[str]) -> list[str]:
    """The warnings on stderr, as `mmfs: warning: ...` lines."""
    for line in lines:
        print(f"mmfs: warning: {line}", file=sys.stderr)
    return lines
