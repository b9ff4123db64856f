"""`<split>/streams/`: a resumed job's micro-batches on any layout, against
megatron-core's samplers resumed on that layout (recorded in
reference/megatron_streams.json by record_megatron_streams.py)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from golden_cases import write_case_config
from mmfs.megatron.sampling.rankplan import microbatch_ids, plan_stream, rank_ids
from mmfs.megatron.sampling.samplers import SamplerError
from mmfs.mount.streams import parse_layout
from mount_fixtures import mounted

RECORDED = json.loads((Path(__file__).parent / "reference" / "megatron_streams.json").read_text())["cases"]
SPLITS = {100: ("p2_blend2_u16", "valid"), 643: ("p3_multi_epoch_i32", "train")}


def _sampler(kind: str) -> tuple[str, bool]:
    return ("single", True) if kind == "single" else ("cyclic", kind == "sharded")


def _layout_name(c: dict) -> str:
    loader, sharding = _sampler(c["kind"])
    name = f"dp={c['dp']},mbs={c['mbs']},from={c['consumed']},sampler={loader}"
    return name if loader == "single" else f"{name},sharding={'true' if sharding else 'false'}"


def test_the_recorded_cases_cover_the_issue():
    seen = {(c["kind"], c["dp"], c["mbs"]) for c in RECORDED}
    assert seen == {(k, d, m) for k in ("single", "sharded", "unsharded") for d in (1, 3, 7, 16) for m in (1, 3, 5)}
    assert any("refused" in c for c in RECORDED) and any(c["consumed"] % (c["dp"] * c["mbs"]) for c in RECORDED
                                                         if "new" in c)


@pytest.mark.parametrize("c", RECORDED, ids=lambda c: _layout_name(c) + f"-t{c['total']}")
def test_plan_is_megatrons_pass(c):
    loader, sharding = _sampler(c["kind"])
    if "refused" in c:
        with pytest.raises(SamplerError):
            plan_stream(c["total"], c["mbs"], c["dp"], c["consumed"], loader, sharding)
        return
    plan = plan_stream(c["total"], c["mbs"], c["dp"], c["consumed"], loader, sharding)
    for rank, stream in c["new"].items():
        r = int(rank)
        assert plan.files_of(r) == len(stream)
        assert rank_ids(plan, r).tolist() == stream
        for j in range(0, len(stream), 7):
            assert microbatch_ids(plan, r, j).tolist() == stream[j]


@pytest.mark.parametrize("name", [
    "dp=2,mbs=1", "dp=02,mbs=1,from=0", "dp=2,mbs=1,from=0,", "mbs=1,dp=2,from=0", "dp=2,mbs=1,from=-4",
    "dp=2,mbs=1,from=0,sharding=true,sampler=cyclic", "dp=2,mbs=1,from=0,sampler=random", "dp=0,mbs=1,from=0",
    "dp=16385,mbs=1,from=0", "dp=2,mbs=0,from=0", "dp=2, mbs=1,from=0", "DP=2,mbs=1,from=0",
    "dp=2,mbs=1,from=1" + "0" * 100, "dp=2,mbs=1,from=0,sampler=single,sharding=true",
])
def test_other_spellings_are_refused(name):
    with pytest.raises(SamplerError):
        parse_layout(name, None)


def _mount_config(case: str, tmp_path: Path) -> Path:
    config = write_case_config(case, tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": 2, "micro_batch_size": 4}
    config.write_text(yaml.safe_dump(raw))
    return config


@pytest.mark.parametrize("total", sorted(SPLITS))
def test_every_stream_file_through_the_mount(tmp_path, total):
    """Every file of every rank of every recorded layout of this split: its
    samples' files concatenated, its xattr Megatron's micro-batch; refused
    layouts are ENOENT with one log line each."""
    case, split = SPLITS[total]
    with mounted(_mount_config(case, tmp_path), tmp_path / "mnt") as m:
        samples = m.path / split / "samples"
        sample = {}

        def want(ids):
            for i in ids:
                if i not in sample:
                    sample[i] = (samples / f"{i:07d}.bin").read_bytes()
            return b"".join(sample[i] for i in ids)

        assert os.listdir(m.path / split / "streams") == []
        refused = set()  # names: the same layout may be recorded for two old layouts
        for c in (c for c in RECORDED if c["total"] == total):
            folder = m.path / split / "streams" / _layout_name(c)
            if "refused" in c:
                with pytest.raises(OSError) as exc:
                    os.stat(folder)
                assert exc.value.errno == errno.ENOENT
                refused.add(folder.name)
                continue
            width = max(3, len(str(c["dp"] - 1)))
            assert sorted(os.listdir(folder)) == [f"{r:0{width}d}" for r in range(c["dp"])]
            for rank, stream in c["new"].items():
                rank_dir = folder / f"{int(rank):0{width}d}"
                assert len(os.listdir(rank_dir)) == len(stream)
                for j, ids in enumerate(stream):
                    f = rank_dir / f"{j:07d}.bin"
                    assert f.read_bytes() == want(ids)
                    if j % 5 == 0:
                        assert os.getxattr(f, "user.mmfs.samples").split() == [str(i).encode() for i in ids]
                assert not (rank_dir / f"{len(stream):07d}.bin").exists()
        log = m.log.read_text()
        assert refused and log.count("no such stream") == len(refused), log[-2000:]


def test_consumed_samples_past_64_bits_as_megatrons_cyclic_sampler_takes_them(tmp_path):
    """from= of 20+ digits: the epoch seeds torch's generator, which takes up to
    2**64 - 1 and keeps the low 32 bits (the recorded randperm of seed 2**32 + 5
    shows the same of mmfs's); epoch 2**64 is where torch raises."""
    total, active = 643, 640  # p3_multi_epoch_i32's train split; dp 2 x mbs 4
    with mounted(_mount_config("p3_multi_epoch_i32", tmp_path), tmp_path / "mnt") as m:
        streams = m.path / "train" / "streams"
        for sharding in ("true", "false"):
            for epoch in (2**63 + 7, 2**64 - 1):
                consumed = epoch * active + 48
                assert len(str(consumed)) >= 20
                big = streams / f"dp=2,mbs=4,from={consumed},sampler=cyclic,sharding={sharding}"
                same = streams / f"dp=2,mbs=4,from={(epoch % 2**32) * active + 48},sampler=cyclic,sharding={sharding}"
                plan = plan_stream(total, 4, 2, consumed, "cyclic", sharding == "true")
                assert plan.epoch == epoch
                for rank in ("000", "001"):
                    names = sorted(os.listdir(big / rank))
                    assert names == sorted(os.listdir(same / rank)) and len(names) == plan.files_of(int(rank))
                    for name in names[::9]:
                        assert (big / rank / name).read_bytes() == (same / rank / name).read_bytes()
                        assert os.getxattr(big / rank / name, "user.mmfs.samples") == \
                            os.getxattr(same / rank / name, "user.mmfs.samples")
        too_far = streams / f"dp=2,mbs=4,from={2**64 * active},sampler=cyclic"
        with pytest.raises(OSError) as exc:
            os.stat(too_far)
        assert exc.value.errno == errno.ENOENT
        assert "which takes at most 2**64 - 1" in m.log.read_text()


def test_bad_spellings_through_the_mount_are_enoent_and_one_log_line(tmp_path):
    with mounted(_mount_config("p2_blend2_u16", tmp_path), tmp_path / "mnt") as m:
        streams = m.path / "valid" / "streams"
        bad = ["dp=2,mbs=1", "dp=02,mbs=1,from=0", "dp=2,mbs=1,from=0,sharding=yes", "dp=16385,mbs=1,from=0",
               "dp=3,mbs=1,from=4,sampler=cyclic"]  # 4 into the epoch, not a multiple of 3
        for name in bad:
            for _ in range(2):  # a second lookup logs nothing new
                with pytest.raises(OSError) as exc:
                    os.stat(streams / name)
                assert exc.value.errno == errno.ENOENT
        good = streams / "dp=3,mbs=1,from=3,sampler=cyclic"
        assert len(os.listdir(good / "000")) == 32  # (99 - 3) / 3 for each rank
        lines = [ln for ln in m.log.read_text().splitlines() if "no such stream" in ln]
        assert len(lines) == len(bad), lines
        assert "not a multiple of micro_batch_size x data_parallel_size = 3" in lines[-1]
        assert "data_parallel_size must be 1 to 16384" in lines[3]


def test_layouts_held_are_bounded(tmp_path):
    from mmfs.mount import streams
    with mounted(_mount_config("p2_blend2_u16", tmp_path), tmp_path / "mnt") as m:
        base = m.path / "valid" / "streams"
        first = (base / "dp=1,mbs=1,from=0" / "000" / "0000000.bin").read_bytes()
        for k in range(streams.MAX_LAYOUTS + 5):
            assert (base / f"dp=1,mbs=1,from={k + 1}" / "000" / "0000000.bin").exists()
        # dropped, made again on the next lookup, same bytes
        assert (base / "dp=1,mbs=1,from=0" / "000" / "0000000.bin").read_bytes() == first
        assert np.frombuffer(first, dtype=np.uint16).size > 0


def test_the_least_recently_used_layout_is_dropped(tmp_path):
    from mmfs.megatron import open_corpus
    from mmfs.mount import streams

    s = streams.Streams(open_corpus(_mount_config("p2_blend2_u16", tmp_path)), 0)
    names = [f"dp=1,mbs=1,from={k}" for k in range(streams.MAX_LAYOUTS)]
    held = [s.layout("valid", n) for n in names]
    assert s.layout("valid", names[0]) is held[0]  # used again: now the most recent
    s.layout("valid", "dp=1,mbs=1,from=99")
    assert s.layout("valid", names[0]) is held[0]
    assert s.layout("valid", names[1]) is not held[1]  # dropped, made again
    assert len(s.registry.views) == streams.MAX_LAYOUTS  # every rank view of the layouts held


def test_permutations_held_are_bounded_in_bytes(tmp_path, monkeypatch):
    from mmfs.megatron import open_corpus
    from mmfs.mount import streams

    s = streams.Streams(open_corpus(_mount_config("p2_blend2_u16", tmp_path)), 0)
    monkeypatch.setattr(streams, "MAX_PERMUTATION_BYTES", 3 * 400)  # three permutations of 100 int32 ids
    names = [f"dp=1,mbs=1,from={k},sampler=cyclic,sharding=false" for k in range(5)]
    held = [s.layout("valid", n) for n in names]
    assert [lay.plan.permutation.nbytes for lay in held] == [400] * 5
    assert len(s.registry.views) == 3  # the last three
    assert s.layout("valid", names[4]) is held[4] and s.layout("valid", names[0]) is not held[0]
