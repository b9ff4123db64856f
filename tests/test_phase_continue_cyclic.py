"""phase_mode continue x dataloader_type cyclic (issue 31 item 2): every iteration
stays inside its phase. Each phase is read by Megatron's cyclic sampler over its own
range of the run (the permutation torch.randperm(samples of the phase), epochs counted
per phase), as a relaunch would read it; a run without phases is stock Megatron.

Properties (hypothesis), over generated phase lists and layouts, through the C
reader's plan, the micro-batches of the uninterrupted run, the plan of a resumed
stream and the sampler-by-sampler model: every micro-batch step is of one phase, the
one its consumed_samples fall in; within an epoch of a phase nothing is read twice and
nothing skipped (the last phase: at most the sampler's remainder, as Megatron's own);
and on generated configs (constant batch, ramp-up, step schedule), `mmfs which` names
one phase per iteration and lists only its samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfs.errors import ConfigError
from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phases.sampling import cyclic_spans, split_sampler
from mmfs.megatron.sampling.phaseplan import PhasedSampler, PhaseSpan, phased_stream
from mmfs.megatron.sampling.rankplan import plan_ranks, rank_ids, stream_microbatch
from mmfs.tools.which import which_in

DATA = Path(__file__).resolve().parent / "golden" / "data"


@st.composite
def runs(draw):
    """(spans of a continue run, mbs, dp, sharding): phases of whole micro-batch steps,
    the last one of any length of at least one step."""
    dp, mbs = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    group = dp * mbs
    steps = draw(st.lists(st.integers(1, 12), min_size=0, max_size=4))
    last = draw(st.integers(group, 12 * group + group - 1))
    sizes = [n * group for n in steps] + [last]
    starts = np.cumsum([0, *sizes])
    total = int(starts[-1])
    spans = [PhaseSpan(int(a), int(n), int(n), total) for a, n in zip(starts, sizes)]
    return spans, mbs, dp, draw(st.booleans())


def _phase_of(spans, i: int) -> int:
    return next(k for k, s in enumerate(spans) if s.start <= i < s.start + s.listed)


@settings(max_examples=120, deadline=None)
@given(runs())
def test_every_step_is_of_its_phase_and_each_phase_is_read_once(case):
    spans, mbs, dp, sharding = case
    group = mbs * dp
    sampler = PhasedSampler(spans, mbs, dp, sharding)
    plan = sampler.plan(0, whole_pass=False)  # the rank views
    ids = np.stack([rank_ids(plan, r) for r in range(dp)], axis=1)  # [step, rank, mbs]
    for k, span in enumerate(spans):
        steps = ids[span.start // group:(span.start + span.listed) // group]
        read = steps.ravel()
        # every sample of the phase's steps is the phase's own
        assert ((read >= span.start) & (read < span.start + span.listed)).all(), k
        # within the phase's epoch: none twice, none skipped but the sampler's remainder
        assert len(np.unique(read)) == len(read)
        assert span.listed - len(read) == span.listed % group
    # the same micro-batches: the C plan, the run's n-th micro-batch, the model, a resumed stream
    for rank in range(dp):
        model = phased_stream(spans, 0, mbs, rank, dp, sharding)
        for n in range(ids.shape[0]):
            got, epoch, phase = sampler.microbatch(rank, n)
            assert np.array_equal(got, ids[n, rank]) and epoch == 0 and phase == _phase_of(spans, int(got[0]))
            assert np.array_equal(next(model), got)
    for span in spans:
        resumed = sampler.plan(span.start + group)  # one step into each phase
        files = rank_ids(resumed, 0)
        start = (span.start + group) // group
        assert np.array_equal(files[:ids.shape[0] - start], ids[start:, 0])


@settings(max_examples=60, deadline=None)
@given(runs(), st.integers(1, 3))
def test_the_last_phase_goes_on_in_its_own_epochs(case, epochs):
    """Past the end of the run the last phase's sampler goes on (cyclic_iter): epoch e is
    randperm(its samples, e), never another phase's samples."""
    spans, mbs, dp, sharding = case
    group, last = mbs * dp, spans[-1]
    sampler = PhasedSampler(spans, mbs, dp, sharding)
    first = last.start // group
    own = plan_ranks(last.listed, mbs, dp, "cyclic", sharding)
    for rank in range(dp):
        for n in range(own.files_per_rank * epochs, own.files_per_rank * (epochs + 1)):
            got, epoch, phase = sampler.microbatch(rank, first + n)
            want, want_epoch = stream_microbatch(own, rank, n)
            assert np.array_equal(got, last.start + want) and (epoch, phase) == (want_epoch, len(spans) - 1)


def test_one_phase_and_no_phases_are_stock_megatron(tmp_path):
    training = {"data_parallel_size": 3, "micro_batch_size": 2, "global_batch_size": 12, "train_iters": 20,
                "eval_interval": 10, "eval_iters": 1, "dataloader_type": "cyclic", "data_sharding": False}
    datasets = [{"path": str(DATA / "u16_docs"), "weight": 0.6}, {"path": str(DATA / "u16_small"), "weight": 0.4}]
    base = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0}, "cache_dir": str(tmp_path / "cache"),
            "training": training}
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({**base, "datasets": datasets}))
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({**base, "phases": [{"datasets": datasets}]}))
    stock, phased = open_corpus(str(plain), progress=False), open_corpus(str(one), progress=False)
    assert split_sampler(stock.splits["train"].indices, "cyclic", 2, 3, False) is None  # no phases: untouched
    plan = plan_ranks(len(stock.splits["train"]), 2, 3, "cyclic", False)
    sampler = split_sampler(phased.splits["train"].indices, "cyclic", 2, 3, False)
    for rank in range(3):
        assert np.array_equal(rank_ids(sampler.plan(0, whole_pass=False), rank), rank_ids(plan, rank))
        for n in (0, plan.files_per_rank - 1, plan.files_per_rank, 3 * plan.files_per_rank + 5):
            assert np.array_equal(sampler.microbatch(rank, n)[0], stream_microbatch(plan, rank, n)[0])
    def samples(corpus, iteration: int) -> list[list[int]]:
        return [[s["sample"] for s in b["samples"]] for r in which_in(corpus, iteration)["ranks"]
                for b in r["microbatches"]]

    for iteration in (1, 20, 25):
        assert samples(stock, iteration) == samples(phased, iteration)


# -- on generated configs --------------------------------------------------------------


SCHEDULES = {
    "constant": {"global_batch_size": 16},
    "rampup": {"global_batch_size": 16, "rampup_batch_size": [4, 4, 96]},
    "step": {"step_batch_size_schedule": "0:8 1024:16 2560:24"},  # tokens: samples 32 and 80 at 32 a sample
}


@st.composite
def configs(draw):
    schedule = draw(st.sampled_from(sorted(SCHEDULES)))
    dp, mbs = draw(st.sampled_from([(1, 4), (2, 2), (4, 1), (2, 1)]))
    iterations = draw(st.lists(st.integers(1, 24), min_size=1, max_size=3, unique=True))
    names = ["u16_docs", "u16_small", "u16_multiseq", "i32_docs"]
    phases = []
    for k, start in enumerate([0, *sorted(iterations)]):
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
        weights = draw(st.lists(st.integers(1, 9), min_size=len(chosen), max_size=len(chosen)))
        entry = {"datasets": [{"path": str(DATA / n), "weight": float(w)} for n, w in zip(chosen, weights)]}
        phases.append(entry if k == 0 else {"start_iteration": start, **entry})
    return schedule, dp, mbs, phases, draw(st.booleans())


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("continue-cyclic")


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(configs())
def test_which_keeps_every_iteration_inside_its_phase(cache, case):
    schedule, dp, mbs, phases, sharding = case
    training = {"data_parallel_size": dp, "micro_batch_size": mbs, "train_samples": 480, "eval_interval": 10,
                "eval_iters": 1, "dataloader_type": "cyclic", "data_sharding": sharding, **SCHEDULES[schedule]}
    config = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0}, "cache_dir": str(cache / "cache"),
              "training": training, "phases": phases}
    path = cache / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        corpus = open_corpus(str(path), progress=False)
    except ConfigError as exc:  # a start past the end of this schedule's run: refused in one line
        assert "past the end of training" in str(exc)
        return
    split = corpus.splits["train"].indices
    spans = cyclic_spans(split)
    assert [s.length for s in spans] == [s.listed for s in spans]  # continue: each phase's own range
    iterations = corpus.config.training.schedule.iteration_at(len(corpus.splits["train"]))[0] - 1
    seen: dict[int, list[int]] = {}
    for iteration in range(1, iterations + 1):
        result = which_in(corpus, iteration)
        [phase] = result["phases"]
        got = [s["sample"] for r in result["ranks"] for b in r["microbatches"] for s in b["samples"]]
        assert {s["phase"] for r in result["ranks"] for b in r["microbatches"] for s in b["samples"]} == \
            {phase["phase"]}
        assert all(phase["start_sample"] <= i < phase["end_sample"] for i in got)
        seen.setdefault(phase["phase"], []).extend(got)
    for k, ids in seen.items():
        span = spans[k]
        assert len(set(ids)) == len(ids)  # nothing twice within the phase's epoch
        if k < len(spans) - 1:
            assert sorted(ids) == list(range(span.start, span.start + span.listed))  # nothing skipped


def test_a_start_inside_a_micro_batch_step_is_refused_under_cyclic(tmp_path):
    """Without a global batch size a start may be any sample; the cyclic samplers of the
    phases read whole steps of micro_batch_size x data_parallel_size: one line."""
    datasets = [{"path": str(DATA / "u16_docs"), "weight": 1.0}]
    config = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0}, "cache_dir": str(tmp_path / "c"),
              "samples": {"train": 240, "valid": 16, "test": 8},
              "training": {"data_parallel_size": 2, "micro_batch_size": 2, "dataloader_type": "cyclic"},
              "phases": [{"datasets": datasets}, {"start_samples": 82, "datasets": datasets}]}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as err:
        open_corpus(str(path), progress=False)
    message = str(err.value)
    assert "\n" not in message and ": phases[1].start_samples: starts at sample 82, not a multiple of" in message
    config["phases"][1]["start_samples"] = 84
    path.write_text(yaml.safe_dump(config))
    assert cyclic_spans(open_corpus(str(path), progress=False).splits["train"].indices)[1].start == 84


def test_the_c_reader_refuses_a_malformed_phased_plan():
    from mmfs.megatron.sampling.rankplan import native_plan
    from mmfs.native import ffi, lib

    spans = [PhaseSpan(0, 8, 9, 16), PhaseSpan(8, 8, 8, 17)]
    plan = PhasedSampler(spans, 2, 2).plan(0, whole_pass=False)
    c = native_plan(plan)
    out = ffi.new("int64_t[]", 2)
    assert lib.mmfs_microbatch_ids(c, 0, 3, out) == 0 and 8 <= min(out) and max(out) < 16
    assert lib.mmfs_microbatch_ids(c, 0, 4, out) == lib.MMFS_E_ARG  # past the files
    assert lib.mmfs_microbatch_ids(c, 2, 0, out) == lib.MMFS_E_ARG  # past the ranks
    c.phases[1].plan.kind = lib.MMFS_PLAN_PHASED  # a phase's own plan must be one sampler's
    assert lib.mmfs_microbatch_ids(c, 0, 3, out) == lib.MMFS_E_ARG
    c.phases[1].plan.kind = lib.MMFS_PLAN_SHARDED
    c.phases[0].first_file = 1  # the phases must start at file 0
    assert lib.mmfs_microbatch_ids(c, 0, 0, out) == lib.MMFS_E_ARG
    c.phases[0].first_file, c.num_phases = 0, 0
    assert lib.mmfs_microbatch_ids(c, 0, 0, out) == lib.MMFS_E_ARG
