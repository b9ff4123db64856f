"""Megatron's samplers and torch.randperm, against recorded outputs of the real ones
(tests/reference/megatron_samplers.json, written by record_megatron_samplers.py with
torch 2.13.0 and megatron-core 0.19.2) and the golden ranks-*.json."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden_cases import PUBLIC, case_names, load_case
from mmfs.config.schema import TrainingConfig
from mmfs.megatron.sampling.randperm import mt19937_raw, randperm
from mmfs.megatron.sampling.rankplan import microbatch_ids, plan_ranks, rank_ids, stream_microbatch
from mmfs.megatron.sampling.samplers import SamplerError, single_sampler
from mmfs.mount.manifest import describe_training
from mmfs.native import lib
from sampler_helpers import randperm_inside_out, training_stream

RANDPERM_SMALL_LIMIT = lib.MMFS_RANDPERM_SMALL_LIMIT

RECORDED = json.loads((Path(__file__).parent / "reference" / "megatron_samplers.json").read_text())


def _case_id(c: dict) -> str:
    return f"{c['kind']}-t{c['total']}-mb{c['micro_batch_size']}-dp{c['data_parallel_size']}-c{c['consumed']}"


def _loader_args(kind: str) -> tuple[str, bool]:
    return ("single", True) if kind == "single" else ("cyclic", kind == "sharded")


# -- randperm and its generator -------------------------------------------------------


def test_randperm_equals_recorded_torch_small():
    for rec in RECORDED["randperm"]["small"]:
        assert randperm(rec["n"], rec["seed"]).tolist() == rec["perm"], (rec["n"], rec["seed"])


@pytest.mark.parametrize("rec", RECORDED["randperm"]["large"], ids=lambda r: f"n{r['n']}")
def test_randperm_equals_recorded_torch_at_the_algorithm_switch(rec):
    perm = randperm(rec["n"], rec["seed"], np.int32)
    assert perm[rec["positions"]].tolist() == rec["values"]
    assert hashlib.sha256(perm.tobytes()).hexdigest() == rec["sha256_int32_le"]


def test_the_recorded_large_cases_straddle_torchs_switch():
    assert {r["n"] for r in RECORDED["randperm"]["large"]} == {RANDPERM_SMALL_LIMIT - 1, RANDPERM_SMALL_LIMIT}


@pytest.mark.parametrize("seed", [0, 1, 5, 1234, 2**31, 2**32 - 1])
def test_mt19937_equals_numpy_legacy_randomstate(seed):
    # numpy's legacy RandomState seeds MT19937 exactly as torch's manual_seed does;
    # randint over the full uint32 range hands out its raw words.
    expected = np.random.RandomState(seed).randint(0, 2**32, size=2000, dtype=np.uint32)
    assert np.array_equal(mt19937_raw(seed, 2000), expected)


def _python_randperm(n: int, seed: int, inside_out: bool) -> list[int]:
    """torch's two randperm algorithms, over numpy's MT19937 words."""
    words = iter(np.random.RandomState(seed).randint(0, 2**32, size=2 * n + 2, dtype=np.uint32).tolist())
    if inside_out:
        r = [0] * n
        for i in range(n):
            z = ((next(words) << 32) | next(words)) % (i + 1)
            r[i] = r[z]
            r[z] = i
        return r
    r = list(range(n))
    for i in range(n - 1):
        z = next(words) % (n - i)
        r[i], r[i + z] = r[i + z], r[i]
    return r


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1))
def test_both_randperm_algorithms_equal_their_definition_over_numpy(n, seed):
    assert randperm(n, seed).tolist() == _python_randperm(n, seed, inside_out=False)
    assert randperm(n, seed, np.int32).tolist() == _python_randperm(n, seed, inside_out=False)
    assert randperm_inside_out(n, seed).tolist() == _python_randperm(n, seed, inside_out=True)


def test_randperm_rejects_bad_arguments():
    with pytest.raises(ValueError):
        randperm(-1, 0)
    with pytest.raises(ValueError):
        randperm(3, 0, np.float64)


# -- the samplers: streams, resume and the plan ------------------------------------------


@pytest.mark.parametrize("kind", ["single", "sharded", "unsharded"])
def test_training_stream_equals_megatron(kind):
    cases = [c for c in RECORDED["samplers"] if c["kind"] == kind]
    assert len(cases) > 300
    for c in cases:
        loader, sharding = _loader_args(kind)
        for rank, expected in c["streams"].items():
            stream = training_stream(loader, c["total"], c["consumed"], c["micro_batch_size"], int(rank),
                                     c["data_parallel_size"], sharding)
            got = [list(b) for b in itertools.islice(stream, len(expected))]
            assert got == expected, (_case_id(c), rank)


_BY_KEY = {(c["kind"], c["total"], c["micro_batch_size"], c["data_parallel_size"], c["consumed"]): c
           for c in RECORDED["samplers"]}


def _recorded(kind, total, mbs, dp, consumed):
    return _BY_KEY.get((kind, total, mbs, dp, consumed))


def test_plan_files_are_megatrons_micro_batches_from_zero_and_on_resume():
    checked_resumes = 0
    for c in RECORDED["samplers"]:
        if c["consumed"] != 0:
            continue
        total, mbs, dp = c["total"], c["micro_batch_size"], c["data_parallel_size"]
        loader, sharding = _loader_args(c["kind"])
        plan = plan_ranks(total, mbs, dp, loader, sharding)
        assert plan.files_per_rank == total // (mbs * dp)
        for rank, stream in c["streams"].items():
            r = int(rank)
            files = rank_ids(plan, r)
            assert files.shape == (plan.files_per_rank, mbs)
            known = min(plan.files_per_rank, len(stream))
            assert files[:known].tolist() == stream[:known], (_case_id(c), rank)
            for j in range(known):
                assert microbatch_ids(plan, r, j).tolist() == stream[j]
            # stream_microbatch: any micro-batch of the uninterrupted run, past the files too
            for n, batch in enumerate(stream):
                got = stream_microbatch(plan, r, n)
                assert got is not None and got[0].tolist() == batch, (_case_id(c), rank, n)
            if c["kind"] == "single":
                assert stream_microbatch(plan, r, plan.files_per_rank) is None
        # resume at j*mbs*dp reads file j first
        for j in range(1, plan.files_per_rank + 1):
            resumed = _recorded(c["kind"], total, mbs, dp, j * mbs * dp)
            if resumed is None or j == plan.files_per_rank:
                continue
            for rank, stream in resumed["streams"].items():
                assert stream[0] == microbatch_ids(plan, int(rank), j).tolist(), (_case_id(resumed), rank)
                checked_resumes += 1
    assert checked_resumes > 500


def test_the_recorded_cases_include_drifting_unsharded_ranks():
    # The case the module doc warns about: rank 0 reads past `files` in epoch 0,
    # i.e. perm[0::dp] holds at least (files + 1) * mbs ids.
    def drifts(c):
        mbs, dp = c["micro_batch_size"], c["data_parallel_size"]
        full = (c["total"] // mbs) * mbs
        return -(-full // dp) >= (c["total"] // (mbs * dp) + 1) * mbs

    assert any(c["kind"] == "unsharded" and c["consumed"] == 0 and drifts(c) for c in RECORDED["samplers"])


def _golden_ranks():
    for case in case_names():
        for path in sorted((PUBLIC / case).glob("ranks-*.json")):
            yield pytest.param(case, path, id=f"{case}-{path.stem}")


@pytest.mark.parametrize("case,path", list(_golden_ranks()))
def test_plan_equals_golden_ranks(case, path):
    golden = json.loads(path.read_text())
    t = golden["training"]
    splits = load_case(case)["splits"]
    for split, per_rank in golden["microbatches_per_rank"].items():
        plan = plan_ranks(splits[split]["length"], t["micro_batch_size"], t["data_parallel_size"],
                          t["dataloader_type"], t.get("data_sharding", True))
        assert plan.files_per_rank == per_rank
        for rank, batches in golden["ranks"][split].items():
            assert rank_ids(plan, int(rank))[:len(batches)].tolist() == batches


def test_sampler_errors_are_mmfs_errors():
    with pytest.raises(SamplerError, match="no samples left"):
        list(single_sampler(10, 10, 2, 0, 2))
    with pytest.raises(SamplerError, match="rank 2"):
        list(single_sampler(10, 0, 2, 2, 2))
    with pytest.raises(SamplerError, match="dataloader_type"):
        next(training_stream("external", 10, 0, 2, 0, 2))
    with pytest.raises(SamplerError, match="fewer than"):
        next(training_stream("cyclic", 3, 0, 2, 0, 2))
    with pytest.raises(SamplerError, match="not a multiple"):
        next(training_stream("cyclic", 20, 3, 2, 0, 2))
    plan = plan_ranks(20, 2, 2, "cyclic", False)
    with pytest.raises(SamplerError, match="not below"):
        microbatch_ids(plan, 0, plan.files_per_rank)


def test_describe_training_names_and_counts():
    t = TrainingConfig(data_parallel_size=1001, micro_batch_size=2, global_batch_size=2002 * 3)
    d = describe_training(t, {"train": 20_000_000, "valid": 2001, "test": 2002}, bytes_per_sample=8194)
    assert d["rank_name_width"] == 4  # digits of 1000
    assert d["microbatches"] == {"train": 9990, "valid": 0, "test": 1}
    assert d["microbatch_name_width"] == {"train": 7, "valid": 7, "test": 7}
    assert d["ranks_path"] == {"train": "train/ranks", "test": "test/ranks"}
    assert d["bytes_per_microbatch"] == 2 * 8194 and d["microbatches_per_iteration"] == 3
    assert d["sampler"] == "single" and d["data_parallel_size"] == 1001
    small = describe_training(TrainingConfig(8, 1), {"train": 8 * 10_000_001}, 2)
    assert small["rank_name_width"] == 3 and small["microbatch_name_width"] == {"train": 8}
    assert "microbatches_per_iteration" not in small


def test_the_c_plan_reads_int32_and_int64_permutations_alike():
    wide = plan_ranks(100, 2, 3, "cyclic", False)
    wide64 = type(wide)(**{**wide.__dict__, "permutation": wide.permutation.astype(np.int64)})
    assert wide.permutation.dtype == np.int32
    for j in range(wide.files_per_rank):
        assert microbatch_ids(wide64, 1, j).tolist() == microbatch_ids(wide, 1, j).tolist()
        assert microbatch_ids(wide, 1, j).tolist() == wide.permutation[(j * 2 + np.arange(2)) * 3 + 1].tolist()
