"""Index sizes are predicted before anything is allocated, and sequences a split
uses are checked before they are indexed: an impossible request or a corrupt
.idx is one line naming the key or the file, sequence and byte offset."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from test_hostile_config import BASE, assert_one_line_error, run_cli, write

from golden_cases import GOLDEN, case_names, write_case_config
from mmfs.errors import ConfigError
from mmfs.megatron import open_corpus
from mmfs.megatron.indices import gpt
from mmfs.megatron.indices.blend import build_blending_indices, build_exhaustive_blending_indices

HEADER = 34


@pytest.mark.parametrize("count,fragment", [
    (10**10, "GiB of memory"),
    (10**15, "GiB of memory"),
    (2**63 - 1, "GiB of memory"),
    (2**63, "must be at most 9223372036854775807"),
])
def test_sample_counts_that_cannot_fit_are_refused(tmp_path, count, fragment):
    path = write(str(tmp_path), BASE.replace("train: 100", f"train: {count}"))
    code, out, err = run_cli("build", path)
    line = assert_one_line_error(code, err, path, "samples.train: ")
    assert fragment in line
    cache = tmp_path / "cache"
    assert not (cache.exists() and os.listdir(cache))  # refused before anything was built


def test_blend_arrays_are_checked_before_allocation():
    with pytest.raises(ConfigError, match="blend of 1,000,000,000,000 samples needs 9,313.2 GiB"):
        build_blending_indices([0.5, 0.5], 10**12)
    with pytest.raises(ConfigError, match="GiB of memory"):
        build_exhaustive_blending_indices([10**12, 10**12])


@pytest.mark.parametrize("case", case_names())
def test_predicted_sizes_are_the_built_sizes(tmp_path, case):
    corpus = open_corpus(str(write_case_config(case, tmp_path)), progress=False)
    datasets = {d.name: d.dataset for d in corpus.datasets}
    for split in corpus.indices.values():
        for g in split.gpts:
            dataset = datasets[g.spec.name]
            tokens = int(dataset.sequence_lengths[g.params.beg:g.params.end].sum(dtype=np.int64))
            size = gpt.predict_gpt_size(g.params, gpt.plan_epochs(g.params, tokens))
            assert size.epochs * (g.params.end - g.params.beg) == g.document_index.shape[0]
            assert size.document_index == g.document_index.nbytes
            row = g.sample_index.itemsize * 2
            # exact, or one row more where Megatron counts with a float32 ceil
            assert size.sample_index - g.sample_index.nbytes in (0, row)
            assert size.shuffle_index - g.shuffle_index.nbytes in (0, g.shuffle_index.itemsize)
            assert size.peak >= size.total


def test_separate_final_epoch_peak_counts_the_copies(tmp_path):
    # 1.1 epochs: the final epoch is shuffled separately (under 80 % of one)
    path = write(str(tmp_path), BASE.replace("train: 100", "train: 6500"))
    corpus = open_corpus(path, progress=False)
    g = corpus.indices["train"].gpts[0]
    plan = gpt.plan_epochs(g.params, int(corpus.datasets[0].dataset.sequence_lengths[
        g.params.beg:g.params.end].sum(dtype=np.int64)))
    assert plan.separate_final_epoch
    size = gpt.predict_gpt_size(g.params, plan)
    assert size.document_index == g.document_index.nbytes
    assert size.peak == size.document_index + size.sample_index + 2 * size.shuffle_index


def test_big_steps_are_announced_before_they_run(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(gpt, "ANNOUNCE_BYTES", 1)  # everything counts as big here
    path = write(str(tmp_path), BASE)
    with caplog.at_level(logging.INFO, logger="mmfs"):
        open_corpus(path, progress=True)
    messages = [r.getMessage() for r in caplog.records]
    # Indices build in threads, so one index's lines may interleave with another's.
    first = next(i for i, m in enumerate(messages)
                 if "building the document index" in m and "train/u16_docs" in m)
    assert "MiB" in messages[first]
    assert any("train/u16_docs" in m and "document index, 1 epoch(s)" in m
               for m in messages[first + 1:])  # then its timing
    assert any("building the shuffle index" in m for m in messages)


# -- corrupt sequences in the middle (opening only spot-checks the first and last) --


def corrupt_copy(tmp_path, name: str = "u16_small") -> tuple[str, int]:
    os.makedirs(tmp_path / "bad", exist_ok=True)
    for suffix in (".bin", ".idx"):
        shutil.copy(GOLDEN / "data" / f"{name}{suffix}", tmp_path / "bad" / f"{name}{suffix}")
    prefix = str(tmp_path / "bad" / name)
    with open(prefix + ".idx", "rb") as f:
        n = struct.unpack_from("<Q", f.read(HEADER), 18)[0]
    return prefix, n


def patch(path: str, offset: int, fmt: str, value) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))


def bad_config(tmp_path, prefix: str) -> str:
    return write(str(tmp_path), BASE.replace("data/u16_docs", os.path.relpath(prefix, tmp_path)))


@pytest.mark.parametrize("what", ["huge lengths", "middle pointer", "negative pointer",
                                  "negative length"])
def test_corrupt_middle_sequences_fail_the_build(tmp_path, what):
    prefix, n = corrupt_copy(tmp_path)
    idx = prefix + ".idx"
    seq = 300
    if what == "huge lengths":  # all but the spot-checked first and last
        for i in range(1, n - 1):
            patch(idx, HEADER + 4 * i, "<i", 2**31 - 1)
        seq = 1
        expected = "sequence 1 spans bytes"
    elif what == "middle pointer":
        patch(idx, HEADER + 4 * n + 8 * seq, "<q", 10**12)
        expected = f"sequence_pointers[{seq}] (byte {HEADER + 4 * n + 8 * seq})"
    elif what == "negative pointer":
        patch(idx, HEADER + 4 * n + 8 * seq, "<q", -3)
        expected = "spans bytes -3.."
    else:
        patch(idx, HEADER + 4 * seq, "<i", -7)
        expected = f"sequence {seq}: sequence_lengths[{seq}] (byte {HEADER + 4 * seq}) is -7"
    path = bad_config(tmp_path, prefix)
    code, _, err = run_cli("build", path)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"mmfs: error: {prefix}.") and f"sequence {seq}" in lines[0]
    assert expected in lines[0]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code, _, err = run_cli("mount", path, str(mnt))
    assert code == 2 and len(err.splitlines()) == 1 and not os.path.ismount(mnt)


def test_sample_names_file_sequence_and_offset_when_a_read_fails(tmp_path):
    """Indices cached from sound files; then the .idx is damaged: `mmfs sample` names
    what it could not read."""
    prefix, n = corrupt_copy(tmp_path)
    path = bad_config(tmp_path, prefix)
    reader = open_corpus(path, progress=False).splits["train"]
    i = 11
    seq = reader.provenance(i)[1][0][0]
    assert run_cli("sample", path, str(i))[0] == 0
    patch(prefix + ".idx", HEADER + 4 * n + 8 * seq, "<q", 10**12)
    code, out, err = run_cli("sample", path, str(i))
    line = assert_one_line_error(code, err, path, f"train sample {i} cannot be read")
    assert f"{prefix}.bin: sequence {seq} spans bytes 1000000000000.." in line
    assert f"sequence_pointers[{seq}] (byte {HEADER + 4 * n + 8 * seq})" in line
    assert out == ""


def test_dataset_file_that_is_a_directory_or_fifo(tmp_path):
    prefix, _ = corrupt_copy(tmp_path)
    os.unlink(prefix + ".idx")
    os.mkdir(prefix + ".idx")
    code, _, err = run_cli("info", prefix)
    assert_one_line_error(code, err, prefix + ".idx", "is a directory, not a regular file")
    os.rmdir(prefix + ".idx")
    os.mkfifo(prefix + ".idx")
    code, _, err = run_cli("verify", prefix + ".bin")
    assert_one_line_error(code, err, prefix + ".idx", "is a FIFO")
    code, _, err = run_cli("build", bad_config(tmp_path, prefix))
    assert code == 2 and "is a FIFO" in err and len(err.splitlines()) == 1


# -- output into a closed pipe ------------------------------------------------------


@pytest.mark.parametrize("argv", [["info", "DATA/u16_docs"], ["sample", "CONFIG", "3"]])
def test_closed_stdout_pipe_is_quiet(tmp_path, argv):
    path = write(str(tmp_path), BASE)
    argv = [a.replace("DATA", str(GOLDEN / "data")).replace("CONFIG", path) for a in argv]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before mmfs writes a byte
    try:
        run = subprocess.run([sys.executable, "-m", "mmfs.cli", "-q", *argv], stdout=write_end,
                             stderr=subprocess.PIPE, text=True, check=False, cwd=tmp_path)
    finally:
        os.close(write_end)
    assert run.stderr == "" and run.returncode == 141


def test_long_sample_prints_in_chunks_as_one_json_document(tmp_path):
    path = write(str(tmp_path), BASE.replace("sequence_length: 64", "sequence_length: 70000")
                 .replace("{train: 100, valid: 10, test: 5}", "{train: 2, valid: 1, test: 1}")
                 .replace('"90,8,2"', '"100,0,0"'))
    code, out, _ = run_cli("sample", path, "1")
    assert code == 0
    printed = json.loads(out)
    reader = open_corpus(path, progress=False).splits["train"]
    assert printed["tokens"] == reader.tokens(1).tolist() and len(printed["tokens"]) == 70001
    assert printed["pieces"] == [{"sequence": s, "offset": o, "length": n}
                                 for s, o, n in reader.provenance(1)[1]]


def test_sample_too_long_to_print_is_refused(tmp_path, monkeypatch):
    from mmfs.tools import build as commands

    monkeypatch.setattr(commands, "MAX_PRINTED_TOKENS", 64)  # samples here hold 65
    path = write(str(tmp_path), BASE)
    code, out, err = run_cli("sample", path, "0")
    assert_one_line_error(code, err, path, "sequence_length: a sample of 65 tokens")
    assert out == ""


@pytest.mark.parametrize("begin,end,chunk", [(0, None, 7), (5, 40, 3), (123, 124, 1), (499, None, 1 << 20)])
def test_iter_array_ranges(tmp_path, begin, end, chunk):
    """The range the sequence check streams matches a slice, from a file or from memory."""
    from mmfs.formats import open_dataset
    from mmfs.formats.chunks import iter_array
    from mmfs.formats.writer import write_packed

    indexed = open_dataset(GOLDEN / "data" / "u16_small")
    write_packed(str(tmp_path / "p.pbin"), [np.arange(n, dtype=np.uint16) for n in range(1, 501)],
                 token_size=2)
    for ds in (indexed, open_dataset(tmp_path / "p.pbin")):
        for name in ("sequence_lengths", "sequence_pointers"):
            parts = list(iter_array(ds, name, chunk, begin, end))
            got = np.concatenate([a for _, a in parts])
            assert got.tolist() == np.asarray(getattr(ds, name))[begin:end].tolist()
            assert [s for s, _ in parts] == list(range(begin, begin + len(got), chunk))
