"""Issue 41's smaller cases, each one right line: a weight without a path, a tab in
the YAML, a cache_dir that cannot be created (not "no free space"), and the long lines
of a many-dataset blend summarised (a count and the first few)."""

from __future__ import annotations

import os

import yaml
from tiny_blends import write_tiny_blend

from golden_cases import write_case_config
from mount_fixtures import mmfs, mounted


def _error(proc) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_a_weight_without_a_path_is_named(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "c")
    raw = yaml.safe_load(config.read_text())
    raw.pop("datasets")
    raw["data_path"] = f"0.7 {tmp_path}/a 0.3"
    config.write_text(yaml.safe_dump(raw))
    err = _error(mmfs("build", config))
    assert "data_path: the weight '0.3' has no path after it (3 words" in err, err
    err = _error(mmfs("config", "--from-megatron", "--data-path", "0.7", "a", "0.3", "--seq-length", "8",
                      "--micro-batch-size", "1", "--tokenizer-type", "NullTokenizer", "--vocab-size", "10"))
    assert "--data-path: the weight '0.3' has no path after it" in err, err


def test_a_tab_in_the_yaml_is_named_a_tab(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "c")
    text = config.read_text()
    for broken in ("tokenizer:\n\teod: 1\n", "samples:\n  train: 5\n\tvalid: 3\n",
                   "datasets:\n-\tpath: x\n"):
        kept = "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith(("tokenizer", "  eod", "  pad",
                                                                                     "  vocab", "samples", "  test",
                                                                                     "  train", "  valid")))
        config.write_text(kept + broken)
        err = _error(mmfs("build", config))
        number = (kept + broken).splitlines().index(next(ln for ln in broken.splitlines() if "\t" in ln)) + 1
        assert f"at line {number}, column" in err and "a tab character" in err, err
        assert "cannot start any token" not in err


def test_a_cache_dir_that_cannot_be_created_is_not_called_full(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path / "c")
    (tmp_path / "afile").write_text("")
    for cache in (tmp_path / "afile" / "cache", "/proc/mmfs-no-such/cache"):
        raw = yaml.safe_load(config.read_text())
        raw["cache_dir"] = str(cache)
        config.write_text(yaml.safe_dump(raw))
        proc = mmfs("build", config)
        assert proc.returncode == 0, proc.stderr  # built in memory, said in one line
        assert f"cache_dir {cache} cannot be created" in proc.stderr, proc.stderr
        assert "free" not in proc.stderr and "unreadable" not in proc.stderr, proc.stderr
        assert proc.stderr.count("cannot be created") == 1
        told = [ln for ln in proc.stderr.splitlines() if "cache" in ln and "from cache" not in ln]
        assert len(told) == 1, proc.stderr  # the writer does not say it again
        if "afile" in str(cache):  # the file in the way is named, not the folder under it
            assert f"{tmp_path / 'afile'} (in {cache}'s path) is a file, not a folder; set cache_dir in the " \
                   "config to a folder not under it, or move it away" in told[0], told[0]
            assert f"{cache} is a file" not in told[0]


def test_the_lines_of_a_many_dataset_blend_are_summarised(tmp_path):
    config = write_tiny_blend(tmp_path, 40)
    proc = mmfs("-v", "build", config)
    assert proc.returncode == 0, proc.stderr
    rounding = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "of each dataset" in ln]
    assert rounding and all("... (40 in all)" in ln and len(ln) < 400 for ln in rounding), rounding
    with mounted(config, tmp_path / "mnt") as m:
        os.listdir(m.path)
    served = [ln for ln in m.log.read_text().splitlines() if "served in C" in ln]
    assert served and " in all)" in served[0] and len(served[0]) < 400, served
