"""A run that reads more of a dataset than its documents hold is said at `mmfs config
--from-megatron`, `mmfs build` and `mmfs mount`, with the iteration (issue 42 item
2): the line names the split, the dataset, the iteration (or evaluation step) and
what Megatron does there. The iteration is checked here against the built arrays
themselves (megatron-core's, bit for bit: test_sampling_golden and the matrix): the
first sample of the split's blend whose tokens reach past the dataset's documents in
its GPTDataset's stream."""

from __future__ import annotations

import re

import numpy as np
import pytest

from golden_cases import GOLDEN
from mmfs.megatron import open_corpus
from mmfs.megatron.epochs import MEGATRON_GOES_ON
from mount_fixtures import force_unmount, mmfs

LINE = ["--split", "90,8,2", "--seq-length", "64", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50257",
        "--micro-batch-size", "2", "--global-batch-size", "16", "--eval-interval", "100", "--eval-iters", "10",
        "--data-cache-path", "cache", "--world-size", "8"]  # (the cache in the test's folder, not beside the data)
BLEND = ["--data-path", "0.9", "data/u16_small", "0.1", "data/u16_docs"]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _config(folder, *argv: str) -> str:
    done = mmfs("config", "--from-megatron", *argv, cwd=folder)
    assert done.returncode == 0, done.stderr
    (folder / "run.yaml").write_text(done.stdout)
    return done.stderr


def _first_past(corpus, split: str, name: str) -> int | None:
    """The split position of the first sample of `name` whose tokens end past its
    documents' tokens, from the built arrays."""
    indices = corpus.indices[split]
    run = corpus.config.samples[split]
    d = [g.spec.name for g in indices.gpts].index(name)
    g = indices.gpts[d]
    lengths = np.asarray([e.dataset for e in corpus.datasets if e.name == name][0].sequence_lengths)
    docs = np.asarray(g.document_index)
    cum = np.concatenate([[0], np.cumsum(lengths[docs], dtype=np.int64)])
    rows = np.asarray(g.sample_index)
    ends = cum[rows[1:, 0]] + rows[1:, 1] + g.params.add_extra_token  # a sample's token end in the stream
    tokens = int(lengths[g.params.beg:g.params.end].sum())
    past = np.flatnonzero(ends > tokens)  # GPT samples (stream order) reaching past the documents
    if not past.size:
        return None
    # the blend draws the dataset's samples 0, 1, ...: its (past[0] + 1)-th draw is the first
    drawn = np.flatnonzero(np.asarray(indices.blend.dataset_index)[:run] == d) if indices.blend else np.arange(run)
    return int(drawn[past[0]]) if drawn.size > past[0] else None


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("mmfs: warning:")]


def mount_stderr(folder) -> str:
    """What `mmfs mount run.yaml` in folder prints on stderr (it mounts; unmounted after)."""
    (folder / "mnt").mkdir()
    mount = mmfs("mount", "run.yaml", "mnt", "--log", "mnt.log", cwd=folder)
    try:
        assert mount.returncode == 0, mount.stderr
        return mount.stderr
    finally:
        force_unmount(folder / "mnt")


def test_config_build_and_mount_say_where_a_blend_reads_past_a_dataset(folder):
    said = _config(folder, *BLEND, *LINE, "--train-iters", "500")
    corpus = open_corpus(str(folder / "run.yaml"), progress=False)
    schedule = corpus.config.training.split_schedule("train")
    first = _first_past(corpus, "train", "u16_small")
    iteration = schedule.iteration_at(first)[0]
    lines = _lines(said)
    assert any(f"train: u16_small is read past its documents at iteration {iteration:,} (sample {first:,})" in x
               for x in lines), lines
    assert all(MEGATRON_GOES_ON in x for x in lines)
    assert not any("u16_docs" in x for x in lines)  # 10% of the run: within its documents
    for split in ("valid", "test"):
        at = _first_past(corpus, split, "u16_small")
        step = corpus.config.training.split_schedule(split).iteration_at(at)[0]
        assert any(f"{split}: u16_small is read past its documents at evaluation step {step:,} (sample {at:,})"
                   in x for x in lines), (split, lines)
    built = mmfs("build", "run.yaml", cwd=folder)
    assert built.returncode == 0 and _lines(built.stderr) == lines
    assert _lines(mount_stderr(folder)) == lines


def test_one_dataset_read_past_its_documents(folder):
    said = _config(folder, "--data-path", "data/u16_small", *LINE, "--train-iters", "200")
    corpus = open_corpus(str(folder / "run.yaml"), progress=False)
    first = _first_past(corpus, "train", "u16_small")
    iteration = corpus.config.training.split_schedule("train").iteration_at(first)[0]
    assert f"train: u16_small is read past its documents at iteration {iteration:,} (sample {first:,})" in said


def test_a_run_within_its_documents_says_nothing(folder):
    line = [*LINE]
    line[line.index("--eval-iters") + 1] = "1"  # one evaluation step: 16 test samples
    said = _config(folder, "--data-path", "data/u16_docs", *line, "--train-iters", "100")
    assert _lines(said) == []
    built = mmfs("build", "run.yaml", cwd=folder)
    assert built.returncode == 0 and _lines(built.stderr) == []


def test_the_cyclic_sampler_s_line_says_the_order_is_the_split_s(folder):
    said = _config(folder, *BLEND, *LINE, "--train-iters", "500", "--dataloader-type", "cyclic")
    line = [x for x in _lines(said) if x.startswith("mmfs: warning: train:")][0]
    assert re.search(r"at iteration [\d,]+ \(sample [\d,]+\) \(in the split's order; the cyclic sampler reads it "
                     r"shuffled\)", line)
    # valid and test: Megatron-LM's loaders take the run's dataloader_type too
    for split in ("valid", "test"):
        line = [x for x in _lines(said) if x.startswith(f"mmfs: warning: {split}:")][0]
        assert re.search(r"at evaluation step [\d,]+ \(sample [\d,]+\) \(in the split's order; the cyclic sampler "
                         r"reads it shuffled\)", line), line
