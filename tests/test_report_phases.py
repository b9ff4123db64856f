"""`mmfs report --json` of a run in phases (config `phases:`), under both phase
modes: one row per dataset across the run (a dataset added in a later phase
included), each phase's figures against mmfs.json's `phases` section and `mmfs
phases`, every count against the run's blend arrays counted here, the phase
bands of the mix, and the per-phase warnings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmfs.megatron import open_corpus
from mmfs.mount.manifest import manifest
from mmfs.tools.phases import phases_report
from mmfs.tools.report.command import figures

DATA = Path(__file__).resolve().parent / "golden" / "data"
NAMES = ["u16_docs", "u16_multiseq", "u16_small", "i32_docs"]  # in order of first use


def ds(name: str, weight: float) -> dict:
    return {"path": str(DATA / name), "weight": weight}


# u16_small is added in phase 1, u16_multiseq dropped in phase 2, where i32_docs is added with a
# weight of 0.06 of the phase's 64 samples (it rounds to none)
PHASES = [
    {"datasets": [ds("u16_docs", 0.7), ds("u16_multiseq", 0.3)]},
    {"start_iteration": 10, "datasets": [ds("u16_docs", 0.2), ds("u16_multiseq", 0.3), ds("u16_small", 0.5)]},
    {"start_iteration": 22, "datasets": [ds("u16_small", 1.0), ds("u16_docs", 3.0), ds("i32_docs", 0.004)]},
]
TRAINING = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8, "train_iters": 30,
            "eval_interval": 10, "eval_iters": 2}


def write(tmp_path: Path, mode: str) -> str:
    path = tmp_path / f"{mode}.yaml"
    path.write_text(yaml.safe_dump({
        "split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0}, "cache_dir": str(tmp_path / "cache"),
        "training": TRAINING, "phases": PHASES, "phase_mode": mode}))
    return str(path)


@pytest.fixture(scope="module", params=["continue", "restart"])
def run(request, tmp_path_factory):
    path = write(tmp_path_factory.mktemp(request.param), request.param)
    corpus = open_corpus(path, progress=False)
    return request.param, path, corpus, figures(corpus, browser=False)


def test_one_row_per_dataset_against_the_blend_arrays(run):
    mode, _, corpus, figs = run
    train = figs["splits"]["train"]
    indices = corpus.indices["train"]
    assert train["top_level"] == "phases" and train["run"]["samples"] == 240
    assert [r["dataset"] for r in train["datasets"]] == NAMES
    assert len(indices.gpts) == (4 if mode == "continue" else 8)  # restart: each phase's own GPTDatasets
    file_of = [NAMES.index(g.spec.name) for g in indices.gpts]
    dataset = np.asarray(file_of)[np.asarray(indices.blend.dataset_index)]
    sizes = [s.end - s.start for s in indices.slices]
    drawn = np.bincount(dataset, minlength=4)
    for d, row in enumerate(train["datasets"]):
        assert row["samples"] == drawn[d] and row["share"] == pytest.approx(drawn[d] / 240)
        assert row["samples_built"] == sum(len(g) for g, f in zip(indices.gpts, file_of) if f == d)
        assert row["epochs"] == pytest.approx(drawn[d] * 32 / row["tokens_available"])
        weight = sum(s.weights[s.members.index(g)] * n for s, n in zip(indices.slices, sizes)
                     for g in s.members if file_of[g] == d) / 240
        assert row["weight"] == pytest.approx(weight)
    assert sum(r["weight"] for r in train["datasets"]) == pytest.approx(1)
    # the mix per window and the per-rank counts are of the same four datasets
    assert np.asarray(train["mix"]["counts"]).sum(axis=0).tolist() == drawn.tolist()
    assert np.asarray(train["ranks"]["counts"]).sum(axis=0).tolist() == drawn.tolist()
    # per phase: draws of each dataset counted in the phase's stretch of the run's blend
    phases = train["phases"]
    for k, (s, p) in enumerate(zip(indices.slices, phases["phases"])):
        counted = np.bincount(dataset[s.start:s.end], minlength=4)
        assert phases["draws"][k] == counted.tolist()
        for row in p["datasets"]:
            assert row["draws"] == counted[row["dataset"]] and NAMES[row["dataset"]] == row["name"]
            assert row["share"] == pytest.approx(counted[row["dataset"]] / p["samples"])
    assert [p["first_iteration"] for p in phases["phases"]] == [1, 11, 23]
    assert [p["last_iteration"] for p in phases["phases"]] == [10, 22, 30]
    if mode == "continue":  # a dataset's position: how far the run's blend has read it
        position = [np.zeros(4, dtype=np.int64)]
        for s in indices.slices:
            top = position[-1].copy()
            for d in range(4):
                here = np.asarray(indices.blend.dataset_sample_index)[s.start:s.end][dataset[s.start:s.end] == d]
                top[d] = max(top[d], here.max() + 1) if here.size else top[d]
            position.append(top)
        assert phases["positions"] == [p.tolist() for p in position]
    else:
        assert "positions" not in phases


def test_phases_are_mmfs_json_and_mmfs_phases(run):
    _, path, corpus, figs = run
    phases = figs["splits"]["train"]["phases"]
    of_json = manifest(corpus)["phases"]
    of_command = phases_report(path)
    assert phases["phase_mode"] == of_json["phase_mode"] == of_command["phase_mode"]
    for ours, theirs, command in zip(phases["phases"], of_json["phases"], of_command["phases"]):
        added = {"served_before", "first_iteration", "last_iteration"}
        assert {k: v for k, v in ours.items() if k not in added | {"datasets", "splits"}} == \
            {k: v for k, v in theirs.items() if k not in {"datasets", "splits"}}
        # restart: each phase's own valid and test, the same facts (mmfs.json adds where the mount serves them)
        assert ours.get("splits", {}).keys() == theirs.get("splits", {}).keys() == command.get("splits", {}).keys()
        for name, facts in ours.get("splits", {}).items():
            assert facts == command["splits"][name] == {k: theirs["splits"][name][k] for k in facts}
        assert [{k: v for k, v in d.items() if k != "dataset"} for d in ours["datasets"]] == theirs["datasets"]
        assert ours["served_before"] == command["served_before"]


def test_samples_served_again(run):
    """Counted from the blend arrays: every dataset here has one epoch in its document
    index, so its GPTDatasets of any size agree sample for sample (Megatron's indices
    depend on the documents, seed and sequence length only) and a (dataset, sample)
    pair read again is a sample served again."""
    mode, _, corpus, figs = run
    indices = corpus.indices["train"]
    assert all(r["epochs_in_index"] == 1 for r in figs["splits"]["train"]["datasets"])
    seen: set = set()
    again = []
    for s in indices.slices:
        pairs = [(indices.gpts[int(g)].spec.name, int(k)) for g, k in
                 zip(indices.blend.dataset_index[s.start:s.end], indices.blend.dataset_sample_index[s.start:s.end])]
        again.append(sum(p in seen for p in pairs))
        seen.update(pairs)
    phases = figs["splits"]["train"]["phases"]["phases"]
    assert [p["served_before"] for p in phases] == again
    assert (sum(again) == 0) == (mode == "continue")
    warned = {w["phase"]: w for w in figs["warnings"] if w["kind"] == "served_again"}
    assert {k: w["served_before"] for k, w in warned.items()} == {k: n for k, n in enumerate(again) if n}


def test_bands_and_warnings(run):
    _, _, _, figs = run
    train = figs["splits"]["train"]
    phase_bands = [b for b in train["mix"]["bands"] if b["kind"] == "phase"]
    assert [(b["first_iteration"], b["last_iteration"], b["first_sample"], b["end_sample"]) for b in phase_bands] == \
        [(1, 10, 0, 80), (11, 22, 80, 176), (23, 30, 176, 240)]
    assert [b["kind"] for b in train["mix"]["bands"]].count("batch_size") == 1
    tiny = [w for w in figs["warnings"] if w["kind"] == "no_samples"]
    assert [(w["phase"], w["dataset"], w["run_samples"]) for w in tiny] == [(2, "i32_docs", 64)]
    assert tiny[0]["expected"] == pytest.approx(64 * 0.004 / 4.004)
    # nothing is listed twice, though under restart a dataset has a GPTDataset in each phase
    assert not [w for w in figs["warnings"] if w["kind"] in ("same_path", "same_bytes")]
    assert json.loads(json.dumps(figs["splits"]["train"]["phases"])) == train["phases"]


def test_a_long_run_leaves_samples_served_again_uncounted(tmp_path, monkeypatch):
    from mmfs.tools.report import phases as report_phases

    monkeypatch.setattr(report_phases, "SERVED_COUNTED_UP_TO", 239)  # the run has 240 train samples
    figs = figures(open_corpus(write(tmp_path, "restart"), progress=False), browser=False)
    phases = figs["splits"]["train"]["phases"]
    assert [p["served_before"] for p in phases["phases"]] == [None, None, None]
    assert "not counted" in phases["note"] and "240" in phases["note"]
    assert not [w for w in figs["warnings"] if w["kind"] == "served_again"]
