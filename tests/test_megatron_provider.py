"""mmfs.adapters.megatron, the datasets provider for Megatron-LM's
--dataloader-type external (issue 32 item 1), without torch or Megatron, on real
mounts: each item is one micro-batch in megatron-core 0.19.2's GPTDataset fields
and order (the loader's megatron_batch, held to the recorded GPTDataset.__getitem__
by test_loader.py) of the samples Megatron's sampler gives the data-parallel rank
(the samplers' port, held to the recorded samplers by test_samplers.py), checked
here against the golden GPTDataset samples: single and cyclic (sharded, and
unsharded where the ranks' passes end apart), a resume on another data-parallel
size, a phase boundary in one launch and under Megatron's relaunch, the refusals,
a mount that dies under the job, and a plain folder copy of what a job reads.
The provider inside Megatron's own build_train_valid_test_data_iterators:
test_megatron_iterators.py."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from golden_cases import expected_samples, write_case_config
from mmfs.adapters.megatron import MegatronJobError, check_job, mount_datasets_provider, rank_stream
from mmfs.adapters.megatron_copy import copy_job_files
from mmfs.loader import Mount
from mmfs.megatron.sampling.phaseplan import PhasedSampler, PhaseSpan
from mmfs.megatron.sampling.rankplan import rank_ids
from mmfs.megatron.sampling.samplers import training_stream
from mount_fixtures import ROOT, mount_in, mounted, wait_gone

DATA = Path(__file__).resolve().parent / "golden" / "data"
# megatron-core 0.19.2 GPTDataset.__getitem__: its dict's keys in order, per flags
GPT_FIELDS = ["tokens", "labels", "loss_mask", "position_ids"]
GPT_FIELDS_MASK = ["tokens", "labels", "attention_mask", "loss_mask", "position_ids"]
GPT_FIELDS_PACKED = ["tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"]


def megatron_args(**changes) -> SimpleNamespace:
    """The arguments the provider reads, as Megatron-LM's validate_args leaves them."""
    args = dict(dataloader_type="external", seq_length=128, micro_batch_size=2, global_batch_size=16,
                eval_micro_batch_size=None, eval_global_batch_size=None, consumed_train_samples=0,
                consumed_valid_samples=0, iteration=0, rampup_batch_size=None, step_batch_size_schedule=None,
                phase_transition_iterations=None, full_validation=False, multiple_validation_sets=False,
                hybrid_context_parallel=False, sft=False, eod_mask_loss=False, reset_position_ids=False,
                reset_attention_mask=False, create_attention_mask_in_dataloader=False,
                dataloader_inter_document_masking=False)
    args.update(changes)
    return SimpleNamespace(**args)


def provide(path, args, rank, size, samples=(0, 0, 0)):
    provider = mount_datasets_provider(path, get_args=lambda: args, data_parallel=lambda: (rank, size),
                                       to_tensor=np.asarray)
    assert provider.is_distributed
    return provider(list(samples))


def assert_batch_is(batch: dict, mount: Mount, split: str, ids, fields=GPT_FIELDS, **flags) -> None:
    direct = mount.megatron_batch(split, [int(i) for i in ids], **flags)
    assert list(batch) == fields == list(direct)
    for name in fields:
        assert batch[name].dtype == direct[name].dtype and np.array_equal(batch[name], direct[name]), name


def test_importing_the_provider_needs_numpy_only():
    code = ("import sys, mmfs.adapters.megatron, mmfs.adapters.megatron_copy; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'cffi', 'yaml'}), "
            "'mmfs._native' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["[]", "False"]


# -- golden cases, through the samplers ----------------------------------------------

# (golden case, sampler, data_sharding, dp, mbs): p3's 643 train samples do not divide
# into 4 ranks of 1, so in the unsharded cyclic pass ranks 0-2 read 161 micro-batches
# and rank 3 160, and each starts its next pass from its own count
GOLDEN = {
    "single": ("p2_blend2_u16", "single", True, 4, 2),
    "cyclic": ("p2_blend2_u16", "cyclic", True, 4, 2),
    "unsharded": ("p3_multi_epoch_i32", "cyclic", False, 4, 1),
}


@pytest.fixture(scope="module")
def golden_mounts(tmp_path_factory):
    made: dict[str, tuple[str, Mount]] = {}
    with contextlib.ExitStack() as stack:
        for name, (case, sampler, sharding, dp, mbs) in GOLDEN.items():
            base = tmp_path_factory.mktemp(name)
            config = write_case_config(case, base / "config")
            raw = yaml.safe_load(config.read_text())
            raw["training"] = {"data_parallel_size": dp, "micro_batch_size": mbs, "global_batch_size": 16,
                               "dataloader_type": sampler}
            if sampler == "cyclic":
                raw["training"]["data_sharding"] = sharding
            config.write_text(yaml.safe_dump(raw, sort_keys=False))
            made[name] = (case, Mount(mount_in(stack, config, base / "mnt")))
        yield made


def _golden_text(case: str, split: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GPTDataset's tokens and labels of those samples (pad read as 0)."""
    text = expected_samples(case, split)[ids].astype(np.int64)
    text[text == -1] = 0
    return text[:, :-1], text[:, 1:]


@pytest.mark.parametrize("name", list(GOLDEN))
@pytest.mark.parametrize("consumed, count", [(0, 5), ("end", 12)])
def test_each_rank_reads_gptdataset_s_samples_in_its_sampler_s_order(golden_mounts, name, consumed, count):
    """From the start, and from 16 samples before the end of the split or epoch on
    (single: the stream ends there; cyclic: on into the next pass)."""
    case, mount = golden_mounts[name]
    _, sampler, sharding, dp, mbs = GOLDEN[name]
    total = mount.samples["train"]
    if consumed == "end":
        consumed = total - total % (dp * mbs) - 16
    args = megatron_args(seq_length=mount.sequence_length, micro_batch_size=mbs, consumed_train_samples=consumed)
    for rank in range(dp):
        train, _valid, _test = provide(mount.path, args, rank, dp, (total, 0, 0))
        want = list(itertools.islice(training_stream(sampler, total, consumed, mbs, rank, dp, sharding), count))
        got = list(itertools.islice(train, count))
        assert len(got) == len(want) == (count if sampler == "cyclic" or consumed == 0 else 16 // (dp * mbs))
        for batch, ids in zip(got, want):
            assert_batch_is(batch, mount, "train", ids)
            tokens, labels = _golden_text(case, "train", np.asarray(ids))
            assert np.array_equal(batch["tokens"], tokens) and np.array_equal(batch["labels"], labels)


def test_unsharded_cyclic_ranks_start_their_next_pass_from_their_own_count(golden_mounts):
    case, mount = golden_mounts["unsharded"]
    active = 640  # 643 - 643 % 4
    # from 624: ranks 0-2 read 5 more of epoch 0, rank 3 four; then ranks 0-2 go on
    # from 644 (epoch 1, 4 in), rank 3 from 640 (epoch 1 from its start)
    files = [len(Mount(mount.path).stream_files("train", r, 4, 1, 624)) for r in range(4)]
    assert files == [5, 5, 5, 4]
    for rank, restart in zip(range(4), (644, 644, 644, 640)):
        got = list(itertools.islice(rank_stream(mount, "train", rank, 4, 1, 624), files[rank] + 2))
        nxt = list(itertools.islice(training_stream("cyclic", 643, restart, 1, rank, 4, False), 2))
        assert restart // active == 1
        for batch, ids in zip(got[files[rank]:], nxt):
            assert np.array_equal(batch["tokens"], _golden_text(case, "train", np.asarray(ids))[0])


def test_valid_and_test_read_with_the_eval_micro_batch_size(golden_mounts):
    case, mount = golden_mounts["single"]
    args = megatron_args(eval_micro_batch_size=4, consumed_valid_samples=32)
    _train, valid, test = provide(mount.path, args, 1, 2, (1200, 100, 20))
    for split, iterator, consumed in (("valid", valid, 32), ("test", test, 0)):
        got = list(iterator)
        want = list(training_stream("single", mount.samples[split], consumed, 4, 1, 2))
        assert len(got) == len(want) > 0
        for batch, ids in zip(got, want):
            assert batch["tokens"].shape == (4, 128)
            assert np.array_equal(batch["tokens"], _golden_text(case, split, np.asarray(ids))[0])
    assert provide(mount.path, args, 1, 2, (1200, 0, 0))[1:] == (None, None)  # no evaluation: no iterators


@pytest.mark.parametrize("flags, fields", [({"eod_mask_loss": True}, GPT_FIELDS),
                                           ({"create_attention_mask_in_dataloader": True}, GPT_FIELDS_MASK),
                                           ({"dataloader_inter_document_masking": True, "reset_position_ids": True},
                                            GPT_FIELDS_PACKED)])
def test_the_batch_fields_follow_megatron_s_flags(golden_mounts, flags, fields):
    _case, mount = golden_mounts["cyclic"]
    args = megatron_args(consumed_train_samples=64, **flags)
    train, _valid, _test = provide(mount.path, args, 3, 4, (1200, 0, 0))
    loader_flags = {"eod_mask_loss": "eod_mask_loss", "create_attention_mask_in_dataloader": "create_attention_mask",
                    "dataloader_inter_document_masking": "inter_document_masking",
                    "reset_position_ids": "reset_position_ids"}
    want = training_stream("cyclic", 1200, 64, 2, 3, 4)
    for batch, ids in zip(itertools.islice(train, 3), want):
        assert_batch_is(batch, mount, "train", ids, fields, **{loader_flags[k]: v for k, v in flags.items()})


# -- a resume on another data-parallel size ------------------------------------------


@pytest.mark.parametrize("name", ["single", "cyclic"])
def test_a_resume_on_another_data_parallel_size_reads_what_megatron_s_sampler_gives(golden_mounts, name):
    """The mount's layout is dp 4 x mbs 2; the job resumes at iteration 37 on dp 2
    (global batch 16 = 2 x 2 x 4 micro-batches): each rank's stream is the sampler
    rebuilt at 592 with dp 2 (single: no sample the job read before is read again)."""
    case, mount = golden_mounts[name]
    consumed = 37 * 16
    args = megatron_args(consumed_train_samples=consumed)
    read_after = []
    for rank in range(2):
        train, _valid, _test = provide(mount.path, args, rank, 2, (1200, 0, 0))
        want = list(itertools.islice(training_stream(name, 1200, consumed, 2, rank, 2), 8))
        got = list(itertools.islice(train, 8))
        for batch, ids in zip(got, want, strict=True):
            assert_batch_is(batch, mount, "train", ids)
        read_after += [int(i) for ids in want for i in ids]
    if name == "single":  # the cyclic sampler's buckets move with the layout (mmfs resume-check says so)
        before = [int(i) for r in range(4) for ids in itertools.islice(training_stream(name, 1200, 0, 2, r, 4), 74)
                  for i in ids]
        assert len(set(before)) == consumed and not set(before) & set(read_after)


# -- a run in phases -----------------------------------------------------------------


def _ds(name: str, weight: float) -> dict:
    return {"path": str(DATA / name), "weight": weight}


@pytest.fixture(scope="module")
def phased(tmp_path_factory):
    """(mode, sampler) -> a mount of a run in two phases, the second from iteration 10
    (sample 80 of 240)."""
    made: dict[tuple[str, str], Mount] = {}
    with contextlib.ExitStack() as stack:
        def get(mode: str, sampler: str) -> Mount:
            if (mode, sampler) not in made:
                tmp = tmp_path_factory.mktemp(f"phases-{mode}-{sampler}")
                config = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0},
                          "cache_dir": str(tmp / "cache"),
                          "training": {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8,
                                       "train_iters": 30, "eval_interval": 10, "eval_iters": 2,
                                       "dataloader_type": sampler},
                          "phase_mode": mode,
                          "phases": [{"datasets": [_ds("u16_docs", 0.7), _ds("u16_multiseq", 0.3)]},
                                     {"start_iteration": 10,
                                      "datasets": [_ds("u16_small", 0.5), _ds("u16_docs", 0.5)]}]}
                path = tmp / "run.yaml"
                path.write_text(yaml.safe_dump(config))
                made[mode, sampler] = Mount(mount_in(stack, path, tmp / "mnt"))
            return made[mode, sampler]

        yield get


@pytest.mark.parametrize("sampler", ["single", "cyclic"])
def test_a_run_in_phases_is_one_launch_across_the_boundary(phased, sampler):
    """Resumed on dp 1 at iteration 9 (72 samples), the stream crosses the start of
    phase 1 at sample 80 as the mount's train split does (phase_mode continue: the
    single sampler runs over the whole run, the cyclic one over each phase's own range,
    docs/phases.md)."""
    mount = phased("continue", sampler)
    args = megatron_args(seq_length=32, global_batch_size=8, consumed_train_samples=72, iteration=9)
    train, _valid, _test = provide(mount.path, args, 0, 1, (240, 32, 8))
    if sampler == "cyclic":
        plan = PhasedSampler([PhaseSpan(*s) for s in mount.phase_spans("train")], 2, 1).plan(72)
        want = [ids.tolist() for ids in rank_ids(plan, 0)[:12]]
    else:
        want = list(itertools.islice(training_stream(sampler, 240, 72, 2, 0, 1), 12))
    got = list(itertools.islice(train, 12))
    for batch, ids in zip(got, want, strict=True):
        assert_batch_is(batch, mount, "train", ids)
    assert {mount.phase("train", int(i)) for ids in want for i in ids} == {0, 1}
    if sampler == "single":  # samples 72..79 are phase 0's, 80.. phase 1's
        assert [mount.phase("train", int(ids[0])) for ids in want] == [0] * 4 + [1] * 8


@pytest.mark.parametrize("sampler", ["single", "cyclic"])
def test_a_relaunch_at_megatron_s_phase_transitions_reads_on_in_the_same_mount(phased, sampler):
    """Megatron-LM's own --phase-transition-iterations 10 (phase_mode restart): the
    relaunch at iteration 10 passes the phase's 160 samples and reads from the
    global consumed count, phase 1's first samples; its valid and test are phase 1's
    own (the mount's valid/phases/001, test/phases/001), on the config's layout and
    on any other (data-parallel size, --eval-micro-batch-size)."""
    mount = phased("restart", sampler)
    args = megatron_args(seq_length=32, global_batch_size=8, consumed_train_samples=80, iteration=10,
                         phase_transition_iterations=[10])
    train, valid, test = provide(mount.path, args, 1, 2, (160, 32, 8))
    if sampler == "single":
        for batch, ids in zip(itertools.islice(train, 4), training_stream("single", 240, 80, 2, 1, 2)):
            assert_batch_is(batch, mount, "train", ids)
            assert {mount.phase("train", int(i)) for i in ids} == {1}
    # valid and test are phase 1's own, as the relaunch builds them, valid from the
    # checkpoint's consumed_valid_samples (8: one evaluation of the first launch)
    args.consumed_valid_samples = 8
    train, valid, test = provide(mount.path, args, 1, 2, (160, 32, 8))
    for split, iterator, first in (("valid", valid, 2), ("test", test, 0)):
        entry = mount.phases["phases"][1]["splits"][split]
        got = list(itertools.islice(iterator, entry["microbatches"] - first))
        folder = mount.path + "/" + entry["ranks_path"] + "/001"
        assert len(got) == entry["microbatches"] - first > 0
        for j, batch in enumerate(got, first):
            want = mount.microbatch_file(f"{folder}/{j:07d}.bin")
            assert all(np.array_equal(batch[k], want[k]) for k in GPT_FIELDS)
    # another layout: 4 ranks, --eval-micro-batch-size 1: Megatron's sampler over
    # the phase's own split, rebuilt there, pass after pass for cyclic (cyclic_iter);
    # cu_seqlens from the pieces of the phase's own samples
    args.eval_micro_batch_size, args.dataloader_inter_document_masking = 1, True
    for rank in range(4):
        train, valid, test = provide(mount.path, args, rank, 4, (160, 32, 8))
        for split, iterator, start in (("valid", valid, 8), ("test", test, 0)):
            total = mount.split_samples(split, phase=1)
            count = 2 * total // 4 if sampler == "cyclic" else (total - start) // 4
            want = list(itertools.islice(training_stream(sampler, total, start, 1, rank, 4), count))
            got = list(itertools.islice(iterator, count + 1))
            assert len(got) == count + (sampler == "cyclic") and count > 0
            for batch, ids in zip(got, want):
                direct = mount.megatron_batch(split, [int(i) for i in ids], phase=1, inter_document_masking=True)
                assert list(batch) == list(direct) == GPT_FIELDS_PACKED
                assert all(np.array_equal(batch[k], direct[k]) for k in GPT_FIELDS_PACKED)
            assert mount.phases["phases"][1]["splits"][split]["streams_path"] == f"{split}/phases/001/streams"
    with pytest.raises(MegatronJobError, match=r"--phase-transition-iterations start phases at samples \[96\], "
                                               r"the mount's phases at \[80\]"):
        check_job(mount, megatron_args(seq_length=32, global_batch_size=8, phase_transition_iterations="12"),
                  [240, 32, 8])


# -- refusals, in one line -------------------------------------------------------------


@pytest.mark.parametrize("change, words", [
    ({"seq_length": 64}, "sequence_length is 128, the job's --seq-length 64"),
    ({"micro_batch_size": 4}, "training.micro_batch_size is 2, the job's --micro-batch-size 4"),
    ({"global_batch_size": 32}, "training.global_batch_size is 16, the job's --global-batch-size 32"),
    ({"eval_global_batch_size": 8}, "the job's --eval-global-batch-size 8"),
    ({"step_batch_size_schedule": "0:16 1M:32"}, "the job's --step-batch-size-schedule '0:16 1M:32'"),
    ({"rampup_batch_size": ["8", "8", "100"]}, "the job's --rampup-batch-size"),
    ({"dataloader_type": "single"}, "launch with --dataloader-type external"),
    ({"full_validation": True}, "--full-validation asks len()"),
    ({"consumed_train_samples": 1200}, "no such stream"),
])
def test_a_job_that_does_not_fit_the_mount_is_one_line_and_exit_2(golden_mounts, capsys, change, words):
    _case, mount = golden_mounts["single"]
    with pytest.raises(SystemExit) as exit_:
        provide(mount.path, megatron_args(**change), 0, 4, (1200, 100, 20))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mmfs: error: ") and words in err, err


def test_a_job_that_reads_more_samples_than_the_mount_serves_is_refused(golden_mounts, capsys):
    _case, mount = golden_mounts["single"]
    for samples, words in (((1201, 100, 20), "the train split has 1200 samples, the job reads 1201"),
                           ((1200, 100, 21), "the test split has 20 samples, the job reads 21")):
        with pytest.raises(SystemExit):
            provide(mount.path, megatron_args(), 0, 4, samples)
        assert words in capsys.readouterr().err


def test_a_mount_without_a_training_block_or_a_missing_mount_is_refused(tmp_path, capsys):
    config = write_case_config("p2_blend2_u16", tmp_path / "config")
    with mounted(config, tmp_path / "mnt") as m:
        with pytest.raises(SystemExit):
            provide(m.path, megatron_args(), 0, 1, (1200, 0, 0))
        assert "has no training section: mount a config with a training: block" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        provide(tmp_path / "mnt", megatron_args(), 0, 1, (1200, 0, 0))
    err = capsys.readouterr().err
    assert "mmfs.json: not found; is " in err and err.count("\n") == 1, err


# -- Megatron's parallel state ---------------------------------------------------------


def test_the_ranks_of_one_data_parallel_rank_read_its_stream(golden_mounts, monkeypatch):
    """With Megatron's own get_args and mpu (stub modules here): every tensor-,
    pipeline- or context-parallel rank that Megatron's parallel state puts in
    data-parallel rank 1 of 4 reads that rank's stream."""
    _case, mount = golden_mounts["single"]
    args = megatron_args(consumed_train_samples=32)
    state = {"dp_rank": 1}
    mpu = types.SimpleNamespace(get_data_parallel_rank=lambda: state["dp_rank"],
                                get_data_parallel_world_size=lambda: 4)
    megatron, core, training = (types.ModuleType(n) for n in ("megatron", "megatron.core", "megatron.training"))
    core.mpu, training.get_args, megatron.core, megatron.training = mpu, lambda: args, core, training
    for name, module in (("megatron", megatron), ("megatron.core", core), ("megatron.training", training)):
        monkeypatch.setitem(sys.modules, name, module)
    want = list(itertools.islice(training_stream("single", 1200, 32, 2, 1, 4), 3))
    for _other_parallel_rank in range(3):  # e.g. tensor-parallel ranks 0..2 of data-parallel rank 1
        provider = mount_datasets_provider(mount.path, to_tensor=np.asarray)
        train, _valid, _test = provider([1200, 0, 0], vp_stage=None)
        for batch, ids in zip(list(itertools.islice(train, 3)), want, strict=True):
            assert_batch_is(batch, mount, "train", ids)


# -- a mount that dies under the job ---------------------------------------------------


def test_a_mount_that_dies_under_the_job_is_one_line_and_exit_2(tmp_path, capsys):
    config = write_case_config("p2_blend2_u16", tmp_path / "config")
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": 4, "micro_batch_size": 2, "global_batch_size": 16}
    config.write_text(yaml.safe_dump(raw))
    with mounted(config, tmp_path / "mnt") as m:
        train, _valid, _test = provide(m.path, megatron_args(), 0, 4, (1200, 0, 0))
        assert next(train)["tokens"].shape == (2, 128)
        os.kill(m.pid, signal.SIGKILL)
        assert wait_gone(m.pid)
        with pytest.raises(SystemExit) as exit_:
            next(train)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Transport endpoint is not connected" in err and "mount it again" in err, err


# -- a plain folder copy of what a job reads ---------------------------------------------


@pytest.mark.parametrize("name", ["single", "unsharded"])
def test_a_plain_folder_copy_of_a_job_s_files_gives_the_same_batches(golden_mounts, tmp_path, name):
    """copy_job_files takes what every rank of a job reads (train from a resumed
    count, on into the next pass for cyclic; valid; test) into a folder without
    extended attributes; the provider reads it as it reads the mount, fields that
    need the samples' pieces (inter_document_masking) included."""
    case, mount = golden_mounts[name]
    _case, _sampler, _sharding, dp, mbs = GOLDEN[name]
    total = mount.samples["train"]
    consumed = total - total % (dp * mbs) - 16
    count = 16 // (dp * mbs) + (3 if name == "unsharded" else 0)
    evals = {s: (mbs, 0, 2) for s in ("valid", "test") if mount.samples.get(s)}
    copied = copy_job_files(mount.path, tmp_path / "copy", dp, {"train": (mbs, consumed, count), **evals})
    assert copied["files"] == dp * (count + 2 * len(evals))
    assert not [a for a in os.listxattr(next((tmp_path / "copy" / "train").rglob("*.bin"))) if a.startswith("user.")]
    samples = (total, 2 * dp * mbs if evals else 0, 2 * dp * mbs if evals else 0)
    args = megatron_args(seq_length=mount.sequence_length, micro_batch_size=mbs, consumed_train_samples=consumed,
                         dataloader_inter_document_masking=True)
    reads = {"train": count, "valid": 2, "test": 2}
    for rank in range(dp):
        on_mount = provide(mount.path, args, rank, dp, samples)
        on_copy = provide(tmp_path / "copy", args, rank, dp, samples)
        for split, a, b in zip(("train", "valid", "test"), on_mount, on_copy, strict=True):
            if a is None:
                assert b is None
                continue
            got, want = list(itertools.islice(b, reads[split])), list(itertools.islice(a, reads[split]))
            assert len(got) == len(want) == reads[split]
            for x, y in zip(got, want):
                assert list(x) == GPT_FIELDS_PACKED and all(np.array_equal(x[k], y[k]) for k in x)
        if name == "unsharded":  # past what the copy holds: the next pass's folder is not there
            with pytest.raises(SystemExit):
                next(on_copy[0])
