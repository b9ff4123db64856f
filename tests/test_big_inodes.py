"""Datasets on a file system whose inode numbers are at and above 2^63 (rclone's, other
FUSE and network file systems'): stat's st_ino is unsigned 64-bit, and mmfs holds a
file's identity (size, mtime, inode) unsigned wherever it keeps or compares it. A
golden blend served by such a file system builds, mounts and serves megatron-core's
samples exactly; a dataset file replaced there is still caught (EIO, a log line)."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
import yaml
from big_inode_fs import TOP, serving
from tiny_blends import write_tiny_blend

from golden_cases import GOLDEN, SPLITS, expected_samples, write_case_config
from mmfs.megatron import open_corpus
from mount_fixtures import force_unmount, is_mounted, mmfs, mounted, wait_for, wait_gone

CASE = "p2_blend2_u16"  # a weighted blend of two uint16 datasets, every split


def _golden_on(folder, tmp_path):
    """The case's config, its `data` link pointing at `folder` (a copy of golden/data)."""
    config = write_case_config(CASE, tmp_path / "case")
    (tmp_path / "case" / "data").unlink()
    (tmp_path / "case" / "data").symlink_to(folder, target_is_directory=True)
    return config


def _assert_exact(mount_path) -> None:
    for split in SPLITS:
        rows = expected_samples(CASE, split)
        if rows is None:
            continue
        folder = mount_path / split / "samples"
        assert len(os.listdir(folder)) == len(rows)
        got = [(folder / f"{i:07d}.bin").read_bytes() for i in range(len(rows))]
        assert got == [r.astype(np.uint16).tobytes() for r in rows], split


def test_a_golden_blend_on_inodes_above_2_63_mounts_and_serves_exactly(tmp_path):
    shutil.copytree(GOLDEN / "data", tmp_path / "src")
    with serving(tmp_path / "src", tmp_path / "big") as big:
        inodes = {name: os.stat(big / name).st_ino for name in os.listdir(big)}
        assert min(inodes.values()) >= 1 << 63 and max(inodes.values()) == TOP, inodes
        config = _golden_on(big, tmp_path)
        built = mmfs("build", config)
        assert built.returncode == 0 and "Traceback" not in built.stderr, built.stderr
        for options in ((), ("-o", "map_limit_mb=0")):  # arrays copied, then every array read with pread
            with mounted(config, tmp_path / "mnt", *options) as m:
                _assert_exact(m.path)
        # A re-open from the record (the derived mmfs.json beside it, keyed by identities) serves the same.
        with mounted(config, tmp_path / "mnt") as m:
            _assert_exact(m.path)
            assert (m.path / "mmfs.json").read_bytes()


def test_a_replaced_file_on_big_inodes_is_still_caught(tmp_path):
    """Under a cap of 8 open files, a dataset's token file replaced in the folder the
    file system serves (a new inode there, so a new number near 2^64 here): the next
    read that opens it again gets EIO and a log line, never its new bytes."""
    src = tmp_path / "src"
    src.mkdir()
    plain = write_tiny_blend(src, 12, documents=40)
    split = open_corpus(plain, progress=False).splits["train"]
    want = {i: split.read(i) for i in range(len(split))}
    with serving(src, tmp_path / "big") as big:
        raw = yaml.safe_load(open(plain).read())
        for entry in raw["datasets"]:
            entry["path"] = str(big / os.path.basename(entry["path"]))
        (tmp_path / "cfg").mkdir()
        config = tmp_path / "cfg" / "blend.yaml"
        config.write_text(yaml.safe_dump(raw))
        assert os.stat(big / "ds0.bin").st_ino >= 1 << 63
        with mounted(config, tmp_path / "mnt", "-o", "map_limit_mb=0,open_files=8") as m:
            samples = m.path / "train" / "samples"
            owners = {i: os.getxattr(samples / f"{i:07d}.bin", "user.mmfs.dataset").decode() for i in want}
            victim = owners[0]
            first = [i for i in want if owners[i] == victim]
            assert (samples / f"{first[0]:07d}.bin").read_bytes() == want[first[0]]
            token_file = src / f"{victim}.bin"
            before = os.stat(big / token_file.name).st_ino
            (src / "new.bin").write_bytes(b"\xff" * token_file.stat().st_size)
            os.replace(src / "new.bin", token_file)
            assert os.stat(big / token_file.name).st_ino not in (before, 0)
            others = [i for i in want if owners[i] != victim]
            for i in others[:60]:  # their files push the victim's out of the cap of 8
                assert (samples / f"{i:07d}.bin").read_bytes() == want[i]
            failed = 0
            for i in first[1:]:
                try:
                    data = (samples / f"{i:07d}.bin").read_bytes()
                except OSError as exc:
                    assert exc.errno == 5  # EIO
                    failed += 1
                    continue
                assert data == want[i]  # never the new bytes
            assert failed == len(first) - 1
            assert f"{big / token_file.name} changed since the mount" in m.log.read_text()


def test_a_golden_blend_on_an_rclone_mount(tmp_path):
    """rclone's own mount of a local folder (no cache: every read goes to the folder)."""
    rclone = shutil.which("rclone")
    if rclone is None:
        pytest.skip("rclone is not installed")
    shutil.copytree(GOLDEN / "data", tmp_path / "src")
    target = tmp_path / "rc"
    target.mkdir()
    log = tmp_path / "rclone.log"  # a file: a pipe nobody reads could fill and block it
    with open(log, "wb") as out:
        proc = subprocess.Popen([rclone, "mount", "--config", str(tmp_path / "rclone.conf"), "--read-only",
                                 "--vfs-cache-mode", "off", str(tmp_path / "src"), str(target)],
                                stdout=out, stderr=out)
    try:
        wait_for(lambda: is_mounted(target) and os.path.exists(target / "u16_docs.idx") or proc.poll() is not None,
                 "rclone mounts")
        assert proc.poll() is None, log.read_text()
        # rclone's inode numbers are hashes of the names: u16_docs.bin's and u16_small.idx's are above 2^63.
        inodes = [os.stat(target / name).st_ino for name in ("u16_docs.bin", "u16_docs.idx", "u16_small.bin",
                                                             "u16_small.idx")]
        assert max(inodes) >= 1 << 63, inodes
        config = _golden_on(target, tmp_path)
        with mounted(config, tmp_path / "mnt") as m:
            _assert_exact(m.path)
    finally:
        force_unmount(target)
        if not wait_gone(proc.pid, 30):
            proc.kill()
        proc.wait()
