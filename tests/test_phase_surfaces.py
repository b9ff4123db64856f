"""Every reader of a run in phases follows the phases (issue 27 item 4): ranks/ and
streams/ across a boundary of a real mount, `mmfs which` on both sides of each
boundary (the phase and each sample's dataset), `which --consumed`, resume-check
of a resume that crosses or changes a phase, and the loader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phases.sampling import split_sampler
from mmfs.megatron.sampling.rankplan import microbatch_ids, plan_ranks, plan_stream, rank_ids
from mmfs.mount.contract import XATTR_PHASE
from mmfs.tools.which import which
from mount_fixtures import mmfs, mounted

DATA = Path(__file__).resolve().parent / "golden" / "data"
TRAINING = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8, "train_iters": 30,
            "eval_interval": 10, "eval_iters": 2}


def ds(name: str, weight: float) -> dict:
    return {"path": str(DATA / name), "weight": weight}


PHASES = [
    {"datasets": [ds("u16_docs", 0.7), ds("u16_multiseq", 0.3)]},
    {"start_iteration": 10, "datasets": [ds("u16_docs", 0.2), ds("u16_multiseq", 0.3), ds("u16_small", 0.5)]},
    {"start_iteration": 22, "datasets": [ds("u16_small", 1.0), ds("u16_docs", 3.0)]},
]
BOUNDARIES = [80, 176]  # iterations 10 and 22 of 8 samples


def write(tmp_path: Path, name: str = "run.yaml", training: dict | None = None, **keys) -> Path:
    config = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0},
              "cache_dir": str(tmp_path / "cache"), "training": training or dict(TRAINING), **keys}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("phased")
    path = write(tmp, phases=PHASES)
    (tmp / "mnt").mkdir()
    with mounted(path, tmp / "mnt") as m:
        yield path, open_corpus(str(path), progress=False), m


def _phase(i: int) -> int:
    return sum(i >= b for b in BOUNDARIES)


def test_ranks_cross_each_boundary_as_the_run_does(run):
    path, corpus, m = run
    reader = corpus.splits["train"]
    plan = plan_ranks(len(reader), 2, 2)
    for boundary in BOUNDARIES:
        j0 = boundary // 4  # the first micro-batch of the phase, for every rank
        for rank in (0, 1):
            for j in (j0 - 2, j0 - 1, j0, j0 + 1):
                ids = microbatch_ids(plan, rank, j).tolist()
                f = m.path / "train" / "ranks" / f"{rank:03d}" / f"{j:07d}.bin"
                assert f.read_bytes() == b"".join(reader.read(i) for i in ids)
                assert {_phase(i) for i in ids} == {_phase(boundary) - (j < j0)}
                for i in ids:
                    sample = m.path / "train" / "samples" / f"{i:07d}.bin"
                    assert os.getxattr(sample, XATTR_PHASE).decode() == str(_phase(i))


@pytest.mark.parametrize("layout", ["dp=4,mbs=1,from=72", "dp=1,mbs=3,from=171,sampler=single",
                                    "dp=4,mbs=2,from=168,sampler=cyclic,sharding=false"])
def test_streams_cross_a_boundary(run, layout):
    path, corpus, m = run
    reader = corpus.splits["train"]
    parts = dict(p.split("=") for p in layout.split(","))
    dp, mbs, consumed = int(parts["dp"]), int(parts["mbs"]), int(parts["from"])
    sampler, sharding = parts.get("sampler", "single"), parts.get("sharding", "true") == "true"
    phased = split_sampler(reader.indices, sampler, mbs, dp, sharding)  # cyclic: each phase's own
    plan = phased.plan(consumed) if phased else plan_stream(len(reader), mbs, dp, consumed, sampler, sharding)
    phases_seen = set()
    for rank in range(dp):
        folder = m.path / "train" / "streams" / layout / f"{rank:03d}"
        ids = rank_ids(plan, rank)
        assert len(os.listdir(folder)) == len(ids)
        for j in range(min(len(ids), 12)):
            f = folder / f"{j:07d}.bin"
            assert f.read_bytes() == b"".join(reader.read(int(i)) for i in ids[j])
            phases_seen |= {_phase(int(i)) for i in ids[j]}
    assert len(phases_seen) > 1


@pytest.mark.parametrize("iteration", [10, 11, 22, 23])
def test_which_names_the_phase_on_both_sides_of_each_boundary(run, iteration):
    path, corpus, m = run
    reader = corpus.splits["train"]
    expected_phase = _phase((iteration - 1) * 8)
    for target in (str(path), str(m.path)):
        result = which(target, iteration)
        [phase] = result["phases"]
        assert phase["phase"] == expected_phase
        assert phase["start_sample"] == [0, *BOUNDARIES][expected_phase]
        assert phase["start_iteration"] == [0, 10, 22][expected_phase]
        assert list(phase["datasets"]) == [os.path.basename(d["path"]) for d in PHASES[expected_phase]["datasets"]]
        for r in result["ranks"]:
            for b in r["microbatches"]:
                f = m.path / b["file"]
                ids = [s["sample"] for s in b["samples"]]
                assert f.read_bytes() == b"".join(reader.read(i) for i in ids)
                for s in b["samples"]:
                    assert s["phase"] == expected_phase
                    assert s["dataset"] == reader.provenance(s["sample"])[0]
                    assert s["dataset"] in phase["datasets"]
    text = mmfs("which", path, "--iteration", iteration)
    assert text.returncode == 0, text.stderr
    assert f"phase {expected_phase} (from iteration {[1, 11, 23][expected_phase]}, " in text.stdout
    assert f"phase {expected_phase}\n" in text.stdout


def test_which_consumed_names_the_phase_of_a_resumed_batch(run):
    path, corpus, m = run
    at_boundary = which(str(path), None, consumed=80)
    assert [p["phase"] for p in at_boundary["phases"]] == [1] and at_boundary["iteration"] == 11
    across = which(str(path), None, consumed=76)  # a job resumed mid-iteration: its batch spans phases 0 and 1
    assert [p["phase"] for p in across["phases"]] == [0, 1]
    got = sorted({s["phase"] for r in across["ranks"] for b in r["microbatches"] for s in b["samples"]})
    assert got == [0, 1]
    valid = which(str(path), 1, split="valid")  # valid and test are not phased
    assert "phases" not in valid and all("phase" not in s for b in valid["ranks"][0]["microbatches"]
                                         for s in b["samples"])


def test_the_loader_reads_the_phased_run(run):
    from mmfs.loader import Mount

    path, corpus, m = run
    reader = corpus.splits["train"]
    mount = Mount(m.path)
    plan = plan_ranks(len(reader), 2, 2)
    first = BOUNDARIES[0] // 4 - 1
    got = list(mount.microbatches("train", 1, consumed_samples=first * 4))[:3]
    for j, raw in enumerate(got):
        ids = microbatch_ids(plan, 1, first + j)
        assert np.asarray(raw).tobytes() == b"".join(reader.read(int(i)) for i in ids)
    assert [mount.phase("train", i) for i in (0, 79, 80, 175, 176, 239)] == [0, 0, 1, 1, 2, 2]
    assert mount.phase("valid", 0) is None
    batch = next(mount.megatron_batches("train", 0, consumed_samples=BOUNDARIES[1]))
    assert batch["tokens"].shape == (2, 32)
    rank_file = mount.microbatch_file(mount.microbatch_path("train", 1, first))
    assert rank_file["phase"].tolist() == [_phase(int(i)) for i in rank_file["sample_ids"]]
    stream = mount.stream_files("train", 0, 4, 1, 72)  # the files a resumed torch RankStream reads
    phases = [mount.microbatch_file(f)["phase"].tolist() for f in stream[:4]]
    assert phases == [[0], [0], [1], [1]]
    assert "phase" not in mount.microbatch_file(mount.microbatch_path("valid", 0, 0))


def test_the_grain_source_reads_the_phased_run(run):
    from mmfs.adapters.grain import SampleSource

    path, corpus, m = run
    reader = corpus.splits["train"]
    source = SampleSource(m.path, "train")
    for i in (BOUNDARIES[0] - 1, BOUNDARIES[0], BOUNDARIES[1] - 1, BOUNDARIES[1]):
        assert source[i].tobytes() == reader.read(i)
    item = SampleSource(m.path, "train", megatron=True)[BOUNDARIES[1]]
    assert set(item) >= {"tokens", "labels", "loss_mask", "position_ids"}


# -- resume-check -------------------------------------------------------------------


def test_resume_check_names_the_phases_of_a_resume_that_crosses_a_boundary(run):
    path, corpus, m = run
    proc = mmfs("resume-check", path, "--consumed", 72, "--to", "dp=4,mbs=1", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exactly_once"] and report["phase_at_resume"] == 0
    text = mmfs("resume-check", path, "--consumed", 72, "--to", "dp=4,mbs=1")
    assert "phase 0 (samples 0..80)" in text.stdout, text.stdout
    # a layout that repeats samples: the report says which phases they belong to
    bad = json.loads(mmfs("resume-check", path, "--consumed", 88, "--to", "dp=4,mbs=2,sampler=cyclic",
                          "--json").stdout)
    assert not bad["exactly_once"] and bad["phase_at_resume"] == 1
    for what in ("repeated", "skipped"):
        assert sum(bad[f"{what}_by_phase"].values()) == bad[what]
    # (the cyclic job reads phase 1 with phase 1's own sampler: what it repeats and skips is of phase 1)
    assert set(bad["repeated_by_phase"]) | set(bad["skipped_by_phase"]) == {"1"}


def _changed(tmp_path: Path, name: str, phases: list, mode: str = "continue") -> Path:
    return write(tmp_path, name, phases=phases, phase_mode=mode)


def test_resume_check_of_a_resume_that_changes_a_later_phase(run, tmp_path):
    path, corpus, m = run
    later = [PHASES[0], PHASES[1], {**PHASES[2], "datasets": [ds("u16_small", 1.0), ds("u16_multiseq", 1.0)]}]
    new = _changed(tmp_path, "later.yaml", later)
    proc = mmfs("resume-check", path, "--consumed", 176, "--to-config", new, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["phases"]
    assert report["same_before_resume"] and report["first_difference"] is None
    assert report["changed_phases"] == [2] and report["served_again"] == report["served_again_uninterrupted"]


def test_resume_check_of_a_resume_that_changes_the_current_phase(run, tmp_path):
    path, corpus, m = run
    # phase 1's mix changed while it was running (resumed at iteration 15): the new
    # config's samples before the resume point are not what the job trained on, and
    # under continue its datasets' positions are not where the job left them.
    current = [PHASES[0], {**PHASES[1], "datasets": [ds("u16_docs", 0.9), ds("u16_small", 0.1)]}, PHASES[2]]
    new = _changed(tmp_path, "current.yaml", current)
    proc = mmfs("resume-check", path, "--consumed", 120, "--to-config", new, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["phases"]
    assert not report["same_before_resume"] and 80 <= report["first_difference"] < 120
    assert report["changed_phases"] == [1]
    old_run, new_run = corpus.splits["train"], open_corpus(str(new), progress=False).splits["train"]
    trained = {_key(old_run, i) for i in range(120)}
    again = sum(_key(new_run, i) in trained for i in range(120, len(new_run)))
    assert report["served_again"] == again > report["served_again_uninterrupted"]
    text = mmfs("resume-check", path, "--consumed", 120, "--to-config", new)
    assert "phase 1" in text.stdout and "first differs at sample" in text.stdout


def _key(reader, i: int) -> tuple:
    gpt, k = reader.locate(i)
    return gpt.gpt.spec.file, tuple(gpt.pieces(k))


def test_resume_check_to_config_mistakes_are_one_line(run, tmp_path):
    path, corpus, m = run
    proc = mmfs("resume-check", path, "--consumed", 120)
    assert proc.returncode == 2 and "--to" in proc.stderr.splitlines()[-1]
    other = write(tmp_path, "other.yaml", phases=PHASES)
    other.write_text(other.read_text().replace("sequence_length: 32", "sequence_length: 64"))
    proc = mmfs("resume-check", path, "--consumed", 120, "--to-config", other)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "sequence_length 64" in proc.stderr, proc.stderr
    proc = mmfs("resume-check", path, "--consumed", 10_000, "--to-config", path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "fewer than the job consumed" in proc.stderr


def test_which_under_restart_names_each_phases_own_blend(tmp_path):
    path = write(tmp_path, phases=PHASES, phase_mode="restart")
    reader = open_corpus(str(path), progress=False).splits["train"]
    for iteration, phase in ((10, 0), (11, 1), (22, 1), (23, 2)):
        result = which(str(path), iteration)
        assert [(p["phase"], p["phase_mode"]) for p in result["phases"]] == [(phase, "restart")]
        for b in result["ranks"][0]["microbatches"]:
            for s in b["samples"]:
                assert s["phase"] == phase and s["dataset"] == reader.provenance(s["sample"])[0]
                assert s["dataset"] in result["phases"][0]["datasets"]
