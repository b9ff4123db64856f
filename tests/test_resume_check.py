"""`mmfs resume-check` against megatron-core's samplers (recorded in
reference/megatron_streams.json): a job on the old layout up to consumed_samples
C, resumed on a new one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from golden_cases import write_case_config
from mmfs.megatron.sampling.resume import Sampling, check_resume
from mmfs.megatron.sampling.samplers import SamplerError
from mount_fixtures import mmfs

RECORDED = json.loads((Path(__file__).parent / "reference" / "megatron_streams.json").read_text())["cases"]
CHECKED = [c for c in RECORDED if "old" in c]
SPLITS = {100: ("p2_blend2_u16", "valid"), 643: ("p3_multi_epoch_i32", "train")}


def _sampling(kind: str, dp: int, mbs: int) -> Sampling:
    return Sampling(dp, mbs, "single" if kind == "single" else "cyclic", kind != "unsharded")


def _want(c: dict) -> tuple[np.ndarray, np.ndarray]:
    """(repeated, skipped) from the recorded micro-batches alone."""
    total = c["total"]
    if "refused" in c:
        return None
    epoch = None if c["kind"] == "single" else c["consumed"] // (total - total % (c["dp"] * c["mbs"]))
    before = [i for rank in c["old"].values() for ids, e in rank if epoch is None or e == epoch for i in ids]
    after = [i for rank in c["new"].values() for ids in rank for i in ids]
    counts = np.bincount(np.array(before + after, dtype=np.int64), minlength=total)
    expected = np.unique([i for rank in c["old_pass"].values() for ids in rank for i in ids])
    return np.flatnonzero(counts > 1), expected[counts[expected] == 0]


def _name(c: dict) -> str:
    return (f"{c['kind']}-t{c['total']}-old{c['old_dp']}x{c['old_mbs']}-new{c['dp']}x{c['mbs']}-c{c['consumed']}")


def test_the_cases_have_both_answers():
    answers = [_want(c) for c in CHECKED]
    assert sum(a is not None and not a[0].size and not a[1].size for a in answers) > 10
    assert sum(a is not None and a[0].size > 0 for a in answers) > 10
    assert sum(a is not None and a[1].size > 0 for a in answers) > 10


@pytest.mark.parametrize("c", CHECKED, ids=_name)
def test_counts_are_those_of_megatrons_samplers(c):
    old = _sampling(c["kind"], c["old_dp"], c["old_mbs"])
    new = _sampling(c["kind"], c["dp"], c["mbs"])
    want = _want(c)
    if want is None:
        with pytest.raises(SamplerError):
            check_resume(c["total"], old, c["consumed"], new)
        return
    report = check_resume(c["total"], old, c["consumed"], new)
    assert report.repeated.tolist() == want[0].tolist()
    assert report.skipped.tolist() == want[1].tolist()
    assert report.exactly_once == (not want[0].size and not want[1].size)


def _config(tmp_path: Path, total: int, c: dict, name: str = "config.yaml") -> tuple[Path, str]:
    """The case's config with c's old layout, as `name` in tmp_path (configs of one
    folder share its index cache: the layout is not part of the indices)."""
    case, split = SPLITS[total]
    raw = yaml.safe_load(write_case_config(case, tmp_path).read_text())
    raw["training"] = {"data_parallel_size": c["old_dp"], "micro_batch_size": c["old_mbs"]}
    if c["kind"] != "single":
        raw["training"].update(dataloader_type="cyclic", data_sharding=c["kind"] == "sharded")
    config = tmp_path / name
    config.write_text(yaml.safe_dump(raw))
    return config, split


def _pick(total: int) -> list[dict]:
    """A case of each outcome and sampler kind for this split."""
    picked = {}
    for c in CHECKED:
        if c["total"] != total:
            continue
        want = _want(c)
        outcome = "refused" if want is None else "once" if not want[0].size and not want[1].size else "not"
        picked.setdefault((c["kind"], outcome), c)
    return list(picked.values())


@pytest.mark.parametrize("total", sorted(SPLITS))
def test_exit_codes_and_counts_through_the_command(tmp_path, total):
    for k, c in enumerate(_pick(total)):
        config, split = _config(tmp_path, total, c, f"config-{k}.yaml")
        to = f"dp={c['dp']},mbs={c['mbs']}"
        r = mmfs("resume-check", config, "--consumed", c["consumed"], "--to", to, "--split", split, "--json")
        want = _want(c)
        if want is None:
            assert r.returncode == 2 and r.stdout == "", r.stderr
            assert len(r.stderr.splitlines()) == 1 and "--consumed" in r.stderr
            continue
        assert r.stdout, r.stderr
        got = json.loads(r.stdout)
        assert r.returncode == (0 if got["exactly_once"] else 1), r.stderr
        assert (got["repeated"], got["skipped"]) == (want[0].size, want[1].size)
        assert got["first_repeated"] == want[0][:10].tolist() and got["first_skipped"] == want[1][:10].tolist()


def test_user_errors_are_one_line(tmp_path):
    c = CHECKED[0]
    config, split = _config(tmp_path, c["total"], c)
    bare = tmp_path / "bare.yaml"
    raw = yaml.safe_load(config.read_text())
    del raw["training"]
    bare.write_text(yaml.safe_dump(raw))
    for args, says in [
        ((config, "--consumed", 8, "--to", "dp=2"), "--to 'dp=2'"),
        ((config, "--consumed", 8, "--to", "dp=2,mbs=1,sampler=x"), "--to"),
        ((config, "--consumed", 3, "--to", "dp=2,mbs=1"), "not a multiple of the old layout"),
        ((config, "--consumed", -8, "--to", "dp=2,mbs=1"), "cannot be negative"),
        ((config, "--consumed", 8, "--to", "dp=16385,mbs=1"), "16384"),
        ((config, "--consumed", 8, "--to", f"dp=1,mbs={2**63}"), "more than 1,099,511,627,776 samples per step"),
        ((config, "--consumed", 8, "--to", f"dp=2,mbs={2**62}"), "more than 1,099,511,627,776 samples per step"),
        ((bare, "--consumed", 8, "--to", "dp=2,mbs=1"), "training: missing"),
        ((tmp_path / "none.yaml", "--consumed", 8, "--to", "dp=2,mbs=1"), "none.yaml"),
    ]:
        r = mmfs("resume-check", *args, "--split", split)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, (args, r.stderr)


def test_a_cyclic_job_too_many_epochs_in_is_one_line_not_a_hang(tmp_path):
    config = write_case_config("p1_single_u16", tmp_path / "c")
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": 2, "micro_batch_size": 2, "dataloader_type": "cyclic"}
    config.write_text(yaml.safe_dump(raw))
    proc = mmfs("resume-check", config, "--consumed", 4 * 10**15, "--to", "dp=2,mbs=2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "epochs in" in proc.stderr, proc.stderr
