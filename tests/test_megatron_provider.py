"""examples/megatron_phases.py, the datasets provider for Megatron-LM's
--dataloader-type external (issue 27 item 7), without torch or Megatron: each item
is one micro-batch in megatron-core 0.19.2's GPTDataset fields and order (the
loader's megatron_batch, held to the recorded GPTDataset.__getitem__ by
test_loader.py), of the samples Megatron's sampler gives the rank (the samplers'
port, held to the recorded samplers), across the phases of a run."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from mmfs.loader import LoaderError, Mount
from mmfs.megatron.sampling.phaseplan import PhasedSampler, PhaseSpan
from mmfs.megatron.sampling.rankplan import plan_stream, rank_ids
from mount_fixtures import mounted

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "megatron_phases.py"
DATA = Path(__file__).resolve().parent / "golden" / "data"
# megatron-core 0.19.2 GPTDataset.__getitem__: its dict's keys in order, per flags
GPT_FIELDS = ["tokens", "labels", "loss_mask", "position_ids"]
GPT_FIELDS_MASK = ["tokens", "labels", "attention_mask", "loss_mask", "position_ids"]
GPT_FIELDS_PACKED = ["tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"]


def _example():
    spec = importlib.util.spec_from_file_location("megatron_phases", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pass(mount: Mount, sampler: str, split: str, mbs: int, dp: int, consumed: int):
    """The plan of the stream folder from `consumed`: one pass of Megatron's sampler, or
    in a phased train split under cyclic, each phase's own sampler (docs/phases.md)."""
    spans = mount.phase_spans(split)
    if sampler == "cyclic" and spans:
        return PhasedSampler([PhaseSpan(*s) for s in spans], mbs, dp).plan(consumed)
    return plan_stream(mount.samples[split], mbs, dp, consumed, sampler, True)


def _ds(name: str, weight: float) -> dict:
    return {"path": str(DATA / name), "weight": weight}


@pytest.fixture(scope="module", params=["single", "cyclic"])
def run(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    config = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0}, "cache_dir": str(tmp / "cache"),
              "training": {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8,
                           "train_iters": 30, "eval_interval": 10, "eval_iters": 2,
                           "dataloader_type": request.param},
              "phases": [{"datasets": [_ds("u16_docs", 0.7), _ds("u16_multiseq", 0.3)]},
                         {"start_iteration": 10, "datasets": [_ds("u16_small", 0.5), _ds("u16_docs", 0.5)]}]}
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    (tmp / "mnt").mkdir()
    with mounted(path, tmp / "mnt") as m:
        yield request.param, Mount(m.path)


@pytest.mark.parametrize("flags, fields", [({}, GPT_FIELDS), ({"create_attention_mask": True}, GPT_FIELDS_MASK),
                                           ({"inter_document_masking": True}, GPT_FIELDS_PACKED)])
def test_rank_stream_is_megatrons_batches_of_the_samplers_ids(run, flags, fields):
    sampler, mount = run
    example = _example()
    # another layout than the mount's, resumed before the boundary at 80 (the cyclic samplers of a
    # run in phases read whole micro-batch steps of each phase: mbs x dp divides the global batch)
    dp, mbs, consumed = (3, 2, 72) if sampler == "single" else (4, 1, 72)
    for rank in range(dp):
        plan = _pass(mount, sampler, "train", mbs, dp, consumed)
        want = rank_ids(plan, rank)
        got = list(itertools.islice(example.rank_stream(mount, "train", rank, dp, mbs, consumed, **flags),
                                    len(want) + 3))
        assert len(got) == len(want) + (3 if sampler == "cyclic" else 0)
        for batch, ids in zip(got, want):
            assert list(batch) == fields
            direct = mount.megatron_batch("train", ids.tolist(), **flags)
            assert list(direct) == fields
            for name in fields:
                assert batch[name].dtype == direct[name].dtype and np.array_equal(batch[name], direct[name])
        if sampler == "cyclic":  # on into the next epoch, as cyclic_iter goes on
            next_epoch = _pass(mount, sampler, "train", mbs, dp, consumed + len(rank_ids(plan, 0)) * dp * mbs)
            for batch, ids in zip(got[len(want):], rank_ids(next_epoch, rank)):
                assert np.array_equal(batch["tokens"], mount.megatron_batch("train", ids.tolist())["tokens"])
    plan = _pass(mount, sampler, "train", mbs, dp, consumed)
    phases = {mount.phase("train", int(i)) for r in range(dp) for i in rank_ids(plan, r).ravel()}
    assert phases == {0, 1}  # the streams cross the phase boundary


def test_the_provider_hands_each_rank_its_three_streams(run):
    sampler, mount = run
    example = _example()
    args = SimpleNamespace(dataloader_type="external", seq_length=32, micro_batch_size=2,
                           consumed_train_samples=88, consumed_valid_samples=8, eod_mask_loss=True)
    provider = example.mount_datasets_provider(mount.path, get_args=lambda: args,
                                               data_parallel=lambda: (1, 2), to_tensor=np.asarray)
    assert provider.is_distributed
    train, valid, test = provider([240, 32, 8])
    for split, iterator, consumed in (("train", train, 88), ("valid", valid, 8), ("test", test, 0)):
        ids = rank_ids(_pass(mount, sampler, split, 2, 2, consumed), 1)
        for batch, want in zip(itertools.islice(iterator, 3), ids):
            direct = mount.megatron_batch(split, want.tolist(), eod_mask_loss=True)
            assert list(batch) == GPT_FIELDS
            assert all(np.array_equal(batch[k], direct[k]) for k in GPT_FIELDS)
    assert provider([240, 0, 0])[1] is None  # no evaluation: no valid iterator


@pytest.mark.parametrize("change, words", [
    ({"seq_length": 64}, "--seq-length 64"),
    ({"dataloader_type": "single"}, "--dataloader-type external"),
])
def test_the_provider_refuses_a_job_that_does_not_fit_the_mount(run, change, words):
    sampler, mount = run
    example = _example()
    args = SimpleNamespace(dataloader_type="external", seq_length=32, micro_batch_size=2,
                           consumed_train_samples=0, consumed_valid_samples=0, **{})
    for key, value in change.items():
        setattr(args, key, value)
    provider = example.mount_datasets_provider(mount.path, get_args=lambda: args, data_parallel=lambda: (0, 2),
                                               to_tensor=np.asarray)
    with pytest.raises(LoaderError, match=words):
        provider([240, 32, 8])
    with pytest.raises(LoaderError, match="the train split has 240 samples, the job reads 241"):
        example.mount_datasets_provider(mount.path, get_args=lambda: SimpleNamespace(
            dataloader_type="external", seq_length=32, micro_batch_size=2, consumed_train_samples=0,
            consumed_valid_samples=0), data_parallel=lambda: (0, 2), to_tensor=np.asarray)([241, 32, 8])
