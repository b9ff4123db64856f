"""mmfs.loader against megatron-core 0.19.2's outputs: GPTDataset.__getitem__
(golden getitem-*.npz, and the recorded uint16 / EOD 65535 / pad -1 case) and the
samplers' micro-batches (golden ranks-*.json), read from real mounts."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from golden_cases import PUBLIC, load_case, write_case_config
from mmfs.loader import LoaderError, Mount
from mount_fixtures import mount_in, mounted

REFERENCE = Path(__file__).parent / "reference"
VARIANT_FLAGS = ("eod_mask_loss", "reset_position_ids", "reset_attention_mask", "create_attention_mask",
                 "inter_document_masking")


def _with_training(config: Path, training: dict) -> Path:
    raw = yaml.safe_load(config.read_text())
    raw["training"] = training
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


@pytest.fixture(scope="module")
def case_dirs(tmp_path_factory):
    """case -> a mount of that golden case (mounted once per module)."""
    made: dict[str, Path] = {}
    stack = contextlib.ExitStack()

    def get(case: str, training: dict | None = None) -> Path:
        key = case + json.dumps(training, sort_keys=True)
        if key not in made:
            base = tmp_path_factory.mktemp(case)
            config = write_case_config(case, base / "config")
            if training:
                _with_training(config, training)
            made[key] = mount_in(stack, config, base / "mnt")
        return made[key]

    with stack:
        yield get


def _flags(case: str, variant: str) -> dict:
    cfg = load_case(case)["config"]
    flags = {k: bool(cfg.get(k, False)) for k in VARIANT_FLAGS}
    flags.update(json.loads((PUBLIC / case / f"getitem-{variant}.json").read_text())["flags"])
    return flags


def _assert_items_equal(mount: Mount, split: str, golden, prefix: str, flags: dict) -> None:
    fields = sorted({k[len(prefix):] for k in golden.files if k.startswith(prefix)} - {"ids"})
    for row, i in enumerate(golden[prefix + "ids"]):
        item = mount.megatron_item(split, int(i), **flags)
        assert sorted(item) == fields, (split, i)
        for name in fields:
            want = golden[prefix + name][row]
            got = item[name]
            assert got.dtype == want.dtype and got.shape == want.shape, (split, i, name, got.dtype, got.shape)
            assert np.array_equal(got, want), (split, i, name)


def _golden_getitems():
    for case_dir in sorted(PUBLIC.iterdir()):
        for path in sorted(case_dir.glob("getitem-*.npz")):
            yield pytest.param(case_dir.name, path.stem.split("-", 1)[1], id=f"{case_dir.name}-{path.stem}")


@pytest.mark.parametrize("case,variant", list(_golden_getitems()))
def test_megatron_item_equals_golden_getitem(case_dirs, case, variant):
    mount = Mount(case_dirs(case))
    golden = np.load(PUBLIC / case / f"getitem-{variant}.npz")
    splits = {k.split(".")[0] for k in golden.files}
    for split in sorted(splits):
        _assert_items_equal(mount, split, golden, f"{split}.", _flags(case, variant))


def _pad_case_config(tmp_path: Path, extra: int) -> Path:
    case = json.loads((REFERENCE / "pad_eod65535" / "cases.json").read_text())[f"e{extra}"]
    config = {
        "datasets": [{"path": str(REFERENCE / "pad_eod65535" / "data")}],
        "split": case["split"], "seed": case["seed"], "sequence_length": case["sequence_length"],
        "add_extra_token_to_sequence": case["add_extra_token_to_sequence"],
        "drop_last_partial_validation_sequence": case["drop_last_partial_validation_sequence"],
        "tokenizer": {"eod": case["eod"], "pad": case["pad"], "vocab_size": 65536},
        "cache_dir": str(tmp_path / "cache"),
    }
    path = tmp_path / f"e{extra}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("extra", [1, 0])
def test_pad_minus_one_in_uint16_is_not_the_eod_65535_through_a_real_mount(tmp_path, extra):
    golden = np.load(REFERENCE / "pad_eod65535" / f"getitem-e{extra}.npz")
    with mounted(_pad_case_config(tmp_path, extra), tmp_path / "mnt") as m:
        mount = Mount(m.path)
        assert mount.dtype == np.dtype("<u2") and mount.pad == -1 and mount.eod == 65535
        # The collision itself: the padded sample holds 65535 both as EOD and as pad.
        padded = [i for i in range(mount.samples["valid"]) if len(mount.sample("valid", i))
                  > sum(n for _s, _o, n in mount.pieces("valid", i))]
        assert len(padded) == 1
        raw = mount.sample("valid", padded[0])
        real = sum(n for _s, _o, n in mount.pieces("valid", padded[0]))
        assert (raw[real:] == 65535).all() and (raw[:real] == 65535).any()
        for variant in ("plain", "masks", "docmask"):
            flags = json.loads(json.dumps(
                {"plain": {}, "masks": dict.fromkeys(VARIANT_FLAGS[:4], True),
                 "docmask": {"inter_document_masking": True}}[variant]))
            for split in ("train", "valid"):
                _assert_items_equal(mount, split, golden, f"{split}.{variant}.", flags)


# -- micro-batches of a rank -------------------------------------------------------------


def _golden_ranks():
    for case_dir in sorted(PUBLIC.iterdir()):
        for path in sorted(case_dir.glob("ranks-*.json")):
            yield pytest.param(case_dir.name, path, id=f"{case_dir.name}-{path.stem}")


def _training_block(golden: dict) -> dict:
    t = dict(golden["training"])
    if t["dataloader_type"] == "single":
        t.pop("data_sharding", None)
    return t


@pytest.mark.parametrize("case,path", list(_golden_ranks()))
def test_microbatches_equal_megatrons_samplers(case_dirs, case, path):
    golden = json.loads(path.read_text())
    root = case_dirs(case, _training_block(golden))
    mount = Mount(root)
    mbs = golden["training"]["micro_batch_size"]
    assert mount.training["microbatches"] == {s: n for s, n in golden["microbatches_per_rank"].items()
                                              if s in mount.samples}
    for split, per_rank in golden["ranks"].items():
        if split not in mount.samples:
            continue
        has_ranks = golden["microbatches_per_rank"][split] > 0
        assert (root / split / "ranks").is_dir() == has_ranks
        for rank, batches in per_rank.items():
            got = list(mount.microbatches(split, int(rank)))
            assert len(got) == golden["microbatches_per_rank"][split]
            assert all(g.flags.writeable and g.dtype == mount.dtype for g in got)
            for j, ids in enumerate(batches):
                expected = np.stack([mount.sample(split, i) for i in ids])
                assert got[j].shape == (mbs, mount.tokens_per_sample)
                assert np.array_equal(got[j], expected)
                assert mount.microbatch_samples(split, int(rank), j) == ids


def test_resume_reads_on_from_the_file_consumed_samples_names(case_dirs):
    golden = json.loads((PUBLIC / "p2_blend2_u16" / "ranks-single_dp4_mb2.json").read_text())
    mount = Mount(case_dirs("p2_blend2_u16", _training_block(golden)))
    step = 2 * 4
    full = {r: list(mount.microbatches("train", r)) for r in range(4)}
    for consumed in (0, step, 7 * step, 149 * step, 150 * step):
        for r in range(4):
            resumed = list(mount.microbatches("train", r, consumed_samples=consumed))
            tail = full[r][consumed // step:]
            assert len(resumed) == len(tail) and all(np.array_equal(a, b) for a, b in zip(resumed, tail))
    with pytest.raises(LoaderError, match="not a multiple of micro_batch_size x data_parallel_size = 8"):
        next(mount.microbatches("train", 0, consumed_samples=12))
    with pytest.raises(LoaderError, match="past the 150 micro-batches"):
        next(mount.microbatches("train", 0, consumed_samples=151 * step))
    with pytest.raises(LoaderError, match="rank 4"):
        next(mount.microbatches("train", 4))


def test_megatron_batches_stack_megatron_items(case_dirs):
    golden = json.loads((PUBLIC / "p1_single_u16" / "ranks-cyclic_dp3_mb2_sharded.json").read_text())
    mount = Mount(case_dirs("p1_single_u16", _training_block(golden)))
    for flags in ({}, {"eod_mask_loss": True, "reset_position_ids": True, "reset_attention_mask": True,
                       "create_attention_mask": True}, {"inter_document_masking": True}):
        batches = mount.megatron_batches("valid", 2, consumed_samples=2 * 6, **flags)
        for j, batch in enumerate(batches, start=2):
            ids = golden["ranks"]["valid"]["2"][j]
            items = [mount.megatron_item("valid", i, **flags) for i in ids]
            assert list(batch) == list(items[0])
            for name, value in batch.items():
                assert np.array_equal(value, np.stack([it[name] for it in items])), (j, name)
            direct = mount.megatron_batch("valid", ids, **flags)
            assert all(np.array_equal(direct[k], batch[k]) for k in batch)
    with pytest.raises(TypeError, match="unknown flag"):
        next(mount.megatron_batches("valid", 0, eod_mask=True))


def test_a_stream_of_another_layout_is_read_as_megatrons_sampler_gives_it(case_dirs):
    golden = json.loads((PUBLIC / "p2_blend2_u16" / "ranks-single_dp4_mb2.json").read_text())
    mount = Mount(case_dirs("p2_blend2_u16", _training_block(golden)))
    # the mount's own layout from 0 is its ranks/ folder
    want = golden["ranks"]["train"]["3"]  # (the first micro-batches)
    files = mount.stream_files("train", 3, 4, 2, 0)
    assert [mount.microbatch_file(f)["sample_ids"].tolist() for f in files[:len(want)]] == want
    # resumed at 40 on dp 3, mbs 1: Megatron's single sampler hands rank 1 samples 41, 44, 47, ...
    files = mount.stream_files("train", 1, 3, 1, 40)
    assert files[0] == mount.stream_dir("train", 1, 3, 1, 40) + "/0000000.bin"
    assert files[0].endswith("/train/streams/dp=3,mbs=1,from=40/001/0000000.bin")
    batches = [mount.microbatch_file(f) for f in files[:5]]
    assert [b["sample_ids"].tolist() for b in batches] == [[41], [44], [47], [50], [53]]
    direct = mount.megatron_batch("train", [44])
    assert all(np.array_equal(batches[1][k], direct[k]) for k in direct)
    assert mount.stream_dir("train", 0, 2, 2, 8, "cyclic", False).endswith("dp=2,mbs=2,from=8,sampler=cyclic,"
                                                                            "sharding=false/000")
    with pytest.raises(LoaderError, match="no such stream"):
        mount.stream_files("train", 0, 3, 1, 10**9)  # past the end of the split: Megatron refuses it
    with pytest.raises(LoaderError, match="rank 3 is outside"):
        mount.stream_dir("train", 3, 3, 1, 0)


def test_a_mount_without_a_training_section_says_so(case_dirs):
    mount = Mount(case_dirs("p4_single_multiseq"))
    with pytest.raises(LoaderError, match="no `training` section"):
        next(mount.microbatches("train", 0))
    with pytest.raises(LoaderError, match="not found"):
        Mount(Path(mount.path) / "train")


def test_importing_the_loader_imports_neither_torch_nor_the_c_core():
    code = ("import sys, mmfs.loader; bad = [m for m in ('torch', 'mmfs._native', 'cffi') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


BAD_ARGUMENTS = [3.0, "3", True, None, -1, -120000]


@pytest.mark.parametrize("value", BAD_ARGUMENTS, ids=repr)
def test_every_public_method_names_a_bad_argument(case_dirs, value):
    golden = json.loads((PUBLIC / "p2_blend2_u16" / "ranks-single_dp4_mb2.json").read_text())
    mount = Mount(case_dirs("p2_blend2_u16", _training_block(golden)))
    calls = {
        "i": [lambda v: mount.sample("train", v), lambda v: mount.sample_path("train", v),
              lambda v: mount.pieces("train", v), lambda v: mount.megatron_item("train", v)],
        "ids[1]": [lambda v: mount.megatron_batch("train", [0, v])],
        "rank": [lambda v: mount.microbatch_path("train", v, 0), lambda v: mount.microbatch_samples("train", v, 0),
                 lambda v: next(mount.microbatches("train", v)), lambda v: next(mount.megatron_batches("train", v))],
        "j": [lambda v: mount.microbatch_path("train", 0, v)],
        "consumed_samples": [lambda v: next(mount.microbatches("train", 0, consumed_samples=v)),
                             lambda v: next(mount.megatron_batches("train", 0, consumed_samples=v))],
    }
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(LoaderError, match=f"^{re.escape(name)} must be"):
                fn(value)
    with pytest.raises(LoaderError, match="no split"):
        mount.sample(3, 0)
