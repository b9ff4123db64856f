"""A run in phases against megatron-core 0.19.2 (tests/reference/record_phases.py):
restart phases are stock BlendedDatasets relaunched per phase; continue's first
phase is the stock blend sized to the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from phase_helpers import (
    DATA,
    reference_continue,
    served,
)

from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phases.facts import describe_phases

# -- against megatron-core 0.19.2 (tests/reference/record_phases.py) -------------------

REFERENCE = json.loads((Path(__file__).resolve().parent / "reference" / "phases.json").read_text())["cases"]


def reference_config(tmp_path: Path, name: str, mode: str) -> str:
    case = REFERENCE[name]
    link = tmp_path / "data"
    if not link.exists():
        link.symlink_to(DATA, target_is_directory=True)
    phases = []
    gbs, sequence_length = case["training"]["global_batch_size"], case["sequence_length"]
    start_as = case.get("start_as") or ["start_iteration"] * len(case["phases"])
    for k, ((start, blend), how) in enumerate(zip(case["phases"], start_as)):
        # a bare prefix: one dataset without a weight (Megatron's bare GPTDataset)
        entry = {"data_path": [blend]} if isinstance(blend, str) else \
            {"datasets": [{"path": p, "weight": w} for p, w in blend.items()]}
        at = {"start_iteration": start, "start_samples": start * gbs, "start_tokens": start * gbs * sequence_length}
        phases.append(entry if k == 0 else {how: at[how], **entry})
    training = {"data_parallel_size": 1, "micro_batch_size": 2 if gbs % 4 else 4, **case["training"]}
    config = {"phases": phases, "phase_mode": mode, "split": case["split"], "seed": case["seed"],
              "sequence_length": case["sequence_length"], "tokenizer": {"eod": 0},
              "cache_dir": str(tmp_path / "cache"), "training": training}
    path = tmp_path / f"{name}-{mode}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def digests(reader, start: int, end: int) -> list[str]:
    import hashlib

    return [hashlib.sha256(np.frombuffer(reader.read(i), dtype=reader.dtype).astype(np.int64).tobytes())
            .hexdigest()[:16] for i in range(start, end)]


@pytest.mark.parametrize("name", [n for n in REFERENCE if "restart" in REFERENCE[n]])
def test_restart_is_megatron_relaunched_per_phase(tmp_path, name):
    case = REFERENCE[name]
    corpus = open_corpus(reference_config(tmp_path, name, "restart"), progress=False)
    train = corpus.indices["train"]
    assert len(train.slices) == len(case["restart"])
    for s, expected in zip(train.slices, case["restart"]):
        assert digests(corpus.splits["train"], s.start, s.end) == expected
    for split in ("valid", "test"):  # not phased: the first phase's arguments
        assert digests(corpus.splits[split], 0, len(case[split])) == case[split]
    # repeats across relaunches, counted fast, agree with the sample-by-sample walk (and with the digests)
    again = served(corpus.splits["train"])
    seen: set = set()
    by_digest = []
    for phase in case["restart"]:  # served before in the run: within a multi-epoch phase too
        count = 0
        for d in phase:
            count += d in seen
            seen.add(d)
        by_digest.append(count)
    assert again == by_digest
    # a bare prefix is said to be Megatron's GPTDataset, a weighted one a BlendedDataset
    facts = describe_phases(train)["phases"]
    assert [f["megatron_dataset"] for f in facts] == \
        ["GPTDataset" if isinstance(blend, str) else "BlendedDataset" for _, blend in case["phases"]]


@pytest.mark.parametrize("name", list(REFERENCE))
def test_continue_first_phase_is_megatron(tmp_path, name):
    case = REFERENCE[name]
    corpus = open_corpus(reference_config(tmp_path, name, "continue"), progress=False)
    train = corpus.indices["train"]
    first = case.get("continue_first_phase") or case["first_phase_full"][:train.slices[1].start]
    assert train.slices[1].start == len(first)
    assert digests(corpus.splits["train"], 0, len(first)) == first
    for split in ("valid", "test") if "valid" in case else ():
        assert digests(corpus.splits[split], 0, len(case[split])) == case[split]
    # and the later phases follow the rule, from where each dataset stood
    expected = reference_continue(train.slices, [len(g) for g in train.gpts])
    assert list(zip(train.blend.dataset_index.tolist(), train.blend.dataset_sample_index.tolist())) == expected


@pytest.mark.parametrize("how", ["start_iteration", "start_samples", "start_tokens"])
def test_rampup_boundary_given_three_ways(tmp_path, how):
    """Megatron's ramp-up 4 by 4 over 96 samples to 16: batch 4 for samples 0-32 (8 iterations),
    then 8 (4 iterations): 12 iterations end at sample 64, where the second phase starts, as
    iterations, samples or tokens (64 x 32)."""
    path = reference_config(tmp_path, "rampup_continue", "continue")
    config = yaml.safe_load(Path(path).read_text())
    del config["phases"][1]["start_iteration"]
    config["phases"][1][how] = {"start_iteration": 12, "start_samples": 64, "start_tokens": 64 * 32}[how]
    Path(path).write_text(yaml.safe_dump(config))
    corpus = open_corpus(path, progress=False)
    train = corpus.indices["train"]
    assert train.slices[1].start == 64
    assert digests(corpus.splits["train"], 0, 64) == REFERENCE["rampup_continue"]["first_phase_full"][:64]
