"""The header file of a cache folder holding many indices of one config: a re-open
opens it and no other cache file, and anything changed under it is noticed. (A
re-open of a config recorded whole reads the record instead, test_resolved.py;
here the record is removed before each re-open.)"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from tiny_blends import write_tiny_blend

from mmfs.megatron import open_corpus
from mmfs.megatron.cache.headerfile import HEADERS_FROM

DATASETS = 8  # x 2 splits, and 2 blends: above HEADERS_FROM indices in one folder

# A re-open in a fresh process: which cache files it opens (audit events of
# open and os.open; the config's pack aside, test_pack.py), and a sample of each split.
REOPEN = """
import json, os, sys
cache = os.path.realpath(sys.argv[2])
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and \\
            os.path.realpath(args[0]).startswith(cache + os.sep) and "-mmfs-pack" not in args[0]:
        opened.append(os.path.basename(args[0]))
sys.addaudithook(hook)
from mmfs.megatron import open_corpus
from mmfs.megatron.cache import resolved
resolved.forget(sys.argv[1])  # the header file, not the record of the config (test_resolved.py)
corpus = open_corpus(sys.argv[1], progress=False)
opened_by_open = list(opened)
samples = {n: s.read(3).hex() for n, s in corpus.splits.items()}
print(json.dumps({"opened": opened_by_open, "samples": samples,
                  "from_cache": all(g.from_cache for s in corpus.indices.values() for g in s.gpts)}))
"""


@pytest.fixture
def blend(tmp_path):
    return write_tiny_blend(tmp_path, DATASETS), tmp_path / "cache"


def reopen(config, cache) -> dict:
    out = subprocess.run([sys.executable, "-c", REOPEN, str(config), str(cache)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def header_files(cache) -> list[str]:
    return [n for n in os.listdir(cache) if n.endswith("-mmfs-headers.json")]


def test_a_reopen_opens_only_the_header_file(blend):
    config, cache = blend
    assert 2 * DATASETS + 2 >= HEADERS_FROM
    open_corpus(str(config), progress=False)
    assert len(header_files(cache)) == 1
    first = reopen(config, cache)
    assert first["from_cache"] and first["opened"] == header_files(cache)
    assert reopen(config, cache) == first


def test_a_changed_file_is_read_again_and_the_header_file_rewritten(blend):
    config, cache = blend
    open_corpus(str(config), progress=False)
    expected = reopen(config, cache)
    header = cache / header_files(cache)[0]
    before = header.read_bytes()
    doc = sorted(n for n in os.listdir(cache) if n.endswith("-train-document_index.npy"))[0]
    base = doc[: -len("-document_index.npy")]
    (cache / doc).write_bytes((cache / doc).read_bytes())  # same bytes, new mtime
    again = reopen(config, cache)
    assert again["samples"] == expected["samples"] and again["from_cache"]
    # the header file, then the changed index's description and arrays, read the usual way,
    # and the changed file once more, copied into the config's pack (the others are copied
    # from the pack as it was); the header file written again
    assert again["opened"][0] == header.name
    assert sorted(n for n in again["opened"][1:] if not n.endswith("-mmfs-headers.json")) == sorted(
        f"{base}-{s}" for s in ("description.txt", "document_index.npy", "document_index.npy",
                                "sample_index.npy", "shuffle_index.npy"))
    assert header.read_bytes() != before  # rewritten with the file's new identity
    assert reopen(config, cache)["opened"] == [header.name]


def test_a_truncated_index_under_the_header_file_is_rebuilt(blend):
    config, cache = blend
    open_corpus(str(config), progress=False)
    expected = reopen(config, cache)
    sample = sorted(n for n in os.listdir(cache) if n.endswith("-train-sample_index.npy"))[0]
    with open(cache / sample, "r+b") as f:
        f.truncate(os.path.getsize(cache / sample) - 8)
    again = reopen(config, cache)
    assert again["samples"] == expected["samples"] and not again["from_cache"]
    assert reopen(config, cache)["opened"] == header_files(cache)


@pytest.mark.parametrize("content", [b"", b"not json", b"[]", b'{"version": 1, "indices": []}',
                                     b'{"version": 1, "indices": {"x": 1}}'])
def test_a_damaged_header_file_is_ignored_and_replaced(blend, content):
    config, cache = blend
    open_corpus(str(config), progress=False)
    expected = reopen(config, cache)
    header = cache / header_files(cache)[0]
    header.write_bytes(content)
    again = reopen(config, cache)
    assert again["samples"] == expected["samples"] and again["from_cache"]
    assert len(again["opened"]) > 1
    assert reopen(config, cache)["opened"] == [header.name]


def one_row_more(entry):
    entry["sample_index"][1][0] += 1  # than the file holds


def data_before_the_file(entry):
    descr, shape, offset, file = entry["shuffle_index"]
    shape[0] += 2 * offset // np.dtype(descr).itemsize  # the same file size
    entry["shuffle_index"] = [descr, shape, -offset, file]


@pytest.mark.parametrize("lie", [one_row_more, data_before_the_file])
def test_a_header_file_entry_that_does_not_add_up_is_not_believed(blend, lie):
    config, cache = blend
    open_corpus(str(config), progress=False)
    expected = reopen(config, cache)
    header = cache / header_files(cache)[0]
    saved = json.loads(header.read_bytes())
    lie(next(v for k, v in saved["indices"].items() if "-GPTDataset-" in k))
    header.write_text(json.dumps(saved))
    again = reopen(config, cache)
    assert again["samples"] == expected["samples"] and again["from_cache"]
    assert len(again["opened"]) == 1 + 4 + 1  # the header file, one index, the new header file


def test_few_indices_in_a_folder_get_no_header_file(tmp_path):
    from golden_cases import BLEND_CONFIG, GOLDEN

    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(BLEND_CONFIG))
    open_corpus(str(config), progress=False)
    assert header_files(tmp_path / "cache") == []


# Lies that keep every size consistent with the file's: only the file's own .npy
# header can tell them. Each edits one entry [descr, shape, offset, file id].
def blend_sample_index_one_element_later(indices):  # the lie the issue found
    entry = next(v for k, v in indices.items() if "-BlendedDataset-train" in k)
    descr, shape, offset, file = entry["dataset_sample_index"]
    size = np.dtype(descr).itemsize
    entry["dataset_sample_index"] = [descr, [shape[0] - 1], offset + size, file]


def document_index_one_element_later(indices):
    entry = next(v for k, v in indices.items() if "-GPTDataset-" in k)
    descr, shape, offset, file = entry["document_index"]
    entry["document_index"] = [descr, [shape[0] - 1], offset + np.dtype(descr).itemsize, file]


def sample_index_of_half_width_items(indices):
    entry = next(v for k, v in indices.items() if "-GPTDataset-" in k)
    descr, shape, offset, file = entry["sample_index"]
    other = "<i4" if np.dtype(descr).itemsize == 8 else "<i8"
    rows = shape[0] * np.dtype(descr).itemsize // np.dtype(other).itemsize
    entry["sample_index"] = [other, [rows, 2], offset, file]


def shuffle_index_of_another_width(indices):
    entry = next(v for k, v in indices.items() if "-GPTDataset-" in k and
                 v["shuffle_index"][1][0] % 2 == 0)
    descr, shape, offset, file = entry["shuffle_index"]
    other = "<u4" if np.dtype(descr).itemsize == 8 else "<i8"
    count = shape[0] * np.dtype(descr).itemsize // np.dtype(other).itemsize
    entry["shuffle_index"] = [other, [count], offset, file]


ALL_SAMPLES = """
import hashlib, json, sys
from mmfs.megatron import open_corpus
from mmfs.megatron.cache import resolved
resolved.forget(sys.argv[1])
corpus = open_corpus(sys.argv[1], progress=False, map_limit_mb=int(sys.argv[2]) or None)
print(json.dumps({n: hashlib.sha256(b"".join(s.read(i) for i in range(len(s)))).hexdigest()
                  for n, s in corpus.splits.items()}))
"""


def all_samples(config, map_limit_mb: int) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", ALL_SAMPLES, str(config), str(map_limit_mb)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


@pytest.mark.parametrize("map_limit_mb", [0, 64])  # every array mapped; placed as the daemon does
@pytest.mark.parametrize("lie", [blend_sample_index_one_element_later,
                                 document_index_one_element_later,
                                 sample_index_of_half_width_items,
                                 shuffle_index_of_another_width])
def test_a_header_file_entry_that_disagrees_with_the_files_header_is_not_believed(
        blend, lie, map_limit_mb):
    config, cache = blend
    open_corpus(str(config), progress=False)
    expected, _ = all_samples(config, map_limit_mb)
    header = cache / header_files(cache)[0]
    saved = json.loads(header.read_bytes())
    lie(saved["indices"])
    header.write_text(json.dumps(saved))
    served, log = all_samples(config, map_limit_mb)
    assert served == expected
    assert "that header file is removed; loading the indices from their own files" in log
    assert reopen(config, cache)["opened"] == [header.name]  # written again, truthfully
    assert "header" not in all_samples(config, map_limit_mb)[1]
