"""A long-running reader can drop the pages its reads mapped (resident memory stays
flat), and reads after that still give the same bytes."""

import numpy as np

from golden_cases import write_case_config
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.sampling import open_corpus


def rss_file_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile")


def test_release_memory_unmaps_touched_pages(tmp_path):
    prefix = str(tmp_path / "big")
    rng = np.random.RandomState(0)
    writer = IndexedDatasetWriter(prefix + ".bin", dtype=np.uint16)
    for _ in range(400):  # 400 documents of 100k tokens: 80 MB of tokens
        writer.add_item(rng.randint(0, 50000, size=100_000).astype(np.uint16))
        writer.end_document()
    writer.finalize(prefix + ".idx")
    config = tmp_path / "c.yaml"
    config.write_text("datasets: [{path: big}]\nsplit: '100,0,0'\nsequence_length: 4096\n"
                      "cache_dir: cache\ntokenizer: {eod: 0}\n")
    corpus = open_corpus(str(config), progress=False)
    train = corpus.splits["train"]
    before = [train.read(i) for i in range(0, len(train), 97)]
    corpus.release_memory()
    base = rss_file_mb()
    for i in range(len(train)):
        train.read(i)
    touched = rss_file_mb()
    corpus.release_memory()
    after = rss_file_mb()
    assert touched - base > 40  # reading every sample mapped the token file
    assert after - base < 10
    assert [train.read(i) for i in range(0, len(train), 97)] == before
    assert corpus.trim_memory(limit_mb=1 << 20) is False  # under the limit: nothing to do


def test_trim_keeps_golden_samples_exact(tmp_path):
    corpus = open_corpus(str(write_case_config("p2_blend2_u16", tmp_path)), progress=False)
    reader = corpus.splits["train"]
    first = [reader.read(i) for i in range(50)]
    assert corpus.trim_memory(limit_mb=0) is True
    assert [reader.read(i) for i in range(50)] == first


def test_pread_tokens_give_the_same_samples(tmp_path):
    """The daemon reads tokens with pread; every golden sample is the same either way,
    including a blend that widens uint16 and int32 tokens."""
    from golden_cases import expected_samples

    for case in ("p2_blend2_u16", "p3_multi_epoch_i32"):
        corpus = open_corpus(str(write_case_config(case, tmp_path / case)), progress=False,
                             pread_tokens=True)
        assert all(g.source.fd >= 0 for g in corpus.splits["train"].gpts)
        for split, reader in corpus.splits.items():
            expected = expected_samples(case, split).astype(reader.dtype)
            for i in range(len(reader)):
                assert np.array_equal(reader.tokens(i), expected[i])


def test_pread_widening_blend(tmp_path):
    """uint16 and int32 datasets blended: tokens widened through the bounce buffer."""
    (tmp_path / "data").symlink_to(write_case_config("p1_single_u16", tmp_path / "x").parent / "data")
    config = tmp_path / "c.yaml"
    config.write_text("datasets: [{path: data/u16_docs, weight: 1}, {path: data/i32_docs, weight: 1}]\n"
                      "split: '100,0,0'\nsamples: {train: 300}\nsequence_length: 5000\ncache_dir: cache\n")
    mapped = open_corpus(str(config), progress=False).splits["train"]
    pread = open_corpus(str(config), progress=False, pread_tokens=True).splits["train"]
    assert mapped.dtype == np.int32
    for i in range(len(mapped)):
        assert mapped.read(i) == pread.read(i)
