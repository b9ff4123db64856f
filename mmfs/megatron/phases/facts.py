"""What each phase of a run drew: the facts mmfs.json's `phases` section and
`mmfs phases` give (per phase: where it starts, each dataset's weight, draws,
realised share, position, what is left, and samples served again; under restart
its own valid and test and the evaluations its launch runs on them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mmfs.megatron.phases.evaluations import EvalSchedule, test_launches, valid_launches
from mmfs.megatron.phases.sampling import sampler_facts


def describe_phases(split: Any, schedule: EvalSchedule | None = None) -> dict[str, Any]:
    """split: a PhasedSplit (megatron/phases/build.py); schedule: the run's
    evaluations (evaluations.eval_schedule), which say what each restart launch
    evaluates."""
    phases = split.phases
    positions = split.positions
    evals = describe_evals(split, schedule)
    sampled = sampler_facts(split)
    out = []
    for k, (p, s) in enumerate(zip(phases.phases, split.slices)):
        rows = []
        for spec, g, w in zip(p.blend.datasets, s.members, s.weights):
            gpt = split.gpts[g]
            before = 0 if phases.mode == "restart" else int(positions[k, g])
            draws = int(split.draws[k, g])
            after = before + draws
            rows.append({
                "name": spec.name,
                "weight": spec.weight,
                "normalized_weight": w,
                "draws": draws,
                "share": draws / s.size if s.size else 0.0,
                "position_before": before,
                "position_after": after,
                "gpt_samples": len(gpt),
                "left": max(0, len(gpt) - after),
                "passes": after / len(gpt) if len(gpt) else 0.0,
            })
        out.append({
            "phase": k,
            "start_iteration": p.start_iteration,
            "start_sample": s.start,
            "end_sample": s.end,
            "samples": s.size,
            # what Megatron builds for the phase's arguments: a bare prefix is the GPTDataset itself
            "megatron_dataset": "GPTDataset" if p.bare else "BlendedDataset",
            **sampled[k],  # what its cyclic sampler draws from, and the ids of those past `samples`
            "datasets": rows,
            **({"splits": evals[k]} if evals else {}),
        })
    return {"phase_mode": phases.mode, "phases": out}


def describe_evals(split: Any, schedule: EvalSchedule | None) -> list[dict[str, Any]]:
    """Under restart, per phase {valid, test: its own split's samples, top-level
    dataset, each dataset's draws and share, and the evaluations its launch runs
    on it (None when the schedule is not known)}; [] under continue."""
    if not split.evals:
        return []
    starts = [p.start_iteration for p in split.phases.phases]
    launches = {}
    if schedule is not None and None not in starts:
        launches = {"valid": valid_launches(schedule, starts), "test": test_launches(schedule, len(starts))}
    out = []
    for k, own in enumerate(split.evals):
        out.append({name: {**_eval_split(s), "evaluations": launches[name][k].as_dict() if launches else None}
                    for name, s in own.items() if len(s) > 0})
    return out


def _eval_split(s: Any) -> dict[str, Any]:
    if s.blend is None:
        draws = [len(s)]
    else:
        draws = np.bincount(np.asarray(s.blend.dataset_index), minlength=len(s.gpts)).tolist()
    return {"samples": len(s), "top_level": "GPTDataset" if s.blend is None else "BlendedDataset",
            "datasets": [{"name": g.spec.name, "draws": int(n), "share": n / len(s) if len(s) else 0.0}
                         for g, n in zip(s.gpts, draws)]}


def served_before(reader: Any) -> list[int]:
    """Per phase, how many of its samples hold the tokens of a sample served earlier
    in the run (the same dataset file, the same token range of its sequences): under
    restart, what a relaunched phase trains on again; under continue, only a used-up
    dataset's next pass. reader: the train SplitReader of a phased run.

    A sample is known by its dataset file, its first and last sequence and the
    offsets in them, the number of sequences it spans and a sum of random 64-bit
    tags of those sequences (two GPTDatasets of one file order their sequences
    differently, so sample ids cannot be compared); the whole key is hashed to 64
    bits, vectorised over the run (a collision among n samples has odds about
    n^2 / 2^65)."""
    split = reader.indices
    dataset_index = np.asarray(split.blend.dataset_index)
    dataset_sample_index = np.asarray(split.blend.dataset_sample_index)
    keys = np.empty(len(dataset_index), dtype=np.uint64)
    files = {}
    tags: dict[str, np.ndarray] = {}
    order = np.argsort(dataset_index, kind="stable")  # the run's samples, grouped by GPTDataset
    bounds = np.zeros(len(split.gpts) + 1, dtype=np.int64)
    np.cumsum(np.bincount(dataset_index, minlength=len(split.gpts)), out=bounds[1:])
    with np.errstate(over="ignore"):
        for g, gpt in enumerate(split.gpts):
            mask = order[bounds[g]:bounds[g + 1]]
            if not len(mask):
                continue
            file = gpt.spec.file
            file_id = files.setdefault(file, len(files))
            doc_index = _mapped(gpt, "document_index")
            if file not in tags:  # one random tag per sequence id of the file
                size = int(doc_index.max()) + 1 if len(doc_index) else 0
                tags[file] = np.random.default_rng(file_id).integers(0, 2**63, size, dtype=np.uint64)
            prefix = np.zeros(len(doc_index) + 1, dtype=np.uint64)
            np.cumsum(tags[file][doc_index], out=prefix[1:])
            u = _mapped(gpt, "shuffle_index")[dataset_sample_index[mask]].astype(np.int64)
            sample_index = _mapped(gpt, "sample_index")
            start, end = sample_index[u].astype(np.int64), sample_index[u + 1].astype(np.int64)
            parts = [np.full(len(u), file_id, dtype=np.uint64), doc_index[start[:, 0]].astype(np.uint64),
                     start[:, 1].astype(np.uint64), doc_index[end[:, 0]].astype(np.uint64),
                     end[:, 1].astype(np.uint64), (end[:, 0] - start[:, 0]).astype(np.uint64),
                     prefix[end[:, 0] + 1] - prefix[start[:, 0]]]
            key = np.zeros(len(u), dtype=np.uint64)
            for part in parts:  # FNV-style mixing of the parts
                key = (key ^ part) * np.uint64(0x100000001B3) + np.uint64(0x9E3779B97F4A7C15)
            keys[mask] = key
    _, first = np.unique(keys, return_index=True)
    repeated = np.ones(len(keys), dtype=bool)
    repeated[first] = False  # the first time each key is served
    return [int(repeated[s.start:s.end].sum()) for s in split.slices]


def _mapped(gpt: Any, name: str) -> np.ndarray:
    """A GPTDataset's array, mapped for this use only (a run of thousands of
    GPTDatasets would otherwise hold a file descriptor per mapped array)."""
    array = gpt.raw(name)
    return array.map() if hasattr(array, "map") else np.asarray(array)
