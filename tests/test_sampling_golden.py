"""Every public golden case through the YAML config: indices, cache names and
bytes, and sample tokens equal megatron-core 0.19.2's exactly."""

import filecmp
import os
import shutil

import numpy as np
import pytest

from golden_cases import PUBLIC, SPLITS, case_names, load_case, write_case_config
from mmfs.megatron import open_corpus

CASES = case_names()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each case opened once, building its indices from scratch."""
    out = {}
    for name in CASES:
        folder = tmp_path_factory.mktemp(name)
        out[name] = (folder, open_corpus(str(write_case_config(name, folder)), progress=False))
    return out


def split_params(present_only=True, blended_only=False):
    params = []
    for name in CASES:
        for split in SPLITS:
            info = load_case(name)["splits"][split]
            if present_only and info is None or blended_only and (info is None or "blend" not in info):
                continue
            params.append(pytest.param(name, split, id=f"{name}-{split}"))
    return params


@pytest.mark.parametrize("name,split", split_params(present_only=False))
def test_split_presence_and_length(built, name, split):
    info = load_case(name)["splits"][split]
    corpus = built[name][1]
    if info is None:
        assert split not in corpus.splits
    else:
        assert len(corpus.splits[split]) == info["length"]
        assert info["top_level_class"] == ("BlendedDataset" if corpus.indices[split].blend else "GPTDataset")


@pytest.mark.parametrize("name,split", split_params())
def test_gpt_indices_exact(built, name, split):
    info = load_case(name)["splits"][split]
    gpts = built[name][1].indices[split].gpts
    assert [g.spec.path for g in gpts] == [g["prefix"] for g in info["gpt_datasets"]]
    for ours, theirs in zip(gpts, info["gpt_datasets"]):
        assert ours.params.description() == theirs["unique_description_text"]
        assert ours.cache.hash == theirs["unique_description_hash"]
        assert (ours.params.beg, ours.params.end) == tuple(theirs["indexed_indices_range"])
        assert ours.params.num_samples == theirs["num_samples_requested"]
        for key in ("document_index", "sample_index", "shuffle_index"):
            expected = np.load(PUBLIC / name / theirs[key])
            actual = getattr(ours, key)
            assert actual.dtype == expected.dtype, key
            assert actual.shape == expected.shape, key
            assert np.array_equal(actual, expected), key


@pytest.mark.parametrize("name,split", split_params(blended_only=True))
def test_blend_indices_exact(built, name, split):
    info = load_case(name)["splits"][split]
    blend = built[name][1].indices[split].blend
    theirs = info["blend"]
    assert blend.weights == theirs["weights"] and blend.size == theirs["size"]
    assert blend.cache.hash == theirs["unique_description_hash"]
    for key in ("dataset_index", "dataset_sample_index"):
        expected = np.load(PUBLIC / name / theirs[key])
        assert getattr(blend, key).dtype == expected.dtype
        assert np.array_equal(getattr(blend, key), expected)


@pytest.mark.parametrize("name,split", split_params())
def test_samples_exact(built, name, split):
    info = load_case(name)["splits"][split]
    reader = built[name][1].splits[split]
    expected = np.load(PUBLIC / name / info["samples"])
    assert info["samples_truncated"] is False
    got = np.stack([reader.tokens(i) for i in range(len(reader))])
    assert got.shape == expected.shape
    assert np.array_equal(got, expected.astype(reader.dtype))


@pytest.mark.parametrize("name", CASES)
def test_cache_files_are_megatrons(built, name):
    """Same names and same bytes as the cache megatron-core wrote."""
    folder = built[name][0] / "cache"
    theirs = sorted(os.listdir(PUBLIC / name / "cache"))
    assert sorted(os.listdir(folder)) == theirs
    for f in theirs:
        assert filecmp.cmp(folder / f, PUBLIC / name / "cache" / f, shallow=False), f


@pytest.mark.parametrize("name", CASES)
def test_reads_megatrons_cache(tmp_path, name):
    """A cache written by megatron-core is loaded (not rebuilt) and gives the same samples."""
    shutil.copytree(PUBLIC / name / "cache", tmp_path / "cache")
    before = {f: os.path.getmtime(tmp_path / "cache" / f) for f in os.listdir(tmp_path / "cache")}
    corpus = open_corpus(str(write_case_config(name, tmp_path)), progress=False)
    for split, indices in corpus.indices.items():
        assert all(g.from_cache for g in indices.gpts)
        assert indices.blend is None or indices.blend.from_cache
        expected = np.load(PUBLIC / name / load_case(name)["splits"][split]["samples"])
        reader = corpus.splits[split]
        for i in (0, len(reader) // 2, len(reader) - 1):
            assert np.array_equal(reader.tokens(i), expected[i].astype(reader.dtype))
    after = {f: os.path.getmtime(tmp_path / "cache" / f) for f in os.listdir(tmp_path / "cache")}
    assert before == after


def test_reopen_uses_cache(built):
    folder, first = built["p2_blend2_u16"]
    again = open_corpus(str(folder / "config.yaml"), progress=False)
    assert all(g.from_cache for s in again.indices.values() for g in s.gpts)
    assert all(s.blend.from_cache for s in again.indices.values())
    for split, reader in again.splits.items():
        assert reader.read(7) == first.splits[split].read(7)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_dtype", "description"])
def test_corrupt_cache_is_rebuilt(tmp_path, damage):
    name = "p1_single_u16"
    shutil.copytree(PUBLIC / name / "cache", tmp_path / "cache")
    target = next((tmp_path / "cache").glob("*-GPTDataset-train-sample_index.npy"))
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:200])
    elif damage == "garbage":
        target.write_bytes(b"not a numpy file at all" * 10)
    elif damage == "wrong_dtype":
        np.save(target, np.zeros((5, 2), dtype=np.float32))
    else:
        desc = next((tmp_path / "cache").glob("*-GPTDataset-train-description.txt"))
        desc.write_text("{}")
    corpus = open_corpus(str(write_case_config(name, tmp_path)), progress=False)
    train = corpus.indices["train"].gpts[0]
    assert not train.from_cache
    expected = np.load(PUBLIC / name / "train.u16_docs.sample_index.npy")
    assert np.array_equal(train.sample_index, expected)
    # The rebuilt file is Megatron's again.
    assert filecmp.cmp(target, PUBLIC / name / "cache" / target.name, shallow=False)


def test_provenance_matches_tokens(built):
    corpus = built["p2_blend2_u16"][1]
    reader = corpus.splits["train"]
    datasets = {d.name: d.dataset for d in corpus.datasets}
    for i in range(0, len(reader), 97):
        name, pieces = reader.provenance(i)
        tokens = np.concatenate([datasets[name].get(s, o, n) for s, o, n in pieces])
        assert np.array_equal(tokens.astype(reader.dtype), reader.tokens(i))
