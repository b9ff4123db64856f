"""The record of what a built config resolved to (megatron/cache/resolved.py): a
re-open of an unchanged config reads it and opens nothing else, neither the
datasets nor the cache; anything it depends on changed is noticed; a record that
lies about a cache file never changes what is served."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from tiny_blends import write_tiny_blend

from mmfs.megatron import open_corpus
from mmfs.megatron.cache import resolved

DATASETS = 20

# A re-open in a fresh process: every file it opens (audit events), and a hash of
# every sample of each split, read with the given map limit (none: mapped).
REOPEN = """
import hashlib, json, os, sys
opened = []
sys.addaudithook(lambda event, args: event == "open" and isinstance(args[0], str)
                 and opened.append(os.path.realpath(args[0])))
from mmfs.megatron import open_corpus
limit = int(sys.argv[2])
corpus = open_corpus(sys.argv[1], progress=False, map_limit_mb=None if limit < 0 else limit)
opened_by_open = [p for p in opened if not p.endswith((".py", ".pyc", ".so"))]
samples = {n: hashlib.sha256(b"".join(s.read(i) for i in range(len(s)))).hexdigest()
           for n, s in corpus.splits.items()}
print(json.dumps({"opened": opened_by_open, "samples": samples,
                  "from_cache": all(g.from_cache for s in corpus.indices.values() for g in s.gpts)}))
"""


@pytest.fixture
def blend(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))  # the record's folder, this test's
    config = write_tiny_blend(tmp_path, DATASETS)
    open_corpus(config, progress=False)  # builds, and records
    return config


def reopen(config, map_limit_mb: int = -1) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", REOPEN, str(config), str(map_limit_mb)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def record_of(config) -> str:
    return resolved.record_path(config)


def data_files(opened: list[str], tmp_path) -> list[str]:
    """What a re-open opened of the config, its datasets and the cache (not the record)."""
    return [p for p in opened if p.startswith(str(tmp_path.resolve()) + os.sep)
            and not p.startswith(str((tmp_path / "user-cache").resolve()))]


def test_a_reopen_reads_the_config_and_the_record_and_nothing_else(blend, tmp_path):
    config = blend
    assert os.path.exists(record_of(config))
    first, _ = reopen(config)
    assert first["from_cache"] and os.path.realpath(record_of(config)) in first["opened"]
    # the config's bytes, once; no dataset head, no header file, no cache file
    assert data_files(first["opened"], tmp_path) == [os.path.realpath(config)]
    resolved.forget(config)
    full, _ = reopen(config)  # the full way, for the same samples
    assert full["samples"] == first["samples"]
    assert len(data_files(full["opened"], tmp_path)) > 2 * DATASETS


def _touch(path) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))


@pytest.mark.parametrize("change", ["config", "dataset", "cache folder", "garbage record"])
def test_a_change_makes_the_record_stale_and_it_is_written_again(blend, change, tmp_path):
    config = blend
    expected, _ = reopen(config)
    record = record_of(config)
    before = open(record, "rb").read()
    if change == "config":  # the same config in other bytes
        with open(config, "a") as f:
            f.write("# a comment\n")
    elif change == "dataset":
        _touch(tmp_path / "ds3.idx")
    elif change == "cache folder":
        (tmp_path / "cache" / "unrelated").write_bytes(b"")
    else:
        with open(record, "wb") as f:
            f.write(b"{not json")
    again, _ = reopen(config)
    assert again["samples"] == expected["samples"]
    assert len(data_files(again["opened"], tmp_path)) > 2 * DATASETS  # the full way
    after = open(record, "rb").read()
    assert json.loads(after)["version"] == resolved.VERSION
    assert after != before or change == "garbage record"  # a changed input: a changed record
    third, _ = reopen(config)
    assert data_files(third["opened"], tmp_path) == [os.path.realpath(config)]  # the record again


def _truncate_a_sample_index(cache) -> None:
    sample = sorted(n for n in os.listdir(cache) if n.endswith("-train-sample_index.npy"))[0]
    with open(cache / sample, "r+b") as f:  # no file added or removed: the folder is unchanged
        f.truncate(os.path.getsize(cache / sample) - 8)


def test_a_cache_file_changed_in_place_under_the_record_is_rebuilt(tmp_path, monkeypatch):
    """A config of too few indices for a pack (cache/pack.py) reads its .npy files:
    one changed in place is noticed when it is read."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    config = write_tiny_blend(tmp_path, 4)
    open_corpus(config, progress=False)
    assert json.loads(open(record_of(config), "rb").read())["pack"] is None
    expected, _ = reopen(config)
    _truncate_a_sample_index(tmp_path / "cache")
    again, log = reopen(config)
    assert again["samples"] == expected["samples"] and not again["from_cache"]
    assert "that record is removed" in log


def test_a_packed_config_serves_its_pack_whatever_a_source_became(blend, tmp_path):
    """With a pack, the readers read the pack, whose bytes were checked against each
    .npy when it was written: a .npy changed in place since changes nothing served."""
    config = blend
    expected, _ = reopen(config)
    _truncate_a_sample_index(tmp_path / "cache")
    for limit in (-1, 0, 64):
        again, _ = reopen(config, limit)
        assert again["samples"] == expected["samples"] and again["from_cache"]


def one_element_later(entry):
    descr, shape, offset, file = entry["document_index"]
    entry["document_index"] = [descr, [shape[0] - 1], offset + np.dtype(descr).itemsize, file]


def half_width_items(entry):
    descr, shape, offset, file = entry["sample_index"]
    other = "<i4" if np.dtype(descr).itemsize == 8 else "<i8"
    entry["sample_index"] = [other, [shape[0] * np.dtype(descr).itemsize // np.dtype(other).itemsize, 2],
                             offset, file]


def blend_one_element_later(entry):
    descr, shape, offset, file = entry["dataset_sample_index"]
    entry["dataset_sample_index"] = [descr, [shape[0] - 1], offset + np.dtype(descr).itemsize, file]


@pytest.mark.parametrize("map_limit_mb", [-1, 0, 64])  # mapped; read with pread; placed as the daemon does
@pytest.mark.parametrize("lie", [one_element_later, half_width_items, blend_one_element_later])
def test_a_record_that_lies_about_a_cache_file_is_not_believed(blend, lie, map_limit_mb):
    """Lies that keep every size consistent with the file: only the file's own .npy
    header can tell them, and it is read before any of its bytes are used."""
    config = blend
    expected, _ = reopen(config, map_limit_mb)
    record = record_of(config)
    saved = json.loads(open(record, "rb").read())
    gpts, blend = saved["splits"]["train"]
    lie(blend[-1] if lie is blend_one_element_later else gpts[0][-1])  # the index's arrays
    with open(record, "w") as f:
        f.write(json.dumps(saved))
    served, log = reopen(config, map_limit_mb)
    assert served["samples"] == expected["samples"]
    assert "that record is removed; loading the indices from their own files" in log


def test_a_record_that_lies_about_a_dataset_is_not_believed(blend):
    config = blend
    expected, _ = reopen(config)
    record = record_of(config)
    saved = json.loads(open(record, "rb").read())
    file = next(iter(saved["datasets"]))
    saved["datasets"][file][2][1] += 1  # one sequence more than its .idx holds
    with open(record, "w") as f:
        f.write(json.dumps(saved))
    again, _ = reopen(config)
    assert again["samples"] == expected["samples"]


def test_only_configs_of_local_indexed_datasets_are_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    config = write_tiny_blend(tmp_path, 3)
    raw = yaml.safe_load(open(config))
    paths = [d["path"] for d in raw["datasets"]]
    raw["phases"] = [{"datasets": [{"path": paths[0], "weight": 1}]},
                     {"start_samples": 100, "datasets": [{"path": paths[1], "weight": 1}]}]
    phased = tmp_path / "phased.yaml"
    phased.write_text(yaml.safe_dump(raw))
    open_corpus(str(phased), progress=False)
    assert not os.path.exists(record_of(str(phased)))
    open_corpus(config, progress=False)
    assert os.path.exists(record_of(config))


def test_a_reopen_makes_each_array_of_the_record_only_when_asked_for(blend):
    """The record's 20,000 indices at a large blend are not 60,000 objects a re-open
    makes: lengths and shapes come from the record, an array when it is used."""
    config = blend
    again = open_corpus(config, progress=False)
    resolved.forget(config)
    full = open_corpus(config, progress=False)  # the full way: every array made
    for name, split in again.indices.items():
        assert len(split) == len(full.indices[name])
        for g, f in zip(split.gpts, full.indices[name].gpts):
            arrays = g._arrays
            assert isinstance(arrays, resolved.RecordedArrays) and arrays.held() == []
            assert len(g) == len(f) and g.names() == f.names()
            assert all(g.shape(n) == tuple(f.raw(n).shape) for n in f.names())
            assert g.bytes_in_memory() == 0 and arrays.held() == []
            assert np.array_equal(g.shuffle_index, f.shuffle_index)  # made, checked, mapped
            assert len(arrays.held()) == 1 and g.shape("shuffle_index") == f.shuffle_index.shape
    assert {n: [s.read(i) for i in range(len(s))] for n, s in again.splits.items()} == \
        {n: [s.read(i) for i in range(len(s))] for n, s in full.splits.items()}


@pytest.mark.parametrize("map_limit_mb", [0, 64])  # read with pread; placed as the daemon does
def test_readers_under_a_map_limit_make_no_array_of_the_record(blend, map_limit_mb):
    """A mount places the record's arrays from its facts (megatron/placement.py): no
    object each, checked against their files all the same, the same samples."""
    config = blend
    again = open_corpus(config, progress=False, map_limit_mb=map_limit_mb)
    served = {n: [s.read(i) for i in range(len(s))] for n, s in again.splits.items()}
    for split in again.indices.values():
        assert all(g._arrays.held() == [] for g in split.gpts)
        assert split.blend is None or split.blend._arrays.held() == []
    resolved.forget(config)
    full = open_corpus(config, progress=False)
    assert served == {n: [s.read(i) for i in range(len(s))] for n, s in full.splits.items()}


def test_open_corpus_can_freeze_what_it_made(blend):
    """mmfs build and mount keep the corpus to their end: what it made is frozen
    (gc.freeze) before the collector runs again, never walked by it."""
    import gc

    before = gc.get_freeze_count()
    try:
        corpus = open_corpus(blend, progress=False, freeze=True)
        assert gc.get_freeze_count() > before and gc.isenabled()
        assert len(corpus.indices["train"]) > 0
    finally:
        gc.unfreeze()
