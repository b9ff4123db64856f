"""mmfs.loader.Mount(CONFIG): a config's mount served in the training process through
the C core, no FUSE (mmfs/mount/inprocess.py). The reference matrix compares it with a
mount of every cell (tests/test_matrix.py); here: where no FUSE device exists at all,
a check that finds a different config, its answers where the mount answers ENOENT or
EIO, a config that does not open, threads, and the provider named by MMFS_MOUNT."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from tiny_blends import write_tiny_blend

import matrix_cases as mc
from golden_cases import write_case_config
from matrix_mounts import differences, write_config, write_data
from matrix_reference import Cell
from mmfs.adapters.megatron import mount_datasets_provider
from mmfs.errors import MmfsError
from mmfs.loader import LoaderError, Mount
from mmfs.megatron import open_corpus
from mmfs.mount.contract import XATTR_PIECES
from mmfs.storage import localfiles
from mount_fixtures import ROOT, mounted

CELL = "single/restart/constant"  # phases, their own valid and test, train/beyond/


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """A matrix cell's config, mounted."""
    folder = tmp_path_factory.mktemp("in-process")
    write_data(folder / "data")
    config = write_config(CELL, "local", folder, folder / "cell")
    with mounted(config, folder / "mnt") as m:
        yield config, Mount(m.path)


def test_a_different_config_is_found_different(matrix, tmp_path):
    """The check the matrix runs can fail: a config with another seed, served in-process,
    differs from the mount in its samples, micro-batches and attributes."""
    config, mount = matrix
    changed = yaml.safe_load(config.read_text())
    changed["seed"] = mc.SEED + 1
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(changed, sort_keys=False))
    found = differences(mount, Mount(other), Cell(CELL))
    assert any("samples/" in d and "other bytes" in d for d in found)
    assert any("ranks/" in d for d in found) and any(XATTR_PIECES in d for d in found)
    assert differences(mount, Mount(config), Cell(CELL)) == []


def test_without_a_fuse_device_the_config_reads_what_the_mount_serves(matrix):
    """In a process whose /dev/fuse is gone (a private mount namespace, as a container
    without the device), Mount(CONFIG) reads every train, valid and test sample, the
    same bytes as the mount; no FUSE binding is loaded, no mount made."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root to hide /dev/fuse")
    config, mount = matrix
    digest = hashlib.sha256()
    for split, n in mount.samples.items():
        for i in range(n):
            digest.update(mount.sample(split, i).tobytes())
    code = ("import hashlib, os, sys; from mmfs.loader import Mount\n"
            "assert not os.path.exists('/dev/fuse')\n"
            "mounts = open('/proc/self/mountinfo').read()\n"
            f"m = Mount({str(config)!r}); d = hashlib.sha256()\n"
            "for split, n in m.samples.items():\n"
            "    for i in range(n): d.update(m.sample(split, i).tobytes())\n"
            "print(d.hexdigest(), 'fuse' in sys.modules, open('/proc/self/mountinfo').read() != mounts)\n")
    hide = f"umount /dev/fuse 2>/dev/null; mount -t tmpfs none /dev && exec {sys.executable} -c \"$0\""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, code],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [digest.hexdigest(), "False", "False"]


def test_a_missing_stream_or_sample_is_the_same_one_line(matrix):
    """What the mount answers ENOENT for, the in-process files answer the same way, and the
    loader says the same line (but for the path)."""
    config, mount = matrix
    local = Mount(config)
    for m, why in ((mount, "the mount's log says why"), (local, "mbs=100000 is above the split's 240 samples")):
        with pytest.raises(LoaderError, match="no such stream") as exc:
            m.stream_files("train", 0, 1, 100_000, 0)  # more samples to a micro-batch than the split has
        assert why in str(exc.value)
        with pytest.raises(LoaderError, match=r"sample 100000 is outside \[0, "):
            m.sample("train", 100_000)
    with pytest.raises(FileNotFoundError):
        local.files.read(os.path.join(str(config), "train", "samples", "9999999.bin"))
    with pytest.raises(IsADirectoryError):
        local.files.read(os.path.join(str(config), "train"))
    with pytest.raises(OSError) as exc:
        local.files.getxattr(os.path.join(str(config), "mmfs.json"), XATTR_PIECES)
    assert exc.value.errno == errno.ENODATA
    with pytest.raises(FileNotFoundError):
        local.files.read(os.path.join(os.path.dirname(str(config)), "elsewhere"))
    # the symbolic links of the mount's root are followed, as the kernel follows them
    assert local.files.read(os.path.join(str(config), "samples", "0000000.bin")) == \
        mount.files.read(os.path.join(mount.path, "samples", "0000000.bin"))


def test_a_dataset_changed_under_the_process_is_one_line_never_its_new_bytes(tmp_path):
    """As under a mount with -o map_limit_mb=0,open_files=8 (test_open_files.py): a
    dataset's token file rewritten in place (same size) after Mount(CONFIG, options)
    read from it; once the other datasets' files pushed it out of the cap, every read
    that opens it again fails in one line naming the file, never returning its new bytes."""
    config = write_tiny_blend(tmp_path, 12, documents=40)
    corpus = open_corpus(config, progress=False)
    want = {i: corpus.splits["train"].read(i) for i in range(len(corpus.splits["train"]))}
    del corpus
    try:
        m = Mount(config, options="map_limit_mb=0,open_files=8")
        samples = [m.sample_path("train", i) for i in range(len(want))]
        owners = {i: m.attribute(samples[i], "user.mmfs.dataset") for i in want}
        first = [i for i in want if owners[i] == owners[0]]
        others = [i for i in want if owners[i] != owners[0]]
        assert m.sample("train", first[0]).tobytes() == want[first[0]]
        token_file = str(tmp_path / f"{owners[0]}.bin")
        with open(token_file, "r+b") as f:
            f.write(b"\xff" * os.path.getsize(token_file))
        for i in others[:60]:  # their files push the changed one out of the cap of 8
            assert m.sample("train", i).tobytes() == want[i]
        for i in first[1:]:
            with pytest.raises(LoaderError) as exc:
                m.sample("train", i)
            line = str(exc.value)
            assert f"{os.path.realpath(token_file)} changed since" in line and "\n" not in line, line
        for i in others[60:]:  # the rest is served as before
            assert m.sample("train", i).tobytes() == want[i]
    finally:
        localfiles.set_limit(localfiles.DEFAULT_OPEN_FILES)  # the cap is the process's


def test_options_of_the_daemon_are_refused_in_one_line(matrix, tmp_path):
    config, mount = matrix
    with pytest.raises(MmfsError, match="-o allow_other: not an option of a config read in this process"):
        Mount(config, options="allow_other")
    with pytest.raises(LoaderError, match="apply to a config read in this process"):
        Mount(mount.path, options="open_files=8")


def test_a_config_that_does_not_open_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: [{path: /nonexistent/x}]\nsequence_length: 8\n")
    with pytest.raises(MmfsError) as exc:
        Mount(bad)
    assert "\n" not in str(exc.value) and "/nonexistent/x" in str(exc.value)
    args = SimpleNamespace(dataloader_type="external", seq_length=8, micro_batch_size=1, global_batch_size=1,
                           consumed_train_samples=0, consumed_valid_samples=0)
    provider = mount_datasets_provider(bad, get_args=lambda: args, data_parallel=lambda: (0, 1))
    with pytest.raises(SystemExit) as exit_:
        provider([1, 0, 0])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("mmfs: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_threads_read_the_same_bytes_and_mounts_share_one_tree(matrix):
    """grain reads from threads: every sample read at once from 8 threads is the mount's;
    two Mounts of one config share the opened config (one Tree)."""
    config, mount = matrix
    local = Mount(config)
    assert Mount(config).files.tree is local.files.tree
    ids = [(s, i) for s, n in mount.samples.items() for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda si: local.sample(*si).tobytes(), ids))
    assert got == [mount.sample(s, i).tobytes() for s, i in ids]


def test_mmfs_mount_may_name_a_config(tmp_path):
    """The provider as docs/megatron.md wires it, mount_datasets_provider(os.environ["MMFS_MOUNT"]),
    with MMFS_MOUNT naming a config: a fresh process, numpy and the C core, no mount."""
    config = write_case_config("p2_blend2_u16", tmp_path / "config")
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": 4, "micro_batch_size": 2, "global_batch_size": 16}
    config.write_text(yaml.safe_dump(raw))
    with mounted(config, tmp_path / "mnt") as m:
        want = _first_batches(m.path)
    code = ("import json, os, types; from mmfs.adapters.megatron import mount_datasets_provider\n"
            "args = types.SimpleNamespace(dataloader_type='external', seq_length=128, micro_batch_size=2,"
            " global_batch_size=16, consumed_train_samples=32, consumed_valid_samples=0)\n"
            "p = mount_datasets_provider(os.environ['MMFS_MOUNT'], get_args=lambda: args,"
            " data_parallel=lambda: (1, 4), to_tensor=lambda a: a)\n"
            "train, valid, test = p([1200, 0, 0])\n"
            "print(json.dumps([{k: v.tolist() for k, v in next(train).items()} for _ in range(3)]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MMFS_MOUNT=str(config))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == want


def _first_batches(path) -> list[dict]:
    args = SimpleNamespace(dataloader_type="external", seq_length=128, micro_batch_size=2, global_batch_size=16,
                           consumed_train_samples=32, consumed_valid_samples=0)
    train, _valid, _test = mount_datasets_provider(path, get_args=lambda: args, data_parallel=lambda: (1, 4),
                                                   to_tensor=lambda a: a)([1200, 0, 0])
    return [{k: np.asarray(v).tolist() for k, v in next(train).items()} for _ in range(3)]
