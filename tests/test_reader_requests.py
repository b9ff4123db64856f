"""Every reader mmfs ships costs at most two FUSE requests per cold file (a LOOKUP
and a READ; never the isatty ioctl of Python's buffered open()), counted by the
daemon itself (`user.mmfs.counters`): mmfs.loader's samples, micro-batches and
streams, the Megatron provider, `mmfs bench`'s readers, the C example, and the
torch and grain adapters where they are installed. Each reader gets its own mount,
so that every file it reads is cold; a few requests for the folders above the
files and mmfs.json are allowed on top. Counts, never durations."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_megatron_provider import megatron_args

from golden_cases import write_case_config
from mmfs.adapters.megatron import mount_datasets_provider
from mmfs.loader import Mount
from mmfs.mount.contract import XATTR_COUNTERS
from mmfs.tools.harness import read_files
from mount_fixtures import mount_in

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FILES = 24  # files each reader reads
FOLDERS = 12  # requests allowed for what is above the files: folders, mmfs.json, the first OPEN


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("requests")
    path = write_case_config("p2_blend2_u16", base / "config")
    raw = yaml.safe_load(path.read_text())
    raw["training"] = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def mount(config, tmp_path):
    with contextlib.ExitStack() as stack:
        yield mount_in(stack, config, tmp_path / "mnt")


def requests(mount: Path) -> dict[str, int]:
    return json.loads(os.getxattr(mount, XATTR_COUNTERS))["requests"]


def assert_two_per_file(mount: Path, read: Callable[[], int]) -> None:
    """read() reads files through the mount and returns how many; the requests it
    cost (less the counters' own GETXATTRs) are two per file, give or take the
    folders above them."""
    before = requests(mount)
    files = read()
    after = requests(mount)
    spent = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0) and k != "getxattr"}
    assert files >= FILES
    assert spent.get("ioctl", 0) == 0, spent
    assert spent.get("read", 0) >= files, spent  # the files were cold: each asked for its bytes
    assert sum(spent.values()) <= 2 * files + FOLDERS, spent


def test_the_loader_s_samples(mount):
    m = Mount(mount)
    assert_two_per_file(mount, lambda: len([m.sample("train", i) for i in range(FILES)]))


def test_the_loader_s_micro_batches(mount):
    m = Mount(mount)
    assert_two_per_file(mount, lambda: len(list(zip(range(FILES), m.megatron_batches("train", 1)))))


def test_the_loader_s_stream_files(mount):
    m = Mount(mount)

    def read() -> int:
        files = m.stream_files("train", 0, 4, 1, 8)[:FILES]
        return len([m.microbatch_file(f) for f in files])

    assert_two_per_file(mount, read)


def test_the_megatron_provider(mount):
    args = megatron_args(seq_length=Mount(mount).sequence_length, micro_batch_size=2, global_batch_size=8)

    def read() -> int:
        provider = mount_datasets_provider(mount, get_args=lambda: args, data_parallel=lambda: (0, 2),
                                           to_tensor=np.asarray)
        train, _valid, _test = provider([FILES * 4, 0, 0])
        return len(list(zip(range(FILES), train)))

    assert_two_per_file(mount, read)


def test_mmfs_bench_s_readers(mount):
    folder = mount / "train" / "samples"
    paths = [str(folder / name) for name in sorted(os.listdir(folder))[:FILES]]
    assert_two_per_file(mount, lambda: len(paths) if read_files(paths, 1 << 20) else 0)


def test_the_c_example(mount, tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc)")
    binary = tmp_path / "mmfs_rank_reader"
    subprocess.run([cc, "-O2", "-o", str(binary), str(EXAMPLES / "c" / "mmfs_rank_reader.c")], check=True)

    def read() -> int:
        out = subprocess.run([str(binary), str(mount), "train", "0", "0"], capture_output=True, text=True,
                             check=True)
        return len(out.stdout.splitlines())

    assert_two_per_file(mount, read)


def test_the_torch_adapter(mount):
    pytest.importorskip("torch")
    from mmfs.adapters.torch import RankStream

    stream = RankStream(Mount(mount), "train", 0)
    assert_two_per_file(mount, lambda: len(list(zip(range(FILES), stream))))


def test_the_grain_adapter(mount):
    pytest.importorskip("grain")
    from mmfs.adapters.grain import SampleSource

    source = SampleSource(mount)
    assert_two_per_file(mount, lambda: len([source[i] for i in range(FILES)]))


def test_python_s_buffered_open_is_what_the_check_catches(mount):
    """The negative control: open(path, "rb") asks isatty, a third request per file."""
    folder = mount / "train" / "samples"
    paths = [folder / name for name in sorted(os.listdir(folder))[:FILES]]

    def read() -> int:
        for path in paths:
            with open(path, "rb") as f:
                f.read()
        return len(paths)

    with pytest.raises(AssertionError, match="ioctl"):
        assert_two_per_file(mount, read)
