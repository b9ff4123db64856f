"""A run in phases that reads more of a dataset than its documents hold is said at
`mmfs config`, `mmfs build` and `mmfs mount` (issue 42 item 2), per phase: the line
names the phase, the dataset, the run's iteration (docs/phases.md's one numbering)
and what happens there, for each phase mode. Checked against the built arrays: the
first sample of a phase whose GPTDataset sample reaches past the dataset's documents
in its token stream (under restart each phase's own GPTDataset, read from its
sample 0; under continue the dataset's one GPTDataset, read on from where the earlier
phases left it, and started over past its end)."""

from __future__ import annotations

import numpy as np
import pytest

from golden_cases import GOLDEN
from mmfs.megatron import open_corpus
from mmfs.megatron.phases.epochs import CONTINUE_SAYS, RESTART_SAYS, USED_UP_SAYS
from mount_fixtures import force_unmount, mmfs

TRAINING = ("training: {data_parallel_size: 8, micro_batch_size: 2, global_batch_size: 16, train_iters: 500, "
            "eval_interval: 100, eval_iters: 1, dataloader_type: %s}")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _config(folder, mode: str, first: dict, second: dict, sampler: str = "single") -> str:
    def blend(weights: dict) -> str:
        return "[" + ", ".join(f"{{path: data/{n}, weight: {w}}}" for n, w in weights.items()) + "]"

    (folder / "run.yaml").write_text(
        f"phases:\n  - datasets: {blend(first)}\n  - start_iteration: 100\n    datasets: {blend(second)}\n"
        f"phase_mode: {mode}\nsplit: \"90,8,2\"\nsequence_length: 64\n"
        "tokenizer: {eod: 0, pad: null, vocab_size: 50257}\ncache_dir: cache\n" + TRAINING % sampler + "\n")
    return "run.yaml"


def _lines(err: str) -> list[str]:
    return [line.removeprefix("mmfs: warning: ") for line in err.splitlines() if line.startswith("mmfs: warning:")]


def _built(folder):
    done = mmfs("build", "run.yaml", cwd=folder)
    assert done.returncode == 0, done.stderr
    return _lines(done.stderr), open_corpus(str(folder / "run.yaml"), progress=False)


def _past(corpus, g: int) -> int | None:
    """The first sample of GPTDataset g (of the run's train split) whose tokens end past
    its documents' tokens, from its document and sample indices (None: none does)."""
    gpt = corpus.indices["train"].gpts[g]
    lengths = np.asarray([e.dataset for e in corpus.datasets if e.name == gpt.spec.name][0].sequence_lengths)
    cum = np.concatenate([[0], np.cumsum(lengths[np.asarray(gpt.document_index)], dtype=np.int64)])
    rows = np.asarray(gpt.sample_index)
    ends = cum[rows[1:, 0]] + rows[1:, 1] + gpt.params.add_extra_token
    past = np.flatnonzero(ends > int(lengths[gpt.params.beg:gpt.params.end].sum()))
    return int(past[0]) if past.size else None


def _phase_draws(corpus, k: int, g: int) -> np.ndarray:
    """The run's samples of phase k drawn from GPTDataset g."""
    split = corpus.indices["train"]
    s = split.slices[k]
    return s.start + np.flatnonzero(np.asarray(split.blend.dataset_index[s.start:s.end]) == g)


def _at(corpus, sample: int) -> str:
    iteration = corpus.config.training.split_schedule("train").iteration_at(sample)[0]
    return f"at iteration {iteration:,} (sample {sample:,})"


def _gpt(corpus, k: int, name: str) -> int:
    split = corpus.indices["train"]
    return [g for g in split.slices[k].members if split.gpts[g].spec.name == name][0]


def _config_lines(folder) -> list[str]:
    """What `mmfs config` says of the run (it checks the config it writes; here, a file)."""
    from mmfs.config.schema import load_config
    from mmfs.formats import open_dataset
    from mmfs.megatron.epochs import planned_warnings

    config = load_config(str(folder / "run.yaml"))
    return planned_warnings(config, {s.file: open_dataset(s.file) for s in config.all_datasets})


def test_restart_each_phase_reads_its_own_gpt_dataset_from_sample_0(folder):
    _config(folder, "restart", {"u16_small": 0.9, "u16_docs": 0.1}, {"u16_small": 0.3, "u16_docs": 0.7})
    lines, corpus = _built(folder)
    split = corpus.indices["train"]
    for k in (0, 1):
        g = _gpt(corpus, k, "u16_small")
        p = _past(corpus, g)
        drawn = _phase_draws(corpus, k, g)
        # the phase's draw of its own GPTDataset's sample p: the relaunch reads it from sample 0
        first = int(drawn[np.asarray(split.blend.dataset_sample_index[drawn]) == p][0])
        want = f"train: phases[{k}]: u16_small is read past its documents {_at(corpus, first)}:"
        assert [x for x in lines if x.startswith(want)] and all(RESTART_SAYS in x for x in lines if want in x), lines
    assert not any("phases[" in x and "u16_docs" in x for x in lines)  # within its documents in both phases
    assert _config_lines(folder) == lines
    (folder / "mnt").mkdir()
    mount = mmfs("mount", "run.yaml", "mnt", "--log", "mnt.log", cwd=folder)
    try:
        assert mount.returncode == 0, mount.stderr
        assert _lines(mount.stderr) == lines
    finally:
        force_unmount(folder / "mnt")


def test_continue_says_the_phase_that_passes_the_documents_and_the_later_ones(folder):
    _config(folder, "continue", {"u16_small": 0.9, "u16_docs": 0.1}, {"u16_small": 0.3, "u16_docs": 0.7})
    lines, corpus = _built(folder)
    g = _gpt(corpus, 0, "u16_small")
    p = _past(corpus, g)
    first = int(_phase_draws(corpus, 0, g)[p])  # the run's (p + 1)-th draw of the dataset: its sample p
    assert f"train: phases[0]: u16_small is read past its documents {_at(corpus, first)}:" in "\n".join(lines)
    assert corpus.indices["train"].draws[0, g] > p  # crossed in phase 0: phase 1 is past them from its first draw
    later = int(_phase_draws(corpus, 1, g)[0])
    assert any(x.startswith(f"train: phases[1]: u16_small is read past its documents (since phases[0]) "
                            f"{_at(corpus, later)}:") and CONTINUE_SAYS in x for x in lines), lines
    assert _config_lines(folder) == lines


def test_continue_says_where_a_gpt_dataset_is_used_up_and_starts_over(folder):
    # u16_small's GPTDataset is sized for phase 0's 5% (one epoch: 1,411 samples); phase 1 draws 90% of 6,400
    _config(folder, "continue", {"u16_small": 0.05, "u16_docs": 0.95}, {"u16_small": 0.9, "u16_docs": 0.1})
    lines, corpus = _built(folder)
    split = corpus.indices["train"]
    g = _gpt(corpus, 0, "u16_small")
    length, before = len(split.gpts[g]), int(split.draws[0, g])
    drawn = _phase_draws(corpus, 1, g)
    over = int(drawn[length - before])  # its draw at position len(GPTDataset): the next pass's first
    assert int(split.blend.dataset_sample_index[over]) == 0  # served: its GPTDataset's sample 0 again
    assert any(x.startswith(f"train: phases[1]: u16_small uses up its GPTDataset (one epoch of its documents) "
                            f"{_at(corpus, over)}:")
               and USED_UP_SAYS in x for x in lines), lines
    # its GPTDataset is one epoch (no sample of it reaches past its documents): the next pass is the line
    gpt = split.gpts[g]
    assert np.asarray(gpt.sample_index).shape[0] - 1 == length and not any("u16_small is read past" in x
                                                                           for x in lines), lines
    assert _config_lines(folder) == lines


@pytest.mark.parametrize("mode", ["continue", "restart"])
def test_the_cyclic_sampler_s_lines_say_the_phase_is_read_shuffled(folder, mode):
    _config(folder, mode, {"u16_small": 0.9, "u16_docs": 0.1}, {"u16_small": 0.3, "u16_docs": 0.7}, "cyclic")
    lines, corpus = _built(folder)
    g = _gpt(corpus, 0, "u16_small")
    first = int(_phase_draws(corpus, 0, g)[_past(corpus, g)])
    assert any(x.startswith(f"train: phases[0]: u16_small is read past its documents {_at(corpus, first)} (in the "
                            "phase's order; its own cyclic sampler reads the phase shuffled):") for x in lines), lines


def test_config_from_megatron_s_phases_say_it_as_build_does(folder):
    common = ["--split", "90,8,2", "--seq-length", "64", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50257",
              "--micro-batch-size", "2", "--global-batch-size", "16", "--eval-interval", "100", "--eval-iters", "1",
              "--train-samples", "8000", "--data-cache-path", "cache", "--world-size", "8",
              "--phase-transition-iterations", "100"]
    done = mmfs("config", "--from-megatron", "--data-path", "0.9", "data/u16_small", "0.1", "data/u16_docs", *common,
                "--next-phase", "--data-path", "0.3", "data/u16_small", "0.7", "data/u16_docs", *common, cwd=folder)
    assert done.returncode == 0, done.stderr
    (folder / "run.yaml").write_text(done.stdout)
    said = _lines(done.stderr)
    lines, corpus = _built(folder)
    assert corpus.config.phases.mode == "restart" and said == lines
    assert [x for x in lines if x.startswith("train: phases[0]: u16_small is read past its documents")]
    assert [x for x in lines if x.startswith("train: phases[1]: u16_small is read past its documents")]
    assert all(f"# warning: {x}" in done.stdout for x in lines)  # and in the config it writes
