"""Helpers of the phase tests (tests/test_phases*.py): configs over the golden
datasets, a slow sample-by-sample reference of the continue rule, and repeats
counted by walking every sample."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import yaml

from mmfs.megatron.phases.facts import served_before
from mmfs.megatron.phases.plan import PhaseSlice

DATA = Path(__file__).resolve().parent / "golden" / "data"
TRAINING = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8, "train_iters": 30,
            "eval_interval": 10, "eval_iters": 2}


def ds(name: str, weight: float) -> dict:
    return {"path": str(DATA / name), "weight": weight}


def write(tmp_path: Path, name: str = "run.yaml", **keys) -> str:
    config = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0},
              "cache_dir": str(tmp_path / "cache"), "training": dict(TRAINING), **keys}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


TWO_PHASES = [
    {"datasets": [ds("u16_docs", 0.7), ds("u16_multiseq", 0.3)]},
    {"start_iteration": 10, "datasets": [ds("u16_docs", 0.2), ds("u16_multiseq", 0.3), ds("u16_small", 0.5)]},
]
THREE_PHASES = TWO_PHASES + [{"start_iteration": 22, "datasets": [ds("u16_small", 1.0), ds("u16_docs", 3.0)]}]


def slow_served_before(reader) -> list[int]:
    """served_before, walking sample by sample: a sample repeats when its dataset file
    and its pieces (sequence, offset, length) were served earlier in the run."""
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


def served(reader) -> list[int]:
    fast = served_before(reader)
    assert fast == slow_served_before(reader)
    return fast


def samples(reader, start: int, end: int) -> list[bytes]:
    return [reader.read(i) for i in range(start, end)]


def reference_continue(slices: list[PhaseSlice], lengths: list[int]) -> list[tuple[int, int]]:
    """The continue rule, sample by sample, in plain Python: within a phase, the
    first dataset maximising weight × max(i, 1) − drawn-in-phase; it serves its
    next sample (wrapping after its last)."""
    position = [0] * len(lengths)
    out = []
    for s in slices:
        drawn = [0] * len(s.members)
        for i in range(s.size):
            at = max(i, 1)
            errors = [w * at - c for w, c in zip(s.weights, drawn)]
            j = errors.index(max(errors))
            g = s.members[j]
            out.append((g, position[g] % lengths[g]))
            drawn[j] += 1
            position[g] += 1
    return out


def recorded_config(folder: Path, name: str, case: dict, mode: str, training: dict | None = None) -> str:
    """The config of a case recorded under tests/reference/ (its split, seed, sequence
    length, training block and phases: (start_iteration, {prefix: weight}) or
    (start_iteration, prefix) for one prefix without a weight), over the golden
    datasets; `training` overrides keys of the training block."""
    link = folder / "data"
    if not link.exists():
        link.symlink_to(DATA, target_is_directory=True)
    phases = []
    gbs, sequence_length = case["training"]["global_batch_size"], case["sequence_length"]
    start_as = case.get("start_as") or ["start_iteration"] * len(case["phases"])
    for k, ((start, blend), how) in enumerate(zip(case["phases"], start_as)):
        entry = {"data_path": [blend]} if isinstance(blend, str) else \
            {"datasets": [{"path": p, "weight": w} for p, w in blend.items()]}
        at = {"start_iteration": start, "start_samples": start * gbs, "start_tokens": start * gbs * sequence_length}
        phases.append(entry if k == 0 else {how: at[how], **entry})
    block = {"data_parallel_size": 1, "micro_batch_size": 2 if gbs % 4 else 4, **case["training"], **(training or {})}
    config = {"phases": phases, "phase_mode": mode, "split": case["split"], "seed": case["seed"],
              "sequence_length": sequence_length, "tokenizer": {"eod": 0},
              "cache_dir": str(folder / "cache"), "training": block}
    tag = "".join(f"-{k}{v}" for k, v in sorted((training or {}).items()))
    path = folder / f"{name}-{mode}{tag}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def sample_digests(reader, start: int, end: int) -> list[str]:
    """The recorders' digest of samples [start, end): sha256 of the tokens as int64, 16 hex digits."""
    return [hashlib.sha256(np.frombuffer(reader.read(i), dtype=reader.dtype).astype(np.int64).tobytes())
            .hexdigest()[:16] for i in range(start, end)]
