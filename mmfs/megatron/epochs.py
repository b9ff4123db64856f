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
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MEGATRON_GOES_ON = ("Megatron goes on: its GPTDataset builds as many epochs of the documents as the samples asked "
                    "need, and the model sees them again")
EXACT_UP_TO = 16_000_000  # blend positions read (or computed) exactly, at most


@dataclass(frozen=True)
class Member:
    """One GPTDataset of a split: its name and what one epoch of it holds."""

    name: str
    tokens: int  # tokens of its documents in the split
    sequence_length: int
    extra: int  # the extra token of each sample (0 or 1)

    @property
    def one_epoch(self) -> int:
        return max(0, (self.tokens - self.extra) // self.sequence_length)

    def epochs(self, samples: int) -> float:
        """The passes over its documents that `samples` samples read (by tokens)."""
        return (samples * self.sequence_length + self.extra) / max(1, self.tokens)


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
        out.append(f"{split}: {m.name} is read past its documents {_where(split, first, schedule, cyclic, about)}"
                   f": the run reads {'about ' if about or taken != run and run > EXACT_UP_TO else ''}"
                   f"{taken:,} of its samples, its documents hold {epoch:,} ({m.epochs(taken):.2f} epochs). "
                   f"{MEGATRON_GOES_ON}")
    return out


def _where(split: str, position: int, schedule: Any, cyclic: bool, about: bool) -> str:
    near = "about " if about else ""
    if schedule is None:
        return f"at {near}sample {position:,} of the {split} split"
    iteration, _ = schedule.iteration_at(position)
    what = "iteration" if split == "train" else "evaluation step"
    shuffled = " (in the split's order; the cyclic sampler reads it shuffled)" if cyclic and split == "train" else ""
    return f"at {what} {near}{iteration:,} (sample {position:,}){shuffled}"


def _tokens(dataset: Any, beg: int, end: int) -> int:
    read = getattr(dataset, "read_sequence_lengths", None)
    lengths = read() if read else dataset.sequence_lengths
    return int(np.asarray(lengths[beg:end]).sum(dtype=np.int64))


def run_warnings(config: Any, datasets: dict, splits: dict[str, tuple[list, list | None, Any]]) -> list[str]:
    """The lines of every split: splits[name] = ([(spec, params)], weights or None,
    blend_prefix or None); datasets: {spec.file: opened dataset}."""
    if config.phases is not None:
        return []  # a run in phases: each phase's own datasets (`mmfs report` counts their epochs)
    training = config.training
    cyclic = training is not None and training.dataloader_type == "cyclic"
    out = []
    for split, (gpts, weights, prefix) in splits.items():
        run = config.samples.get(split)
        if not run or not gpts:
            continue
        members = [Member(spec.name, _tokens(datasets[spec.file], p.beg, p.end), p.sequence_length,
                          int(p.add_extra_token)) for spec, p in gpts]
        schedule = None if training is None else training.split_schedule(split)
        out += split_warnings(split, run, members, weights, prefix, schedule, cyclic)
    return out


def corpus_warnings(corpus: Any) -> list[str]:
    """run_warnings of an opened corpus (its blends read from their built indices)."""
    splits = {}
    for name, indices in corpus.indices.items():
        if len(indices) == 0:
            continue
        blend = indices.blend
        prefix = None if blend is None else (lambda n, b=blend: np.asarray(b.dataset_index[:n]))
        weights = None if blend is None else _normalized(blend.weights, [len(g) for g in indices.gpts])
        splits[name] = ([(g.spec, g.params) for g in indices.gpts], weights, prefix)
    by_name = {e.name: e.dataset for e in corpus.datasets}
    return run_warnings(corpus.config, {s.file: by_name[s.name] for s in corpus.config.all_datasets}, splits)


def planned_warnings(config: Any, datasets: dict) -> list[str]:
    """run_warnings of a config before anything is built (`mmfs config`): its splits as
    the builder plans them, each blend's order computed (up to EXACT_UP_TO samples)."""
    from mmfs.megatron.build.builder import Builder
    from mmfs.megatron.indices.blend import build_blending_indices

    splits = {}
    for p in Builder(config, datasets).plan_splits():
        if p.get("by_length"):
            continue  # weighted by the GPTDatasets' lengths: known once built (`mmfs build` says it)
        weights = p.get("weights") if p.get("blend_task") else None
        prefix = None if weights is None else (lambda n, w=weights: build_blending_indices(w, n)["dataset_index"])
        splits[p["split"]] = (list(zip(p["specs"], p["params"])), weights, prefix)
    return run_warnings(config, datasets, splits)


def _normalized(weights: list | None, lengths: list[int]) -> list[float]:
    w = np.asarray(lengths if weights is None else weights, dtype=np.float64)
    return (w / w.sum()).tolist() if w.sum() > 0 else w.tolist()


def say(lines: list[str]) -> list[str]:
    """The warnings on stderr, as `mmfs: warning: ...` lines."""
    for line in lines:
        print(f"mmfs: warning: {line}", file=sys.stderr)
    return lines
