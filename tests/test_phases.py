"""A run in phases (issue 27, docs/phases.md): the run's blend under both phase
modes, checked against stock builds (which the golden tests hold to
megatron-core), a slow sample-by-sample reference of the continue rule,
properties over random phase lists, a real mount across a boundary, `mmfs phases`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from phase_helpers import (
    THREE_PHASES,
    TWO_PHASES,
    ds,
    reference_continue,
    samples,
    served,
    write,
)

from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phases.plan import PhaseSlice, continue_blend, megatron_weights, wrap
from mmfs.mount.contract import XATTR_DATASET, XATTR_PHASE, XATTR_SAMPLES

# -- continue ---------------------------------------------------------------------


def test_continue_first_phase_is_the_stock_blend_sized_to_the_run(tmp_path):
    run = open_corpus(write(tmp_path, phases=THREE_PHASES), progress=False)
    stock = open_corpus(write(tmp_path, "stock.yaml", datasets=THREE_PHASES[0]["datasets"]), progress=False)
    assert run.indices["train"].slices[1].start == 80  # iteration 10 x 8
    assert samples(run.splits["train"], 0, 80) == samples(stock.splits["train"], 0, 80)
    for split in ("valid", "test"):  # not phased
        assert samples(run.splits[split], 0, len(stock.splits[split])) == \
            samples(stock.splits[split], 0, len(stock.splits[split]))

def test_continue_later_phases_follow_the_reference_rule(tmp_path):
    run = open_corpus(write(tmp_path, phases=THREE_PHASES), progress=False)
    train = run.indices["train"]
    expected = reference_continue(train.slices, [len(g) for g in train.gpts])
    got = list(zip(train.blend.dataset_index.tolist(), train.blend.dataset_sample_index.tolist()))
    assert got == expected
    # each dataset goes on from where it stood: u16_docs's samples in phase 1 follow phase 0's
    docs = [k for g, k in got if train.gpts[g].spec.name == "u16_docs"]
    assert docs == list(range(len(docs)))
    assert served(run.splits["train"]) == [0, 0, 0]


def test_a_used_up_dataset_starts_its_next_pass(tmp_path):
    """u16_small, sized by Megatron for 5 % of the run, at 4096 tokens a sample
    holds fewer samples than phase 1 draws from it."""
    phases = [{"datasets": [ds("u16_docs", 0.95), ds("u16_small", 0.05)]},
              {"start_iteration": 2, "datasets": [ds("u16_small", 1.0)]}]
    path = write(tmp_path, phases=phases, sequence_length=4096)
    run = open_corpus(path, progress=False)
    train = run.indices["train"]
    small = train.gpts[1]
    n = len(small)
    assert train.draws[1, 1] > n  # used up within the phase
    before = int(train.positions[1, 1])
    ids = train.blend.dataset_sample_index[16:].tolist()
    first = n - before
    assert ids == [(before + j) % n for j in range(len(ids))]  # on past its last sample: from its first
    again = open_corpus(path, progress=False).indices["train"]  # the next pass is cached too
    assert again.blend.from_cache and np.array_equal(again.blend.dataset_sample_index,
                                                     train.blend.dataset_sample_index)
    assert served(run.splits["train"]) == [0, len(ids) - first]


@st.composite
def phase_lists(draw):
    datasets = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, 300), min_size=datasets, max_size=datasets))
    count = draw(st.integers(1, 4))
    cuts = sorted(draw(st.sets(st.integers(1, 599), min_size=count - 1, max_size=count - 1)))
    bounds = [0, *cuts, 600]
    slices = []
    for start, end in zip(bounds, bounds[1:]):
        members = draw(st.lists(st.integers(0, datasets - 1), min_size=1, max_size=datasets, unique=True))
        weights = draw(st.lists(st.floats(0.01, 10), min_size=len(members), max_size=len(members)))
        slices.append(PhaseSlice(start, end, tuple(members), tuple(megatron_weights(weights))))
    return slices, lengths


@settings(max_examples=150, deadline=None)
@given(phase_lists())
def test_continue_properties(case):
    slices, lengths = case
    run = continue_blend(slices, len(lengths))
    positions = wrap(run.dataset_index, run.dataset_sample_index, lengths)
    pairs = list(zip(run.dataset_index.tolist(), positions.tolist()))
    assert pairs == reference_continue(slices, lengths)
    # no (dataset, sample) pair twice before that dataset's used up
    seen: dict[int, set] = {}
    passes = dict.fromkeys(range(len(lengths)), 0)
    for g, k in pairs:
        if len(seen.setdefault(g, set())) == lengths[g]:
            seen[g] = set()
            passes[g] += 1
        assert k not in seen[g]
        seen[g].add(k)
    # realised shares within the greedy's error of each phase's weights
    for s, drawn in zip(slices, run.draws):
        for g, w in zip(s.members, s.weights):
            assert abs(drawn[g] - w * s.size) <= len(s.members), (drawn[g], w * s.size)
    # append-only: a different last phase (or none) changes nothing before it
    if len(slices) > 1:
        shorter = continue_blend(slices[:-1], len(lengths))
        start = slices[-1].start
        assert np.array_equal(shorter.dataset_index, run.dataset_index[:start])
        assert np.array_equal(shorter.dataset_sample_index, run.dataset_sample_index[:start])
        last = slices[-1]
        changed = PhaseSlice(last.start, last.end, last.members[::-1], last.weights)
        other = continue_blend([*slices[:-1], changed], len(lengths))
        assert np.array_equal(other.dataset_sample_index[:start], run.dataset_sample_index[:start])
    # positions are closed-form sums of earlier draws
    assert np.array_equal(run.positions[-1], np.bincount(run.dataset_index, minlength=len(lengths)))


def test_append_only_on_real_datasets(tmp_path):
    two = open_corpus(write(tmp_path, "two.yaml", phases=TWO_PHASES), progress=False)
    three = open_corpus(write(tmp_path, "three.yaml", phases=THREE_PHASES), progress=False)
    start = three.indices["train"].slices[2].start
    assert samples(two.splits["train"], 0, start) == samples(three.splits["train"], 0, start)


# -- restart --------------------------------------------------------------------------


def test_restart_phases_are_stock_blends_sized_to_each_phase(tmp_path):
    run = open_corpus(write(tmp_path, phases=THREE_PHASES, phase_mode="restart"), progress=False)
    train = run.indices["train"]
    for k, s in enumerate(train.slices):
        stock_path = write(tmp_path, f"stock{k}.yaml", datasets=THREE_PHASES[k]["datasets"],
                           samples={"train": s.size, "valid": 64, "test": 16}, training=None)
        stock = open_corpus(stock_path, progress=False)
        assert samples(run.splits["train"], s.start, s.end) == samples(stock.splits["train"], 0, s.size), k
    again = served(run.splits["train"])
    assert again[0] == 0 and again[1] > 0  # a relaunched phase re-reads what phase 0 read

# -- the mount --------------------------------------------------------------------


def test_mount_serves_the_phased_run(tmp_path):
    from mount_fixtures import mounted

    path = write(tmp_path, phases=TWO_PHASES)
    run = open_corpus(path, progress=False)
    (tmp_path / "mnt").mkdir()
    with mounted(path, tmp_path / "mnt") as m:
        info = json.loads((m.path / "mmfs.json").read_text())
        phases = info["phases"]
        assert phases["phase_mode"] == "continue"
        assert [(p["start_iteration"], p["start_sample"], p["end_sample"]) for p in phases["phases"]] == \
            [(0, 0, 80), (10, 80, 240)]
        second = {d["name"]: d for d in phases["phases"][1]["datasets"]}
        first = {d["name"]: d for d in phases["phases"][0]["datasets"]}
        assert second["u16_docs"]["position_before"] == first["u16_docs"]["draws"]
        assert second["u16_small"]["position_before"] == 0
        for i in (78, 79, 80, 81):
            f = m.path / "train" / "samples" / f"{i:07d}.bin"
            assert f.read_bytes() == run.splits["train"].read(i)
            assert os.getxattr(f, XATTR_PHASE).decode() == str(int(i >= 80))
            assert os.getxattr(f, XATTR_DATASET).decode() == run.splits["train"].provenance(i)[0]
        valid = m.path / "valid" / "samples" / "0000000.bin"
        assert XATTR_PHASE not in os.listxattr(valid)
        # a rank's micro-batches read the same run: rank 1's micro-batches around the boundary
        ranks = m.path / "train" / "ranks" / "001"
        seen = []
        for j in (18, 19, 20, 21):  # iterations 10 and 11: two micro-batches of rank 1 each
            f = ranks / f"{j:07d}.bin"
            ids = [int(x) for x in os.getxattr(f, XATTR_SAMPLES).split()]
            assert f.read_bytes() == b"".join(run.splits["train"].read(i) for i in ids)
            seen += ids
        assert min(seen) < 80 <= max(seen)

# -- mmfs phases ------------------------------------------------------------------


def test_phases_command(tmp_path):
    from mount_fixtures import mmfs

    path = write(tmp_path, phases=THREE_PHASES, phase_mode="restart")
    out = mmfs("phases", path, "--json", "-q")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["phase_mode"] == "restart"
    first, second, third = report["phases"]
    # single-epoch datasets under one seed: a relaunched phase re-reads each dataset from its first
    # sample, so it repeats min(its draws, the first phase's) of each dataset they share
    drawn = {d["name"]: d["draws"] for d in first["datasets"]}
    again = sum(min(d["draws"], drawn.get(d["name"], 0)) for d in second["datasets"])
    assert (first["served_before"], second["served_before"]) == (0, again) and again > 0
    assert third["start_iteration"] == 22 and third["start_sample"] == 176 and third["end_sample"] == 240
    for p in report["phases"]:
        assert sum(d["draws"] for d in p["datasets"]) == p["samples"]
        for d in p["datasets"]:
            assert d["position_after"] - d["position_before"] == d["draws"]
            assert d["left"] == d["gpt_samples"] - d["position_after"]
            assert abs(d["share"] - d["normalized_weight"]) * p["samples"] <= len(p["datasets"])
    text = mmfs("phases", path, "-q")
    assert text.returncode == 0 and "phase 1: from iteration 11, sample 80 to 176" in text.stdout
    plain = write(tmp_path, "plain.yaml", datasets=TWO_PHASES[0]["datasets"])
    missing = mmfs("phases", plain)
    assert missing.returncode == 2 and missing.stderr.strip().endswith("see docs/phases.md)")
    assert "phases: missing" in missing.stderr and missing.stderr.count("\n") == 1


def test_a_text_dataset_in_phases_is_tokenized_once(tmp_path):
    """A .jsonl dataset named in two phases: one tokenization, one GPTDataset going on."""
    golden = Path(__file__).resolve().parent / "golden" / "preprocess"
    (tmp_path / "corpus.jsonl").write_bytes((golden / "corpus.jsonl").read_bytes())
    tokenizer = {"type": "HuggingFaceTokenizer", "model": str(golden / "hf_tokenizer")}
    phases = [{"datasets": [{"path": "corpus.jsonl", "weight": 1.0}]},
              {"start_iteration": 5, "datasets": [{"path": "corpus.jsonl", "weight": 0.5}, ds("u16_docs", 0.5)]}]
    path = write(tmp_path, phases=phases, tokenizer=tokenizer, sequence_length=128, split="90,5,5",
                 samples={"train": 80, "valid": 8, "test": 8},
                 training={"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8})
    train = open_corpus(path, progress=False).indices["train"]
    assert [g.spec.name for g in train.gpts] == ["corpus", "u16_docs"]
    assert len(list((tmp_path / "cache" / "text").glob("*_document.idx"))) == 1
    assert train.positions[1, 0] == 40 and train.draws[1, 0] == 20  # goes on from where phase 0 left it
