"""What a mount derives from a resolved record alone, kept beside it
(megatron/cache/derived.py): mmfs.json is taken from there by a re-open of the
same record and the same config path, the very bytes a fresh derivation makes,
and made anew when the record is another file, the config is reached by another
path, or the record is found to lie."""

from __future__ import annotations

import json
import os

import pytest
from tiny_blends import write_tiny_blend

from mmfs.megatron import open_corpus
from mmfs.megatron.cache import derived, resolved
from mmfs.mount import tree as tree_module
from mmfs.mount.contract import MANIFEST
from mmfs.mount.manifest import manifest
from mmfs.mount.tree import Tree, manifest_text


@pytest.fixture
def blend(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    config = write_tiny_blend(tmp_path, 4)
    open_corpus(config, progress=False)  # builds, and records
    return config


def mmfs_json(corpus) -> bytes:
    return Tree(corpus).root.entries[MANIFEST].data


def kept(config) -> str:
    return derived.path_of(resolved.record_path(config), MANIFEST)


def not_derived(monkeypatch):
    def refuse(corpus, extra=None):
        raise AssertionError("mmfs.json derived again")
    monkeypatch.setattr(tree_module, "manifest", refuse)


def test_a_reopen_takes_mmfs_json_from_beside_its_record(blend, monkeypatch):
    corpus = open_corpus(blend, progress=False, map_limit_mb=64)
    assert corpus.record is not None and not os.path.exists(kept(blend))
    first = mmfs_json(corpus)
    assert first == manifest_text(manifest(corpus)).encode() and os.path.exists(kept(blend))
    again = open_corpus(blend, progress=False, map_limit_mb=64)
    not_derived(monkeypatch)
    assert mmfs_json(again) == first
    assert json.loads(first)["config_path"] == os.path.abspath(blend)


def test_another_path_to_the_config_or_another_record_derives_again(blend, tmp_path, monkeypatch):
    corpus = open_corpus(blend, progress=False, map_limit_mb=64)
    mmfs_json(corpus)
    os.symlink(tmp_path, tmp_path / "link")
    other = str(tmp_path / "link" / os.path.basename(blend))  # the same record, another config_path
    assert resolved.record_path(other) == resolved.record_path(blend)
    via_link = mmfs_json(open_corpus(other, progress=False, map_limit_mb=64))
    assert json.loads(via_link)["config_path"] == other
    with open(blend, "a") as f:  # the same config in other bytes: a new record
        f.write("# a comment\n")
    open_corpus(blend, progress=False)  # writes it
    rewritten = open_corpus(blend, progress=False, map_limit_mb=64)
    not_derived(monkeypatch)
    with pytest.raises(AssertionError, match="derived again"):
        mmfs_json(rewritten)


def test_nothing_derived_from_a_record_that_lies_is_kept_or_taken(blend, monkeypatch):
    corpus = open_corpus(blend, progress=False, map_limit_mb=64)
    mmfs_json(corpus)
    record = resolved.record_path(blend)
    saved = json.loads(open(record, "rb").read())
    entry = saved["splits"]["train"][0][0][-1]  # the first GPTDataset's arrays
    descr, shape, offset, file = entry["document_index"]
    entry["document_index"] = [descr, [shape[0] - 1], offset + 4, file]
    with open(record, "w") as f:
        f.write(json.dumps(saved))
    liar = open_corpus(blend, progress=False, map_limit_mb=64)
    made = []
    monkeypatch.setattr(tree_module, "manifest", lambda corpus: made.append(1) or manifest(corpus))
    text = mmfs_json(liar)  # its readers catch the lie: the indices from their own files
    assert made == [1]  # derived from them, not taken from beside the record
    assert liar.record is None and not os.path.exists(record)
    fresh = open_corpus(blend, progress=False, map_limit_mb=64)
    assert text == mmfs_json(fresh)
