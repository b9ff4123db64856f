"""`mmfs bench` runs (a smoke test: figures are for README.md, not asserted)."""

from __future__ import annotations

import json

from golden_cases import write_case_config
from mmfs.config.schema import load_config
from mmfs.formats import open_dataset
from mmfs.tools.bench_data import make_data
from mount_fixtures import is_mounted, mmfs, mounted


def test_bench_a_config_mounts_measures_and_unmounts(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "case")
    proc = mmfs("bench", config, "-n", "20", "--readers", "1,2", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    methods = {r["method"] for r in result["rows"]}
    assert {"mmfs mount", "tmpfs files", "mmfs in-process", "numpy memmap slice"} <= methods
    assert {(r["order"], r["readers"], r["phase"]) for r in result["rows"]} == {
        (o, n, p) for o in ("sequential", "random") for n in (1, 2) for p in ("cold", "warm")}
    assert all(r["samples"] == 20 and r["samples_per_s"] > 0 for r in result["rows"])
    assert result["daemon_memory_after"]["RssAnon"] > 0
    assert not is_mounted(result["mount"])


def test_bench_a_mount_point(tmp_path):
    config = write_case_config("p4_single_multiseq", tmp_path / "case")
    with mounted(config, tmp_path / "mnt") as m:
        proc = mmfs("bench", m.path, "-n", "10", "--readers", "1")
        assert proc.returncode == 0, proc.stderr
        assert "| mmfs mount" in proc.stdout and "| tmpfs files" in proc.stdout
    assert "not a mounted mmfs directory" in mmfs("bench", tmp_path).stderr


def test_make_data_writes_a_dataset_and_configs(tmp_path):
    configs = make_data(str(tmp_path / "data"), tokens=200_000)
    ds = open_dataset(str(tmp_path / "data" / "bench_text_document"))
    assert ds.num_tokens >= 200_000 and ds.dtype.name == "uint16"
    assert int(ds.get(0)[-1]) == 65535  # every document ends with eod
    for path in configs:
        assert load_config(path).sequence_length in (4096, 256)


def test_a_reader_count_past_the_bound_is_one_line(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "config")
    proc = mmfs("bench", config, "-n", "10", "--readers", "999999999999")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "at most 256 reader processes" in proc.stderr, proc.stderr
