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
