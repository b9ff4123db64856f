"""Builders in several processes sharing one cache folder never see half a file."""

import filecmp
import os
import subprocess
import sys

from golden_cases import PUBLIC, write_case_config

SCRIPT = """
import sys
from mmfs.megatron import open_corpus
corpus = open_corpus(sys.argv[1], progress=False)
print(sum(len(s) for s in corpus.splits.values()), corpus.splits["train"].read(5).hex()[:40])
"""


def test_concurrent_builders_share_a_cache(tmp_path):
    name = "p2_blend2_u16"
    config = write_case_config(name, tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(config)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outputs]
    assert len({o[0] for o in outputs}) == 1
    cache = tmp_path / "cache"
    assert sorted(os.listdir(cache)) == sorted(os.listdir(PUBLIC / name / "cache"))  # no temp files left
    for f in os.listdir(cache):
        assert filecmp.cmp(cache / f, PUBLIC / name / "cache" / f, shallow=False)
