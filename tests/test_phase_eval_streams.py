"""phase_mode restart: each phase's own valid and test through `streams/` (docs/streams.md,
docs/phases.md), on any layout from any consumed count, against what Megatron-LM's
relaunches read (tests/reference/record_phase_evals.py: each launch's loaders built
with core_v0.19.0's own build_train_valid_test_data_loaders at its carried
consumed_valid_samples, its samplers, cyclic_iter, evaluate()'s steps; single,
cyclic sharded and unsharded, three or four (dp, mbs) layouts a case); and `mmfs which
--split valid|test` naming the stream files that hold each evaluation step."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from phase_helpers import recorded_config

from mmfs.loader import Mount
from mmfs.megatron.corpus import open_corpus
from mmfs.tools.which import which_in
from mount_fixtures import mmfs, mount_in

REFERENCE = json.loads((Path(__file__).resolve().parent / "reference" / "phase_evals.json").read_text())["cases"]
LOADERS = {"single": ("single", None), "sharded": ("cyclic", True), "unsharded": ("cyclic", False)}


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """A mount per recorded case, of its config on one layout (dp 1, the single
    sampler): the streams serve every other."""
    made: dict[str, Mount] = {}
    with contextlib.ExitStack() as stack:
        def get(name: str) -> Mount:
            if name not in made:
                folder = tmp_path_factory.mktemp(name)
                made[name] = Mount(mount_in(stack, recorded_config(folder, name, REFERENCE[name], "restart"),
                                            folder / "mnt"))
            return made[name]
        yield get


def launches(case: dict, layout: str, split: str) -> dict[int, tuple[int, list[list[list[int]]]]]:
    """Per launch (phase) that reads `split`: its loader's consumed_samples and, per rank,
    the micro-batches it reads over the run's evaluation steps, in order."""
    reads = case["reads"][layout]
    out: dict[int, tuple[int, list]] = {}
    for phase, ranks in reads[split]:
        start = reads["consumed_valid_at_launch"][phase] if split == "valid" else 0
        _, held = out.setdefault(phase, (start, [[] for _ in ranks]))
        for r, batches in enumerate(ranks):
            held[r].extend(batches)
    return out


def read_stream(mount: Mount, split: str, phase: int, layout: str, rank: int, consumed: int,
                count: int) -> list[list[int]]:
    """The first `count` micro-batches `rank` reads from the phase's streams (pass after
    pass for cyclic, each from the rank's own count, as cyclic_iter iterates), as sample
    ids, each file's bytes checked against the phase's own samples'."""
    sampler, dp, mbs = layout.split(",")
    loader, sharding = LOADERS[sampler]
    dp, mbs = int(dp[3:]), int(mbs[4:])
    out: list[list[int]] = []
    while len(out) < count:
        files = mount.stream_files(split, rank, dp, mbs, consumed, loader, sharding, phase=phase)
        assert files, (split, phase, layout, rank, consumed)
        for path in files[:count - len(out)]:
            ids = [int(i) for i in mount.attribute(path, "user.mmfs.samples").split()]
            raw = np.fromfile(path, dtype=mount.dtype).reshape(len(ids), -1)
            want = np.stack([mount.sample(split, i, phase=phase) for i in ids])
            assert np.array_equal(raw, want), path
            out.append(ids)
        consumed += len(files) * dp * mbs
    return out


def digests(mount: Mount, split: str, phase: int, ids: list[int]) -> list[str]:
    return [hashlib.sha256(mount.sample(split, i, phase=phase).astype(np.int64).tobytes()).hexdigest()[:16]
            for i in ids]


@pytest.mark.parametrize("name", list(REFERENCE))
def test_every_layout_reads_each_phases_valid_and_test_as_megatron_s_relaunch(mounts, name):
    case = REFERENCE[name]
    mount = mounts(name)
    layouts = list(case["reads"])
    assert {layout.split(",")[0] for layout in layouts} == set(LOADERS) and len(layouts) >= 9
    read = 0
    for layout in layouts:
        for split in ("valid", "test"):
            for phase, (start, ranks) in launches(case, layout, split).items():
                for rank, want in enumerate(ranks):
                    got = read_stream(mount, split, phase, layout, rank, start, len(want))
                    assert got == want, (layout, split, phase, rank)
                    read += len(got)
                # the bytes are the phase's own samples, as Megatron's relaunch builds them
                ids = sorted({i for batches in ranks for batch in batches for i in batch})
                assert digests(mount, split, phase, ids) == [case["per_phase"][phase][split][i] for i in ids]
    assert read > 0


@pytest.mark.parametrize("name", ["evals_every_four_iterations", "single_prefix_bare_then_weighted"])
def test_a_job_resumed_between_evaluations_reads_on_from_its_count(mounts, name):
    """A job of a launch checkpointed after some of its evaluations (on the same layout,
    or any layout for the single sampler: its stream is the split in order) rebuilds
    its valid loader at that consumed_valid_samples: the stream from there holds the rest
    of what the launch reads (sharded cyclic: the same bucket positions; unsharded
    ranks drift after an epoch, streams.md)."""
    case = REFERENCE[name]
    mount = mounts(name)
    eval_gbs = case["training"]["global_batch_size"]
    tried = 0
    for layout in case["reads"]:
        if layout.startswith("unsharded"):
            continue
        _, dp, mbs = layout.split(",")
        per_step = eval_gbs // (int(dp[3:]) * int(mbs[4:]))
        for phase, (start, ranks) in launches(case, layout, "valid").items():
            steps = len(ranks[0]) // per_step
            for s in range(1, steps):
                for rank, want in enumerate(ranks):
                    rest = want[s * per_step:]
                    got = read_stream(mount, "valid", phase, layout, rank, start + s * eval_gbs, len(rest))
                    assert got == rest, (layout, phase, s, rank)
                    tried += 1
    assert tried > 0


@pytest.mark.parametrize("layout", ["single,dp=2,mbs=2", "sharded,dp=4,mbs=1", "unsharded,dp=2,mbs=2"])
def test_which_names_the_stream_files_that_hold_each_evaluation_step(tmp_path, layout):
    """Every valid and test step `mmfs which` answers: its stream file (of the phase's own
    streams, the loader's pass) exists in the mount and holds those very samples, which
    are the ones Megatron's relaunch read (the recording)."""
    name = "evals_every_four_iterations"
    case = REFERENCE[name]
    sampler, dp, mbs = layout.split(",")
    loader, sharding = LOADERS[sampler]
    training = {"dataloader_type": loader, "data_parallel_size": int(dp[3:]), "micro_batch_size": int(mbs[4:]),
                **({} if sharding is None else {"data_sharding": sharding})}
    config = recorded_config(tmp_path, name, case, "restart", training)
    corpus = open_corpus(config, progress=False)
    with contextlib.ExitStack() as stack:
        mnt = mount_in(stack, config, tmp_path / "mnt")
        for split in ("valid", "test"):
            steps = case["reads"][layout][split]
            for step, (phase, want) in enumerate(steps, start=1):
                found = which_in(corpus, step, split)
                for r, ranks in enumerate(found["ranks"]):
                    for b, ids in zip(ranks["microbatches"], want[r], strict=True):
                        assert [s["sample"] for s in b["samples"]] == ids
                        path = b["stream_file"]
                        assert path.startswith(f"{split}/phases/{phase:03d}/streams/{layout.split(',', 1)[1]},from=")
                        held = os.getxattr(mnt / path, "user.mmfs.samples").decode().split()
                        assert list(map(int, held)) == ids, (split, step, r, path)
                        rows = np.fromfile(mnt / path, dtype=np.dtype(json.loads((mnt / "mmfs.json").read_text())
                                                                      ["dtype"])).reshape(len(ids), -1)
                        assert [hashlib.sha256(row.astype(np.int64).tobytes()).hexdigest()[:16] for row in rows] \
                            == [case["per_phase"][phase][split][i] for i in ids]
        # the command itself, asked of the mount, names the same file
        last = len(case["reads"][layout]["valid"])
        out = mmfs("which", mnt, "--split", "valid", "--iteration", str(last), "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["ranks"][0]["microbatches"][-1]["stream_file"] == \
            which_in(corpus, last, "valid")["ranks"][0]["microbatches"][-1]["stream_file"]
        text = mmfs("which", mnt, "--split", "test", "--iteration", "1", "--rank", "0")
        assert text.returncode == 0 and f"  stream file test/phases/003/streams/{layout.split(',', 1)[1]},from=0/000/" \
            in text.stdout, text.stdout


def test_a_phase_s_streams_refuse_what_megatron_s_sampler_refuses_in_one_log_line(mounts):
    """Spelled and checked as a split's streams: a layout Megatron's sampler refuses, or
    a bad spelling, is ENOENT with one log line naming the phase's folder; no phase past
    the run's, and train has no phases/ (its phases are one split)."""
    name = "two_datasets_weights_swap"
    mount = mounts(name)
    root = Path(mount.path)
    streams = root / "valid" / "phases" / "001" / "streams"
    assert sorted(os.listdir(root / "valid" / "phases" / "001")) == ["ranks", "samples", "streams"]
    assert os.listdir(streams) == []  # a layout folder appears when it is looked up
    bad = ["dp=3,mbs=1,from=4,sampler=cyclic",  # 4 into the epoch: not a multiple of 3
           f"dp=1,mbs=1,from={mount.split_samples('valid', phase=1)}",  # single: at the end of the split
           "dp=2,mbs=1,from=0,sampler=single,sharding=true", "dp=2,mbs=99,from=0"]
    for layout in bad:
        for _ in range(2):
            with pytest.raises(FileNotFoundError):
                os.stat(streams / layout)
    for missing in (root / "valid" / "phases" / "002" / "streams" / "dp=1,mbs=1,from=0",
                    root / "train" / "phases" / "001" / "streams" / "dp=1,mbs=1,from=0"):
        with pytest.raises(FileNotFoundError):
            os.stat(missing)
    log = (root.parent / f"{root.name}.log").read_text()
    lines = [ln for ln in log.splitlines() if "/valid/phases/001/streams/" in ln and "no such stream" in ln]
    assert len(lines) == len(bad), lines
    assert "not a multiple of micro_batch_size x data_parallel_size = 3" in lines[0]
    assert os.listdir(streams / "dp=3,mbs=1,from=3,sampler=cyclic") == ["000", "001", "002"]


def test_the_loader_s_phase_argument_says_what_is_wrong_in_one_line(mounts):
    from mmfs.loader import LoaderError

    mount = mounts("two_datasets_weights_swap")
    for call, words in ((lambda: mount.sample("valid", 0, phase=2), "phase 2 is outside the run's 2 phase(s)"),
                        (lambda: mount.sample("train", 0, phase=1), "phase 1 has no 'train' samples of its own"),
                        (lambda: mount.stream_files("valid", 0, 1, 1, phase=-1), "phase must be 0 or more"),
                        (lambda: mount.sample("valid", 10**6, phase=1), "sample 1000000 is outside [0, 49)"),
                        (lambda: mount.stream_files("valid", 0, 3, 1, 4, "cyclic", phase=1), "no such stream")):
        with pytest.raises(LoaderError, match=re.escape(words)) as exc:
            call()
        assert "\n" not in str(exc.value)
