"""What each phase of a run drew: the facts mmfs.json's `phases` section and
`mmfs phases` give (per phase: where it starts, each dataset's weight, draws,
realised share, position, what is left, and samples served again)."""

from __future__ import annotations

from typing import Any


def describe_phases(split: Any) -> dict[str, Any]:
    """split: a PhasedSplit (megatron/phasebuild.py)."""
    phases = split.phases
    positions = split.positions
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
            "datasets": rows,
        })
    return {"phase_mode": phases.mode, "phases": out}


def served_before(reader: Any) -> list[int]:
    """Per phase, how many of its samples hold exactly the tokens of a sample served
    earlier in the run (the same dataset file, the same pieces of its sequences):
    under restart, what a relaunched phase trains on again; under continue, only a
    used-up dataset's next pass. reader: the train SplitReader of a phased run.
    Walks every sample: a report's job, not a mount's."""
    seen: set = set()
    out = []
    for s in reader.indices.slices:
        again = 0
        for i in range(s.start, s.end):
            gpt, k = reader.locate(i)
            key = (gpt.gpt.spec.file, tuple(gpt.pieces(k)))
            again += key in seen
            seen.add(key)
        out.append(again)
    return out
