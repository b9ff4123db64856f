"""mmfs.adapters.megatron_copy from a config instead of a mount point: the config's
files served in the copying process (mmfs/mount/inprocess.py), read through the
Mount's file interface. A copy made from the config is byte for byte the copy made
from a mount of it (micro-batch files, mmfs.json, mmfs-attributes.json and the
manifest mmfs-copy.json), for a single-sampler job reading train, valid and test and
for a relaunch of a run in phases reading phase 1's own valid and test, cyclic passes
included; a copy from a config cut short by a failed read is one line and leaves a
folder the loader refuses as incomplete, and copying again completes it."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_megatron_provider import DATA, megatron_args, provide

from golden_cases import write_case_config
from mmfs.adapters.megatron import rank_stream_files
from mmfs.adapters.megatron_copy import copy_files, copy_job_files
from mmfs.loader import COPIED_ATTRIBUTES, LoaderError, Mount
from mmfs.loader.copy_check import COPY_MANIFEST
from mount_fixtures import mount_in

DP, MBS = 2, 2


def _blend() -> dict:
    return {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0}, "cache_dir": "cache",
            "training": {"data_parallel_size": DP, "micro_batch_size": MBS, "global_batch_size": 8,
                         "train_iters": 30, "eval_interval": 10, "eval_iters": 2, "dataloader_type": "cyclic"},
            "phase_mode": "restart",
            "phases": [{"datasets": [{"path": str(DATA / "u16_docs"), "weight": 0.7},
                                     {"path": str(DATA / "u16_multiseq"), "weight": 0.3}]},
                       {"start_iteration": 10, "datasets": [{"path": str(DATA / "u16_small"), "weight": 0.5},
                                                            {"path": str(DATA / "u16_docs"), "weight": 0.5}]}]}


# name -> (a config's text, the reads a job's copy takes: split -> (mbs, from, micro-batches[, phase]))
JOBS = {
    "single": ("golden", {"train": (MBS, 8, 6), "valid": (MBS, 0, 2), "test": (MBS, 0, 1)}),
    # the relaunch at phase 1 (sample 80): train on past the cyclic pass's end, phase 1's own valid and test
    "phased": ("phased", {"train": (MBS, 80, 45), "valid": (MBS, 0, 3, 1), "test": (MBS, 0, 2, 1)}),
}


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """name -> (the config file, a Mount of its mount point)."""
    made: dict[str, tuple[Path, Mount]] = {}
    with contextlib.ExitStack() as stack:
        for name, (kind, _reads) in JOBS.items():
            base = tmp_path_factory.mktemp(f"copy-{name}")
            if kind == "golden":
                config = write_case_config("p2_blend2_u16", base / "config")
                raw = yaml.safe_load(config.read_text())
                raw["training"] = {"data_parallel_size": DP, "micro_batch_size": MBS, "global_batch_size": 8}
                config.write_text(yaml.safe_dump(raw, sort_keys=False))
            else:
                config = base / "run.yaml"
                config.write_text(yaml.safe_dump(_blend()))
            made[name] = (config, Mount(mount_in(stack, config, base / "mnt")))
        yield made


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under folder (path relative to it: its bytes), and every folder (as None)."""
    found: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            found[os.path.relpath(os.path.join(root, d), folder)] = None
        for f in files:
            found[os.path.relpath(os.path.join(root, f), folder)] = Path(root, f).read_bytes()
    return found


@pytest.mark.parametrize("name", list(JOBS))
def test_a_copy_from_the_config_is_the_copy_from_its_mount(configs, tmp_path, name):
    config, mount = configs[name]
    reads = JOBS[name][1]
    from_mount = copy_job_files(mount.path, tmp_path / "from-mount", DP, reads)
    from_config = copy_job_files(config, tmp_path / "from-config", DP, reads)
    assert from_config == from_mount and from_mount["files"] == DP * sum(r[2] for r in reads.values())
    want, got = tree(tmp_path / "from-mount"), tree(tmp_path / "from-config")
    assert sorted(got) == sorted(want) and {"mmfs.json", COPIED_ATTRIBUTES, COPY_MANIFEST} <= set(got)
    assert [p for p in want if got[p] != want[p]] == []
    if name == "phased":  # the cyclic train stream was copied into its next pass, phase 1's own splits too
        assert sum(p.startswith("train/streams/") and want[p] is None and "from=" in p for p in want) >= 2
        assert any(p.startswith("valid/phases/001/streams/") and p.endswith(".bin") for p in want)


def test_the_provider_reads_a_copy_from_the_config_as_the_mount(configs, tmp_path):
    config, mount = configs["single"]
    copy_job_files(config, tmp_path / "copy", DP, JOBS["single"][1])
    args = megatron_args(seq_length=mount.sequence_length, micro_batch_size=MBS, global_batch_size=8,
                         consumed_train_samples=8, dataloader_inter_document_masking=True)
    samples = (8 + 6 * DP * MBS, 2 * DP * MBS, DP * MBS)
    for rank in range(DP):
        on_mount = provide(mount.path, args, rank, DP, samples)
        on_copy = provide(tmp_path / "copy", args, rank, DP, samples)
        for a, b, count in zip(on_mount, on_copy, (6, 2, 1), strict=True):
            got, want = list(itertools.islice(b, count + 1)), list(itertools.islice(a, count))
            assert len(got) == len(want) == count
            assert all(np.array_equal(x[k], y[k]) for x, y in zip(got, want) for k in y)


def test_a_copy_from_a_config_cut_short_is_refused_and_copying_again_completes_it(configs, tmp_path):
    """A read that fails in the middle of a copy (here: a file the config's mount does
    not serve) is the loader's one line; the folder has no manifest, so the loader
    refuses it as incomplete; a copy made again into it equals a copy from the mount."""
    config, mount = configs["single"]
    source = Mount(config)
    files = list(itertools.islice(rank_stream_files(source, "train", 0, DP, MBS, 0), 4))
    missing = os.path.join(os.path.dirname(files[-1]), "9999999.bin")
    dest = tmp_path / "copy"
    with pytest.raises(LoaderError) as exc:
        copy_files(source, dest, [*files, missing])
    assert str(exc.value).startswith(f"{missing}: cannot read it: ") and "\n" not in str(exc.value)
    assert not (dest / COPY_MANIFEST).exists() and (dest / "train").is_dir()
    with pytest.raises(LoaderError, match="not a complete copy of one"):
        Mount(dest)
    reads = {"train": (MBS, 0, 4)}
    copy_job_files(config, dest, DP, reads)
    copy_job_files(mount.path, tmp_path / "from-mount", DP, reads)
    assert tree(dest) == tree(tmp_path / "from-mount")
    assert len(Mount(dest).stream_files("train", 0, DP, MBS, 0)) == 4
