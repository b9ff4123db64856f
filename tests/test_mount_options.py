"""`mmfs mount -o ...`: mmfs's own options typed, the rest kept for libfuse,
and each bad option one line naming it."""

from __future__ import annotations

import pytest

from golden_cases import write_case_config
from mmfs.errors import MountError
from mmfs.mount.options import DEFAULT_MAP_LIMIT_MB, MountOptions, parse_mount_options
from mount_fixtures import mmfs


def test_options_are_typed_and_the_rest_go_to_libfuse():
    assert parse_mount_options("") == MountOptions()
    o = parse_mount_options(" threads , low_latency=0,map_limit_mb=12,allow_other,nonempty,max_read=4096")
    assert (o.threads, o.low_latency, o.map_limit_mb, o.nonempty) == (True, False, 12, True)
    assert o.fuse == {"allow_other": True, "nonempty": True, "max_read": "4096"}
    assert parse_mount_options("foreground,nothreads") == MountOptions(threads=False)
    assert MountOptions().threads is None  # decided by the corpus: threads when remote
    assert parse_mount_options(None).map_limit_mb == DEFAULT_MAP_LIMIT_MB
    assert parse_mount_options("log_fold=2.5").log_fold == 2.5
    assert parse_mount_options("log_fold=0").log_fold == 0


@pytest.mark.parametrize("text,named", [
    ("map_limit_mb=lots", "map_limit_mb=lots"),
    ("map_limit_mb=-1", "map_limit_mb=-1"),
    ("map_limit_mb", "map_limit_mb"),
    ("threads=maybe", "threads=maybe"),
    ("low_latency=2", "low_latency=2"),
    ("log_fold=-1", "log_fold=-1"),
    ("log_fold=soon", "log_fold=soon"),
    ("log_fold=nan", "log_fold=nan"),
    ("log_fold", "log_fold"),
    ("=5", "=5"),
    ("ro,rw", "-o rw"),
])
def test_each_bad_option_is_one_line_naming_it(text, named):
    with pytest.raises(MountError) as err:
        parse_mount_options(text)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_bad_option_stops_mmfs_mount_in_one_line(tmp_path):
    config = write_case_config("p1_single_u16", tmp_path)
    (tmp_path / "mnt").mkdir()
    proc = mmfs("mount", config, tmp_path / "mnt", "-o", "ro,threads=sometimes")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "threads=sometimes" in proc.stderr
