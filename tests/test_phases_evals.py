"""phase_mode restart: each relaunch's own valid and test, and which launch evaluates
each step, against Megatron-LM's relaunches (tests/reference/record_phase_evals.py:
megatron-core 0.19.2's builds, core_v0.19.0's loaders and samplers, evaluate()'s
steps across --phase-transition-iterations), for every sampler and two layouts a
case; served by the mount under <split>/phases/<phase>/, described in mmfs.json,
`mmfs phases` and `mmfs report`."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from phase_helpers import recorded_config, sample_digests

from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phases.facts import describe_phases
from mmfs.tools.which import which_in
from mount_fixtures import mmfs, mounted

REFERENCE = json.loads((Path(__file__).resolve().parent / "reference" / "phase_evals.json").read_text())["cases"]
SAMPLERS = {"single": {"dataloader_type": "single"},
            "sharded": {"dataloader_type": "cyclic"},
            "unsharded": {"dataloader_type": "cyclic", "data_sharding": False}}


def layouts(name: str) -> list[str]:
    return list(REFERENCE[name]["reads"])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A folder (and index cache) per case, shared by its layouts: the layout does not
    change an index."""
    made: dict[str, Path] = {}

    def folder(name: str) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
        return made[name]
    return folder


def config(folder: Path, name: str, layout: str | None = None, mode: str = "restart") -> str:
    """The case's config, with the layout's sampler, data-parallel size and micro-batch size."""
    if layout is None:
        return recorded_config(folder, name, REFERENCE[name], mode)
    sampler, dp, mbs = layout.split(",")
    return recorded_config(folder, name, REFERENCE[name], mode, {**SAMPLERS[sampler], "data_parallel_size":
                                                                  int(dp[3:]), "micro_batch_size": int(mbs[4:])})


@pytest.mark.parametrize("name", list(REFERENCE))
def test_each_phase_has_its_relaunchs_valid_and_test(folders, name):
    corpus = open_corpus(config(folders(name), name), progress=False)
    case = REFERENCE[name]
    assert len(corpus.phase_splits) == len(case["per_phase"])
    for k, (own, expected) in enumerate(zip(corpus.phase_splits, case["per_phase"])):
        for split in ("valid", "test"):
            assert sample_digests(own[split], 0, len(own[split])) == expected[split], (k, split)
    assert corpus.phase_splits[0]["valid"] is corpus.splits["valid"]  # the top level's: one reader


def _ids(found: dict) -> list:
    return [[[s["sample"] for s in b["samples"]] for b in r["microbatches"]] for r in found["ranks"]]


@pytest.mark.parametrize("name,layout", [(n, layout) for n in REFERENCE for layout in layouts(n)])
def test_which_reads_each_evaluation_as_the_relaunches_do(folders, name, layout):
    case = REFERENCE[name]
    reads = case["reads"][layout]
    corpus = open_corpus(config(folders(name), name, layout), progress=False)
    starts = reads["consumed_valid_at_launch"]
    for split in ("valid", "test"):
        for step, (phase, expected) in enumerate(reads[split], start=1):
            found = which_in(corpus, step, split)
            assert [p["phase"] for p in found["phases"]] == [phase], (split, step)
            assert {s["phase"] for r in found["ranks"] for b in r["microbatches"] for s in b["samples"]} == {phase}
            assert _ids(found) == expected, (split, step)
            at = found["consumed_samples"][0]
            if split == "valid":
                assert found["phases"][0]["loader_consumed_samples"] == starts[phase]
                # a job of that launch resumed where the step starts reads it too (Megatron's
                # sampler rebuilt there is the same, but after an unsharded epoch's drift)
                if at == starts[phase]:
                    assert _ids(which_in(corpus, None, split, consumed=at)) == expected
            else:  # test's loader starts at 0, resumed or not
                assert found["phases"][0]["loader_consumed_samples"] == 0
                assert _ids(which_in(corpus, None, split, consumed=at)) == expected
    # past the run's evaluations: one line
    with pytest.raises(Exception, match="past the run's"):
        which_in(corpus, len(reads["valid"]) + 1, "valid")


@pytest.mark.parametrize("name", list(REFERENCE))
def test_the_facts_count_each_launchs_evaluations(folders, name):
    case = REFERENCE[name]
    reads = next(iter(case["reads"].values()))
    corpus = open_corpus(config(folders(name), name), progress=False)
    from mmfs.megatron.phases.evaluations import eval_schedule

    train = corpus.indices["train"]
    facts = describe_phases(train, eval_schedule(corpus.config.training, train.phases.train_samples))
    eval_iters = case["training"]["eval_iters"]
    for k, phase in enumerate(facts["phases"]):
        valid, test = phase["splits"]["valid"], phase["splits"]["test"]
        steps = [p for p, _ in reads["valid"]].count(k)
        assert valid["evaluations"]["count"] * eval_iters == steps
        assert valid["evaluations"]["loader_consumed_samples"] == reads["consumed_valid_at_launch"][k]
        assert test["evaluations"]["count"] * eval_iters == [p for p, _ in reads["test"]].count(k)
        assert valid["samples"] == len(case["per_phase"][k]["valid"])
        assert sum(d["draws"] for d in valid["datasets"]) == valid["samples"]


def test_continue_keeps_one_valid_and_test(folders):
    name = "two_datasets_weights_swap"
    corpus = open_corpus(config(folders(name), name, mode="continue"), progress=False)
    assert corpus.phase_splits == []
    assert "splits" not in describe_phases(corpus.indices["train"])["phases"][1]
    found = which_in(corpus, 4, "valid")
    assert "phases" not in found


def test_which_valid_needs_the_eval_schedule_under_restart(tmp_path):
    name = "two_datasets_weights_swap"
    path = Path(config(tmp_path, name))
    raw = yaml.safe_load(path.read_text())
    for key in ("train_iters", "eval_interval", "eval_iters"):
        del raw["training"][key]
    raw["samples"] = {"train": 400, "valid": 48, "test": 16}
    path.write_text(yaml.safe_dump(raw))
    out = mmfs("which", path, "--split", "valid", "--iteration", "1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "training.eval_interval: missing" in out.stderr
    test = mmfs("which", path, "--split", "test", "--iteration", "1", "--json")  # the last launch's, from 0
    assert test.returncode == 0, test.stderr
    assert json.loads(test.stdout)["phases"][0]["phase"] == 1


def test_the_mount_serves_each_phases_valid_and_test(folders, tmp_path):
    name, layout = "evals_every_four_iterations", "sharded,dp=2,mbs=2"
    case = REFERENCE[name]
    corpus = open_corpus(path := config(folders(name), name, layout), progress=False)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(path, mnt) as m:
        info = json.loads((m.path / "mmfs.json").read_text())
        section = info["phases"]
        assert section["phase_name_width"] == 3
        assert sorted(os.listdir(m.path / "valid" / "phases")) == ["000", "001", "002", "003"]
        dtype = np.dtype(info["dtype"])
        for k, (phase, expected) in enumerate(zip(section["phases"], case["per_phase"])):
            for split in ("valid", "test"):
                entry = phase["splits"][split]
                assert entry["path"] == f"{split}/phases/{k:03d}/samples"
                assert entry["samples"] == len(expected[split])
                folder = m.path / entry["path"]
                names = sorted(os.listdir(folder))
                assert len(names) == len(expected[split])
                got = [hashlib.sha256(np.fromfile(folder / n, dtype=dtype).astype(np.int64).tobytes())
                       .hexdigest()[:16] for n in names]
                assert got == expected[split], (k, split)
                assert entry["ranks_path"] == f"{split}/phases/{k:03d}/ranks"
                assert sorted(os.listdir(m.path / entry["ranks_path"])) == ["000", "001"]
        # each evaluation step's micro-batch files, where `which` names them, hold what the launch reads
        for step, (phase, expected) in enumerate(case["reads"][layout]["valid"], start=1):
            found = which_in(corpus, step, "valid")
            for r, ranks in enumerate(found["ranks"]):
                for b, ids in zip(ranks["microbatches"], expected[r]):
                    assert b["file"] is not None and b["file"].startswith(f"valid/phases/{phase:03d}/ranks/")
                    held = os.getxattr(m.path / b["file"], "user.mmfs.samples").decode().split()
                    assert list(map(int, held)) == ids
        assert sorted(os.listdir(m.path / "valid")) == ["phases", "ranks", "samples", "streams"]


def test_mmfs_phases_and_the_report_show_each_phases_valid_and_test(folders):
    name = "single_weighted_first_phase"
    path = config(folders(name), name)
    out = mmfs("phases", path)
    assert out.returncode == 0, out.stderr
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith(("valid:", "test:"))]
    # evaluations after iterations 30 and 60 (train_iters 63, eval_interval 30) and once more after 63:
    # phase 0 (iterations 1-35) runs the first, phase 1 (36-50) none, phase 2 the rest, then test
    assert lines == [
        "valid: 30 samples (BlendedDataset), 1 evaluation(s) after iteration 30, consumed_samples 0 -> 10",
        "test: 10 samples (BlendedDataset), not evaluated by this launch",
        "valid: 30 samples (BlendedDataset), not evaluated by this launch",
        "test: 10 samples (BlendedDataset), not evaluated by this launch",
        "valid: 31 samples (BlendedDataset), 2 evaluation(s) after iterations 60 to 63, consumed_samples 10 -> 30",
        "test: 11 samples (BlendedDataset), 1 evaluation(s) after iteration 63, consumed_samples 0 -> 10",
    ]
    from mmfs.tools.report.command import figures

    figs = figures(open_corpus(path, progress=False), browser=False)
    facts = [p["splits"] for p in figs["splits"]["train"]["phases"]["phases"]]
    for split in ("valid", "test"):
        own = figs["splits"][split]["by_phase"]
        assert [p["phase"] for p in own] == [0, 1, 2]
        assert [p["samples"] for p in own] == [len(p[split]) for p in REFERENCE[name]["per_phase"]]
        assert [p["evaluations"] for p in own] == [f[split]["evaluations"] for f in facts]
        assert [sum(d["samples"] for d in p["datasets"]) for p in own] == [p["run"]["samples"] for p in own]


def test_a_moved_transition_fails_the_recorded_reads(folders, tmp_path):
    """Negative control: the phases of the recording one iteration earlier (24, not 25:
    the evaluation after iteration 25 is then the second launch's) read other samples."""
    name, layout = "two_datasets_weights_swap", "single,dp=2,mbs=2"
    case = REFERENCE[name]
    path = Path(config(tmp_path, name, layout))
    raw = yaml.safe_load(path.read_text())
    raw["phases"][1]["start_iteration"] = 24
    path.write_text(yaml.safe_dump(raw))
    corpus = open_corpus(str(path), progress=False)

    def read(phase: int, ids: list) -> list:  # the digests of what a step reads
        return [case["per_phase"][phase]["valid"][i] for rank in ids for batch in rank for i in batch]

    expected = [read(phase, ids) for phase, ids in case["reads"][layout]["valid"]]
    found = [which_in(corpus, step, "valid") for step in range(1, len(expected) + 1)]
    got = [read(f["phases"][0]["phase"], _ids(f)) for f in found]
    assert got[2:] == expected[2:] and got[:2] != expected[:2]
