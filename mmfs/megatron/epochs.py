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

A run in phases: its train lines are each phase's (mmfs/megatron/phases/epochs.py);
under restart its valid and test lines each phase's own, as its relaunch reads them
(phases/eval_epochs.py), else the top level's splits, said as here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from mmfs.megatron.epoch_lines import EXACT_UP_TO, MEGATRON_GOES_ON, Member, reads_past, tokens_of, where
from mmfs.megatron.phases.epochs import corpus_phase_warnings, planned_phase_warnings
from mmfs.megatron.phases.eval_epochs import phase_eval_warnings


def split_warnings(split: str, run: int, members: list[Member], weights: list[float] | None,
                   blend_prefix: Callable[[int], np.ndarray] | None, schedule: Any, cyclic: bool) -> list[str]:
    """The lines of one split read for `run` samples (blend_prefix(n): the blend's first
    n dataset ids; None: one GPTDataset, the split itself)."""
    out = []
    for p in reads_past(0, run, members, weights, blend_prefix):
        m = p.member
        out.append(f"{split}: {m.name} is read past its documents {where(split, p.first, schedule, cyclic, p.about)}"
                   f": the run reads {'about ' if p.about or p.reach != run and run > EXACT_UP_TO else ''}"
                   f"{p.reach:,} of its samples, its documents hold {m.one_epoch:,} ({m.epochs(p.reach):.2f} epochs). "
                   f"{MEGATRON_GOES_ON}")
    return out


def run_warnings(config: Any, datasets: dict, splits: dict[str, tuple[list, list | None, Any]],
                 phased: Callable[[Any, bool], list[str]] | None = None,
                 phase_evals: Callable[[bool], list[str] | None] | None = None) -> list[str]:
    """The lines of every split: splits[name] = ([(spec, params)], weights or None,
    blend_prefix or None); datasets: {spec.file: opened dataset}; phased(schedule,
    cyclic): the train lines of a run in phases (mmfs/megatron/phases/epochs.py);
    phase_evals(cyclic): under restart, each phase's own valid and test lines
    (phases/eval_epochs.py), said instead of the top level's, which no launch reads
    as one run (None: the top level's are said)."""
    training = config.training
    cyclic = training is not None and training.dataloader_type == "cyclic"
    out = []
    if config.phases is not None and phased is not None:
        out += phased(None if training is None else training.split_schedule("train"), cyclic)
    evals = phase_evals(cyclic) if config.phases is not None and phase_evals is not None else None
    for split, (gpts, weights, prefix) in splits.items():
        if split == "train" and config.phases is not None or split != "train" and evals is not None:
            continue
        run = config.samples.get(split)
        if not run or not gpts:
            continue
        schedule = None if training is None else training.split_schedule(split)
        out += split_warnings(split, run, _members(datasets, gpts), weights, prefix, schedule, cyclic)
    return out + (evals or [])


def _members(datasets: dict, gpts: list) -> list[Member]:
    """The Members of a split's [(spec, params)]."""
    return [Member(spec.name, tokens_of(datasets[spec.file], p.beg, p.end), p.sequence_length,
                   int(p.add_extra_token)) for spec, p in gpts]


def corpus_warnings(corpus: Any) -> list[str]:
    """run_warnings of an opened corpus (its blends read from their built indices)."""
    from mmfs.megatron.corpus import phase_evals

    splits = {name: _built_split(indices) for name, indices in corpus.indices.items()
              if len(indices) > 0 and not (name == "train" and corpus.config.phases is not None)}
    by_name = {e.name: e.dataset for e in corpus.datasets}
    datasets = {s.file: by_name[s.name] for s in corpus.config.all_datasets}

    def phased(schedule: Any, cyclic: bool) -> list[str]:
        gpts = corpus.indices["train"].gpts
        members = _members(datasets, [(g.spec, g.params) for g in gpts])
        return corpus_phase_warnings(corpus, members, schedule, cyclic)

    def own(k: int) -> dict:
        built = {name: _built_split(s) for name, s in phase_evals(corpus.indices)[k].items() if len(s) > 0}
        return {name: (_members(datasets, gpts), weights, prefix) for name, (gpts, weights, prefix) in built.items()}

    return run_warnings(corpus.config, datasets, splits, phased,
                        lambda cyclic: phase_eval_warnings(corpus.config, own, cyclic))


def _built_split(indices: Any) -> tuple[list, list | None, Any]:
    """A built split as run_warnings takes it: its blend read from its dataset_index."""
    blend = indices.blend
    prefix = None if blend is None else (lambda n, b=blend: np.asarray(b.dataset_index[:n]))
    weights = None if blend is None else _normalized(blend.weights, [len(g) for g in indices.gpts])
    return [(g.spec, g.params) for g in indices.gpts], weights, prefix


def planned_warnings(config: Any, datasets: dict) -> list[str]:
    """run_warnings of a config before anything is built (`mmfs config`): its splits as
    the builder plans them, each blend's order computed (up to EXACT_UP_TO samples);
    under restart each phase's own valid and test too, planned as its relaunch builds them."""
    from mmfs.config.schema import SPLITS
    from mmfs.megatron.build.builder import Builder
    from mmfs.megatron.indices.splits import split_matrix
    from mmfs.megatron.phases.evals import EVAL_SPLITS

    builder = Builder(config, datasets)
    wanted = ("valid", "test") if config.phases is not None else ("train", "valid", "test")
    splits = _planned_splits(builder.plan_splits(wanted))

    def own(k: int) -> dict:
        p = config.phases.phases[k]
        matrix = split_matrix(config.split)
        bookends = {s: matrix[SPLITS.index(s)] for s in EVAL_SPLITS}
        plans = builder._plan_blend(p.blend.datasets, None if p.bare else p.blend.weights, bookends,
                                    f"{p.key}.datasets", per_split=False)
        return {name: (_members(datasets, gpts), weights, prefix)
                for name, (gpts, weights, prefix) in _planned_splits(plans).items()}

    return run_warnings(config, datasets, splits,
                        lambda schedule, cyclic: planned_phase_warnings(config, datasets, schedule, cyclic),
                        lambda cyclic: phase_eval_warnings(config, own, cyclic))


def _planned_splits(plans: list[dict]) -> dict[str, tuple[list, list | None, Any]]:
    from mmfs.megatron.indices.blend import build_blending_indices

    splits = {}
    for p in plans:
        if p.get("by_length"):
            continue  # weighted by the GPTDatasets' lengths: known once built (`mmfs build` says it)
        weights = p.get("weights") if p.get("blend_task") else None
        prefix = None if weights is None else (lambda n, w=weights: build_blending_indices(w, n)["dataset_index"])
        splits[p["split"]] = (list(zip(p["specs"], p["params"])), weights, prefix)
    return splits


def _normalized(weights: list | None, lengths: list[int]) -> list[float]:
    w = np.asarray(lengths if weights is None else weights, dtype=np.float64)
    return (w / w.sum()).tolist() if w.sum() > 0 else w.tolist()


def say(lines: list[str]) -> list[str]:
    """The warnings on stderr, as `mmfs: warning: ...` lines."""
    for line in lines:
        print(f"mmfs: warning: {line}", file=sys.stderr)
    return lines
