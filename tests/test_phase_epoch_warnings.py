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
from test_epoch_warnings import mount_stderr

from golden_cases import GOLDEN
from mmfs.megatron import open_corpus
from mmfs.megatron.phases.epochs import CONTINUE_SAYS, RESTART_SAYS, USED_UP_SAYS
from mount_fixtures import mmfs

TRAINING = ("training: {data_parallel_size: 8, micro_batch_size: 2, global_batch_size: 16, train_iters: 500, "
            "eval_interval: 100, eval_iters: 1, dataloader_type: %s}")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _config(folder, mode: str, first: dict, second: dict, sampler: str = "single", eval_iters: int = 1,
            start: int = 100) -> str:
    def blend(weights: dict) -> str:  # weight None: the dataset alone without one (the bare GPTDataset)
        return "[" + ", ".join(f"{{path: data/{n}" + ("" if w is None else f", weight: {w}") + "}"
                               for n, w in weights.items()) + "]"

    training = TRAINING.replace("eval_iters: 1", f"eval_iters: {eval_iters}") % sampler
    (folder / "run.yaml").write_text(
        f"phases:\n  - datasets: {blend(first)}\n  - start_iteration: {start}\n    datasets: {blend(second)}\n"
        f"phase_mode: {mode}\nsplit: \"90,8,2\"\nsequence_length: 64\n"
        "tokenizer: {eod: 0, pad: null, vocab_size: 50257}\ncache_dir: cache\n" + training + "\n")
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
    return _past_of(corpus, corpus.indices["train"].gpts[g])


def _past_of(corpus, gpt) -> int | None:
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
    assert _lines(mount_stderr(folder)) == lines


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


def _launch_reads(corpus, split: str) -> list[tuple[int, int]]:
    """Per launch of a restart run, the positions [start, end) of `split` its loader reads,
    by Megatron-LM's train loop (docs/phases.md): launch k, started after iteration S_k,
    evaluates valid after each multiple of eval_interval in (S_k, S_k+1], the last launch
    once more after train_iters and then test once; each evaluation eval_iters x global
    batch samples, consumed_valid_samples carried from launch to launch."""
    t = corpus.config.training
    starts = [p.start_iteration for p in corpus.config.phases.phases] + [t.train_iters]
    step = t.eval_iters * t.global_batch_size
    if split == "test":
        return [(0, 0)] * (len(starts) - 2) + [(0, step)]
    done = [len(range(t.eval_interval, s + 1, t.eval_interval)) for s in starts]
    done[-1] += 1  # the last launch's evaluation after the run's last iteration
    return [(done[k] * step, done[k + 1] * step) for k in range(len(starts) - 1)]


def _eval_lines_expected(corpus) -> dict[tuple[int, str, str], int]:
    """(phase, split, dataset): the first position its launch reads of the phase's own split
    that is a GPTDataset sample past the dataset's documents, from the built arrays."""
    want = {}
    for split in ("valid", "test"):
        for k, (start, end) in enumerate(_launch_reads(corpus, split)):
            own = corpus.indices["train"].evals[k][split]
            for d, gpt in enumerate(own.gpts):
                past = _past_of(corpus, gpt)
                if past is None:
                    continue
                if own.blend is None:  # the bare GPTDataset: its sample i is position i
                    ids, samples = np.zeros(end, dtype=np.int64), np.arange(end)
                else:
                    ids = np.asarray(own.blend.dataset_index[:end])
                    samples = np.asarray(own.blend.dataset_sample_index[:end])
                hits = start + np.flatnonzero((ids[start:] == d) & (samples[start:] >= past))
                if hits.size:
                    want[(k, split, gpt.spec.name)] = int(hits[0])
    return want


def _eval_lines_said(lines: list[str]) -> dict[tuple[int, str, str], str]:
    out = {}
    for x in lines:
        split, _, rest = x.partition(": ")
        if split in ("valid", "test"):
            assert rest.startswith("phases["), x  # under restart no line of the top level's valid or test
            k, _, rest = rest.removeprefix("phases[").partition("]: ")
            out[(int(k), split, rest.split(" ")[0])] = rest
    return out


@pytest.mark.parametrize("sampler,start,second", [("single", 100, 0.3), ("cyclic", 400, 0.5)])
def test_restart_says_each_phase_s_own_valid_and_test_where_its_launch_reads_them(folder, sampler, start, second):
    _config(folder, "restart", {"u16_small": 0.9, "u16_docs": 0.1}, {"u16_small": second, "u16_docs": 1 - second},
            sampler, eval_iters=10, start=start)
    lines, corpus = _built(folder)
    want = _eval_lines_expected(corpus)
    said = _eval_lines_said(lines)
    # phase 1's valid is read from the run's sample 160 (640) on, from its own valid's sample 0 on
    assert set(want) == set(said) and (1, "valid", "u16_small") in want and (0, "test", "u16_small") not in want
    loader = _launch_reads(corpus, "valid")[1][0]
    own = corpus.indices["train"].evals[1]["valid"]
    d = [g.spec.name for g in own.gpts].index("u16_small")
    crossing = int(np.flatnonzero(np.asarray(own.blend.dataset_index) == d)[_past_of(corpus, own.gpts[d])])
    # start 100: the crossing is within the launch's reads; 400: before them, said from its first read
    assert (crossing >= loader) == (start == 100), (crossing, loader)
    assert (want[(1, "valid", "u16_small")] == crossing) == (start == 100)
    shuffled = " (in the split's order; the cyclic sampler reads it shuffled)" if sampler == "cyclic" else ""
    for (k, split, name), first in want.items():
        step = corpus.config.training.split_schedule(split).iteration_at(first)[0]
        assert said[(k, split, name)].startswith(
            f"{name} is read past its documents at evaluation step {step:,} (sample {first:,}){shuffled}: the launch "
            f"of phases[{k}] reads the run's {split} samples "), said[(k, split, name)]
        assert RESTART_SAYS in said[(k, split, name)]
    assert _config_lines(folder) == lines
    assert _lines(mount_stderr(folder)) == lines


def test_restart_s_bare_phase_reads_its_own_gpt_dataset_as_valid_and_test(folder):
    # phase 1: u16_small without a weight, so its valid and test are the bare GPTDataset; a transition
    # between evaluations (iteration 150)
    _config(folder, "restart", {"u16_docs": 0.5, "u16_small": 0.5}, {"u16_small": None}, eval_iters=10, start=150)
    lines, corpus = _built(folder)
    assert corpus.indices["train"].evals[1]["valid"].blend is None
    want = _eval_lines_expected(corpus)
    said = _eval_lines_said(lines)
    assert set(want) == set(said) and {(1, "valid", "u16_small"), (1, "test", "u16_small")} <= set(want)
    for (k, split, name), first in want.items():
        step = corpus.config.training.split_schedule(split).iteration_at(first)[0]
        assert said[(k, split, name)].startswith(f"{name} is read past its documents at evaluation step {step:,} "
                                                 f"(sample {first:,}):"), said[(k, split, name)]
    assert _config_lines(folder) == lines


def test_continue_s_valid_and_test_are_the_top_level_s(folder):
    _config(folder, "continue", {"u16_small": 0.9, "u16_docs": 0.1}, {"u16_small": 0.3, "u16_docs": 0.7},
            eval_iters=10)
    lines, _ = _built(folder)
    assert any(x.startswith("valid: u16_small is read past its documents") for x in lines), lines
    assert not any(x.startswith(("valid: phases[", "test: phases[")) for x in lines), lines
