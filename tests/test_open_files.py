"""A constant number of open files whatever the blend: the C core's table of the
files it reads with pread (opened on first use, the least recently used closed
beyond a cap, each checked to be the same file whenever it is opened again),
maps that hold no descriptor, and a mount of many datasets under the usual
`ulimit -n 1024`. Every test counts what the code decides (descriptors open,
opens, closes, refusals), never how long anything took."""

from __future__ import annotations

import errno
import os
import re
import resource
import subprocess
import sys

import numpy as np
import pytest
import yaml
from tiny_blends import write_tiny_blend

from mmfs.errors import NativeError
from mmfs.megatron import open_corpus
from mmfs.storage import localfiles
from mount_fixtures import Mount, mmfs, stop_mount

LIMIT = 1024  # the soft limit of most Linux systems


def _at_most(files: int):
    """For a child: a soft limit of `files` open files (the hard one as it is)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return limit


def mount_limited(config, mountpoint, *options: str, files: int = LIMIT) -> Mount:
    """`mmfs mount` run under `ulimit -n files` (its daemon inherits it)."""
    mountpoint.mkdir()
    log = mountpoint.parent / f"{mountpoint.name}.log"
    proc = mmfs("mount", config, mountpoint, "--log", log, *options, preexec_fn=_at_most(files))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return Mount(mountpoint, int(re.search(r"daemon pid (\d+)", proc.stdout).group(1)), log, config)


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """1,500 tiny datasets in one blend, built once (its index cache: 3,002 indices,
    9,006 index files beside 3,000 dataset files)."""
    folder = tmp_path_factory.mktemp("many")
    config = write_tiny_blend(folder, 1500, documents=20)
    corpus = open_corpus(config, progress=False)  # builds the cache; every array mapped, no descriptor held
    want = {split: {i: r.read(i) for i in range(0, len(r), 3)} for split, r in corpus.splits.items()}
    return config, want


@pytest.mark.parametrize("options", [(), ("-o", "map_limit_mb=0,open_files=16")], ids=["default", "pread-16"])
def test_a_blend_of_many_datasets_mounts_and_serves_under_ulimit_1024(many, tmp_path, options):
    """Before the open-files table the daemon held 8 descriptors per dataset: 12,000
    here, and `mmfs mount` failed with a traceback under `ulimit -n 1024`. Read with
    pread (map_limit_mb=0) through a cap of 16, every dataset's files are opened and
    closed again and again, and every sample is exact."""
    config, want = many
    m = mount_limited(config, tmp_path / "mnt", *options)
    try:
        cap = 16 if options else localfiles.DEFAULT_OPEN_FILES
        for split, samples in want.items():
            for i, data in samples.items():
                assert (m.path / split / "samples" / f"{i:07d}.bin").read_bytes() == data, (split, i)
        held = descriptors(m.pid)
        assert held <= cap + localfiles.RESERVE
        if options:  # the cap is what bounds them: 16 dataset and index files at most
            assert held <= 16 + 12
        assert "ERROR" not in m.log.read_text()
    finally:
        stop_mount(m)


def test_the_table_keeps_its_cap_and_refuses_a_changed_file(tmp_path):
    """In process: 40 files read through a cap of 4; one replaced by another of the
    same size (a rename) and one rewritten in place are refused when they are
    opened again, never read."""
    paths = []
    for k in range(40):
        path = tmp_path / f"f{k}"
        path.write_bytes(bytes([k]) * 100)
        paths.append(str(path))
    before = localfiles.counts()
    files = [localfiles.register(p, None) for p in paths]
    try:
        localfiles.set_limit(4)
        for _ in range(2):
            for k, file in enumerate(files):
                with localfiles.descriptor(file) as fd:
                    assert os.pread(fd, 1, 50) == bytes([k])
                assert localfiles.counts().open <= 4
        after = localfiles.counts()
        assert after.opened - before.opened == 80  # every file opened twice: the cap closed it between
        assert after.closed - before.closed == 76
        (tmp_path / "new").write_bytes(b"x" * 100)
        os.replace(tmp_path / "new", paths[0])  # a new inode, the same size
        with open(paths[1], "r+b") as f:  # the same inode, new bytes and mtime
            f.write(b"y" * 100)
        os.utime(paths[1], ns=(0, 0))
        for k in (0, 1):
            with pytest.raises(OSError, match=f"f{k}: changed since it was read"):
                with localfiles.descriptor(files[k]):
                    pass
        assert localfiles.counts().changed - before.changed == 2
        with localfiles.descriptor(files[2]) as fd:  # the others are still served
            assert os.pread(fd, 1, 0) == b"\x02"
    finally:
        for file in files:
            localfiles.forget(file)
        localfiles.set_limit(localfiles.DEFAULT_OPEN_FILES)
    assert localfiles.counts().known == before.known


def test_maps_hold_no_descriptor(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(10_000, dtype=np.int64))
    held = len(os.listdir("/proc/self/fd"))
    maps = [localfiles.map_npy(str(tmp_path / "a.npy")) for _ in range(200)]
    assert len(os.listdir("/proc/self/fd")) == held
    assert all(int(m[1234]) == 1234 for m in maps)
    assert localfiles.mapped_region(maps[0][10:20]) == (str(tmp_path / "a.npy"), 128 + 80)


def _owner(m: Mount, split: str, i: int) -> str:
    return os.getxattr(m.path / split / "samples" / f"{i:07d}.bin", "user.mmfs.dataset").decode()


@pytest.mark.parametrize("how", ["replaced", "rewritten"])
def test_a_dataset_changed_under_the_mount_is_eio_never_its_new_bytes(tmp_path, how):
    """Under a cap of 8 files, a dataset's token file replaced (a new file renamed
    over it) or rewritten in place (same size) while it is closed: the next read
    that opens it again gets EIO and a log line naming the file; no read returns
    the new bytes; the other datasets are served."""
    config = write_tiny_blend(tmp_path, 12, documents=40)
    corpus = open_corpus(config, progress=False)
    split = corpus.splits["train"]
    want = {i: split.read(i) for i in range(len(split))}
    m = mount_limited(config, tmp_path / "mnt", "-o", "map_limit_mb=0,open_files=8")
    try:
        samples = m.path / "train" / "samples"
        owners = {i: _owner(m, "train", i) for i in range(len(split))}
        victim = owners[0]
        first = [i for i in want if owners[i] == victim]
        assert (samples / f"{first[0]:07d}.bin").read_bytes() == want[first[0]]
        token_file = str(tmp_path / f"{victim}.bin")
        size = os.path.getsize(token_file)
        if how == "replaced":
            (tmp_path / "new.bin").write_bytes(b"\xff" * size)
            os.replace(tmp_path / "new.bin", token_file)
        else:
            with open(token_file, "r+b") as f:
                f.write(b"\xff" * size)
        # Samples of the other datasets: their files push the victim's out of the cap of 8.
        others = [i for i in want if owners[i] != victim]
        for i in others[:60]:
            assert (samples / f"{i:07d}.bin").read_bytes() == want[i]
        failed = 0
        for i in first[1:]:
            try:
                data = (samples / f"{i:07d}.bin").read_bytes()
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed += 1
                continue
            assert data == want[i]  # never the new bytes
        assert failed == len(first) - 1
        log = m.log.read_text()
        assert f"{os.path.realpath(token_file)} changed since the mount" in log
        for i in others[60:]:  # the rest is served as before
            assert (samples / f"{i:07d}.bin").read_bytes() == want[i]
    finally:
        stop_mount(m)


def test_too_low_a_limit_for_a_mount_is_one_line(tmp_path):
    config = write_tiny_blend(tmp_path, 4, documents=20)
    (tmp_path / "mnt").mkdir()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def tiny() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))

    proc = mmfs("mount", config, tmp_path / "mnt", "--log", tmp_path / "log", preexec_fn=tiny)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line, = proc.stderr.strip().splitlines()[-1:]
    assert "needs about" in line and "`ulimit -n` allows 24" in line and "ulimit -n 2" in line
    assert not os.listdir(tmp_path / "mnt") and hard


def test_a_low_soft_limit_is_raised_for_the_mount_and_said_once(tmp_path):
    config = write_tiny_blend(tmp_path, 4, documents=20)
    m = mount_limited(config, tmp_path / "mnt", files=100)
    try:
        limits = open(f"/proc/{m.pid}/limits").read()
        soft = int(re.search(r"Max open files\s+(\d+)", limits).group(1))
        assert soft >= localfiles.DEFAULT_OPEN_FILES + localfiles.RESERVE
    finally:
        stop_mount(m)


def _restart_phases(folder, phases: int) -> str:
    write_tiny_blend(folder, 4, documents=200)
    paths = [str(folder / f"ds{d}") for d in range(4)]
    config = folder / "phases.yaml"
    config.write_text(yaml.safe_dump({
        "phases": [{"datasets": [{"path": paths[(k + j) % 4], "weight": 1.0 + (k * 7 + j) % 5} for j in range(2)],
                    **({"start_samples": 10 * k} if k else {})} for k in range(phases)],
        "phase_mode": "restart", "datasets": [{"path": paths[0], "weight": 1}],
        "split": "90,10,0", "samples": {"train": 10 * phases, "valid": 50, "test": 0},
        "sequence_length": 16, "tokenizer": {"eod": 0}, "cache_dir": "cache"}))
    return str(config)


def test_700_restart_phases_build_and_mount_under_ulimit_1024(tmp_path):
    """Each restart phase has its own blend: 700 of them held 1,400 descriptors (their
    maps) and `build`, `phases`, `report --json` and `mount` failed with a traceback."""
    config = _restart_phases(tmp_path, 700)
    for command in (["build"], ["phases"], ["report", "--json"]):
        proc = mmfs(*command, config, preexec_fn=_at_most(LIMIT))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr[-2000:])
    corpus = open_corpus(config, progress=False)
    train = corpus.splits["train"]
    m = mount_limited(config, tmp_path / "mnt")
    try:
        for i in range(0, len(train), 97):
            assert (m.path / "train" / "samples" / f"{i:07d}.bin").read_bytes() == train.read(i)
        assert descriptors(m.pid) <= localfiles.DEFAULT_OPEN_FILES + localfiles.RESERVE
    finally:
        stop_mount(m)


# `mmfs ARGS` twice in one process: once to import all it needs, then with every
# descriptor taken, so that the command's first open of the config fails (a launcher
# that leaks descriptors to its children does the same).
RUN_OUT = """
import os, sys
from mmfs.cli import main
main(sys.argv[1:])
keep = []
while True:
    try:
        keep.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [["build"], ["phases"], ["report", "--json"]])
def test_running_out_of_descriptors_is_one_line(tmp_path, command):
    """A command that finds no descriptor left: one line naming the file, `ulimit -n`
    and a count to set it to, exit 2, never a traceback (nor "no dataset here")."""
    config = _restart_phases(tmp_path, 3)
    proc = subprocess.run([sys.executable, "-c", RUN_OUT, *command, config], capture_output=True,
                          text=True, preexec_fn=_at_most(256))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line == (f"mmfs: error: {config}: too many open files (`ulimit -n` is 256); raise it, e.g. "
                    "`ulimit -n 1024`, and run again")
    assert "Traceback" not in proc.stderr


def _rewrite_in_place(path: str, keep_mtime: bool) -> None:
    """New bytes into the same file: the same size and inode (a writer re-run into the
    same path); keep_mtime puts the old modification time back, as `cp -p` would."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        new = bytes(255 - b for b in f.read())
        f.seek(0)
        f.write(new)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size) == (st.st_ino, st.st_size)
    assert (after.st_mtime_ns == st.st_mtime_ns) == keep_mtime


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["new-mtime", "old-mtime-put-back"])
def test_a_file_rewritten_in_place_while_open_is_refused_in_process(tmp_path, keep_mtime):
    """The token file of a dataset read with pread stays open in the table (a blend of
    4 datasets, cap 256); rewritten in place, the same size and inode, every read after
    it fails with "changed since the mount", never its new bytes, also when the writer
    put the old mtime back (its change time moved)."""
    config = write_tiny_blend(tmp_path, 4, documents=40)
    want = open_corpus(config, progress=False).splits["train"]
    want = {i: want.read(i) for i in range(len(want))}
    split = open_corpus(config, progress=False, map_limit_mb=0).splits["train"]
    assert all(split.read(i) == want[i] for i in want)  # every file opened now, and left open
    before = localfiles.counts()
    for d in range(4):
        _rewrite_in_place(str(tmp_path / f"ds{d}.bin"), keep_mtime)
    for _ in range(2):  # every time, not only the first
        for i in range(len(want)):
            with pytest.raises(NativeError, match=r"ds\d\.bin changed since the mount"):
                split.read(i)
    after = localfiles.counts()
    assert after.opened == before.opened  # refused on the descriptors open all along
    assert after.changed - before.changed >= 2 * len(want)


def test_a_file_rewritten_in_place_while_open_is_eio_under_a_mount(tmp_path):
    """The probe's case: a mount reading with pread (map_limit_mb=0), every file of the
    blend in its open-files table (4 datasets under the cap of 256); a dataset's token
    file rewritten in place (same size and inode, new mtime) while open: every read of
    its samples not read before gets EIO, every time, and the log names the file; the
    other datasets are served."""
    config = write_tiny_blend(tmp_path, 4, documents=40)
    split = open_corpus(config, progress=False).splits["train"]
    want = {i: split.read(i) for i in range(len(split))}
    m = mount_limited(config, tmp_path / "mnt", "-o", "map_limit_mb=0")
    try:
        samples = m.path / "train" / "samples"
        owners = {i: _owner(m, "train", i) for i in want}
        victim = owners[0]
        assert (samples / f"{0:07d}.bin").read_bytes() == want[0]  # its token file is open now
        token_file = str(tmp_path / f"{victim}.bin")
        _rewrite_in_place(token_file, keep_mtime=False)
        theirs = [i for i in want if owners[i] == victim and i != 0]
        assert theirs
        for attempt in range(2):
            for i in theirs:
                with pytest.raises(OSError) as caught:
                    (samples / f"{i:07d}.bin").read_bytes()
                assert caught.value.errno == errno.EIO, (attempt, i)
        for i in want:
            if owners[i] != victim:
                assert (samples / f"{i:07d}.bin").read_bytes() == want[i]
        assert f"{os.path.realpath(token_file)} changed since the mount" in m.log.read_text()
    finally:
        stop_mount(m)
