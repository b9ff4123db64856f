"""`mmfs report --json`: the figures against megatron-core's own indices (the golden
cases), the warnings, and the sampler order the mix and rank figures are counted in."""

import html
import json
import os
import shutil

import numpy as np
import pytest
import yaml

from golden_cases import PUBLIC, case_names, load_case, write_case_config
from mmfs.cli import main
from mmfs.config.schema import load_config
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.megatron.sampling.rankplan import microbatch_ids, plan_ranks, stream_order
from mmfs.tools.report.command import report


def _golden(case: str, split: str, name: str) -> np.ndarray:
    return np.load(PUBLIC / case / f"{split}.{name}.npy")


def _dataset_file(prefix: str) -> str:
    return prefix.rsplit("/", 1)[-1]


@pytest.mark.parametrize("case", case_names())
def test_figures_agree_with_megatron_indices(case, tmp_path):
    info = load_case(case)
    figs = report(str(write_case_config(case, tmp_path)), browser=False)
    assert list(figs["splits"]) == [s for s in ("train", "valid", "test") if s in figs["splits"]]
    for split, s in figs["splits"].items():
        blended = s["top_level"] == "BlendedDataset"
        assert (PUBLIC / case / f"{split}.blend.dataset_index.npy").exists() == blended
        if blended:
            dataset_index = _golden(case, split, "blend.dataset_index")
            drawn = np.bincount(dataset_index, minlength=len(s["datasets"]))
            assert s["samples"] == len(dataset_index)
        for d, row in enumerate(s["datasets"]):
            name = _dataset_file(row["path"])
            docs = _golden(case, split, f"{name}.document_index")
            rows = _golden(case, split, f"{name}.sample_index")
            shuffle = _golden(case, split, f"{name}.shuffle_index")
            read = int(drawn[d]) if blended else len(shuffle)
            assert row["samples"] == read
            assert row["share"] == pytest.approx(read / s["samples"])
            assert row["samples_built"] == len(shuffle)
            assert row["epochs_in_index"] == len(docs) // row["documents"]
            # the samples read are the GPTDataset's first `read` (the blend draws them in order)
            k = shuffle[:read].astype(np.int64)
            first, last = rows[k, 0].astype(np.int64), rows[k + 1, 0].astype(np.int64)
            assert row["documents_per_sample"] == np.bincount(last - first + 1).tolist()
            assert row["epochs_reached"] == int(last.max() // row["documents"]) + 1
            lengths = np.diff(_sequence_bounds(info, row["path"]))
            ends = rows[k + 1, 1].astype(np.int64) + int(info["config"]["add_extra_token_to_sequence"])
            assert row["mid_document"] == int(np.count_nonzero(ends < lengths[docs[last]]))
            beg, end = row["sequences"]
            assert row["tokens_available"] == int(lengths[beg:end].sum())
            assert row["epochs"] == pytest.approx(read * figs["sequence_length"] / row["tokens_available"])
            assert sum(row["lengths"]["histogram"]) == row["documents"]
        assert np.sum(s["mix"]["counts"]) == s["run"]["samples"]


def _sequence_bounds(info: dict, prefix: str) -> np.ndarray:
    """Cumulative token offsets of a golden dataset's sequences, from its .idx."""
    from mmfs.formats import open_dataset

    ds = open_dataset(str(PUBLIC.parent / prefix))
    return np.concatenate(([0], np.cumsum(np.asarray(ds.sequence_lengths, dtype=np.int64))))


@pytest.mark.parametrize("kind,sharding", [("single", True), ("cyclic", True), ("cyclic", False)])
def test_stream_order_is_the_samplers(kind, sharding):
    for total, mbs, dp in ((101, 2, 3), (64, 4, 2), (37, 1, 5)):
        plan = plan_ranks(total, mbs, dp, kind, sharding)
        order = stream_order(plan)
        assert len(order) == plan.files_per_rank * mbs * dp
        for j in range(plan.files_per_rank):
            for r in range(dp):
                start = (j * dp + r) * mbs
                assert order[start:start + mbs].tolist() == microbatch_ids(plan, r, j).tolist()


def test_mix_windows_and_ranks(tmp_path):
    path = write_case_config("p2_blend2_u16", tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["training"] = {"data_parallel_size": 2, "micro_batch_size": 2, "dataloader_type": "cyclic",
                       "step_batch_size_schedule": "0:4 4000:8"}
    path.write_text(yaml.safe_dump(cfg))
    figs = report(str(path), browser=False)
    train = figs["splits"]["train"]
    run = train["run"]
    assert run["axis"] == "iteration"
    assert [b["label"] for b in train["mix"]["bands"]] == ["global batch 4", "global batch 8"]
    schedule = load_config(str(path)).training.schedule
    assert [b["first_iteration"] for b in train["mix"]["bands"]] == list(schedule.first_iterations)
    assert schedule.first_iterations[1] > 1
    dataset_index = _golden("p2_blend2_u16", "train", "blend.dataset_index")
    plan = plan_ranks(train["samples"], 2, 2, "cyclic", True)
    order = stream_order(plan)[:run["samples"]]
    w = train["mix"]["windows"][3]
    assert train["mix"]["counts"][3] == np.bincount(dataset_index[order[w["first_sample"]:w["end_sample"]]],
                                                    minlength=2).tolist()
    ranks = train["ranks"]
    for r in range(2):
        mine = np.concatenate([microbatch_ids(plan, r, j) for j in range(run["samples"] // 4)])
        assert ranks["counts"][r] == np.bincount(dataset_index[mine], minlength=2).tolist()


def _write(prefix, lengths, seed):
    rng = np.random.RandomState(seed)
    with IndexedDatasetWriter(str(prefix) + ".bin", dtype=np.uint16) as w:
        for n in lengths:
            w.add_item(rng.randint(1, 1000, size=n))
            w.end_document()
        w.finalize(str(prefix) + ".idx")


def _blend(tmp_path, entries, samples=400):
    config = tmp_path / "blend.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": entries, "split": "100,0,0", "samples": {"train": samples, "valid": 0, "test": 0},
        "sequence_length": 32, "tokenizer": {"eod": 0}, "cache_dir": "cache"}))
    return str(config)


def test_warnings_name_duplicates_and_epochs(tmp_path):
    _write(tmp_path / "big", [50] * 2000, 1)
    _write(tmp_path / "other", [40] * 2000, 2)
    _write(tmp_path / "small", [30] * 40, 3)  # 1,200 tokens
    for suffix in (".bin", ".idx"):
        shutil.copy(tmp_path / f"other{suffix}", tmp_path / f"other_copy{suffix}")
    clean = report(_blend(tmp_path, [{"path": "big", "weight": 0.7}, {"path": "other", "weight": 0.3}]),
                   browser=False)
    assert clean["warnings"] == []
    entries = [{"path": "big", "weight": 0.6}, {"path": "other", "weight": 0.1},
               {"path": "other_copy", "weight": 0.1}, {"path": "small", "weight": 0.2}]
    figs = report(_blend(tmp_path, entries, samples=560), browser=False)
    kinds = sorted((w["kind"], w.get("dataset") or tuple(w["datasets"])) for w in figs["warnings"])
    assert kinds == [("epochs", "small"), ("same_bytes", ("other", "other_copy"))]
    epochs = next(w for w in figs["warnings"] if w["kind"] == "epochs")
    assert epochs["epochs"] == pytest.approx(112 * 32 / 1200)  # 112 samples of 32 tokens: 2.99 epochs
    assert "2.99 epochs" in epochs["message"]


def test_report_json_command(tmp_path, capsys):
    path = write_case_config("p1_single_u16", tmp_path)
    assert main(["report", str(path), "--json"]) == 0
    figs = json.loads(capsys.readouterr().out)
    assert figs["splits"]["train"]["datasets"][0]["share"] == 1.0
    assert "browser" not in figs
    assert main(["report", str(tmp_path / "missing.yaml"), "--json"]) == 2


def test_warnings_of_a_symlink_a_tiny_weight_and_a_starved_split(tmp_path):
    _write(tmp_path / "big", [50] * 2000, 1)
    _write(tmp_path / "mid", [50] * 2000, 2)
    for suffix in (".bin", ".idx"):
        os.symlink(tmp_path / f"big{suffix}", tmp_path / f"link{suffix}")
    figs = report(_blend(tmp_path, [{"path": "big", "weight": 0.5}, {"path": "link", "weight": 0.5}]), browser=False)
    assert [(w["kind"], w["datasets"]) for w in figs["warnings"]] == [("same_path", ["big", "link"])]
    figs = report(_blend(tmp_path, [{"path": "big", "weight": 0.999}, {"path": "mid", "weight": 0.001}]),
                  browser=False)  # 0.401 of 401 samples (Megatron: ceil(400 x 0.001) = 1 more)
    [w] = figs["warnings"]
    assert (w["kind"], w["dataset"], w["expected"], w["samples"]) == ("no_samples", "mid", pytest.approx(0.401), 1)
    config = tmp_path / "starved.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": "big", "weight": 0.6}, {"path": "mid", "weight": 0.4}], "split": "996,4,0",
        "samples": {"train": 100, "valid": 4, "test": 0}, "sequence_length": 32, "tokenizer": {"eod": 0},
        "cache_dir": "cache"}))
    figs = report(str(config), browser=False)
    assert sorted((w["kind"], w["split"], w["dataset"], w["documents"]) for w in figs["warnings"]) == [
        ("almost_nothing", "valid", "big", 8), ("almost_nothing", "valid", "mid", 8)]


def test_rank_spread_by_chunks_is_the_full_spread(monkeypatch):
    import mmfs.tools.report.command as r

    rng = np.random.RandomState(0)
    plan = plan_ranks(600, 2, 5, "single")
    which = rng.randint(0, 3, size=600).astype(np.int16)
    drawn = np.bincount(which, minlength=3)
    full = r._ranks(plan, which, 3, drawn)
    monkeypatch.setattr(r, "MAX_RANK_CELLS", 6)  # two ranks at a time
    chunked = r._ranks(plan, which, 3, drawn)
    assert "counts" not in chunked and "note" in chunked
    for key in ("share_min", "share_max", "max_deviation"):
        assert chunked[key] == pytest.approx(full[key]), key


def test_a_split_of_more_samples_than_asked_says_so_with_the_numbers(tmp_path):
    """Megatron's blend gives each dataset ceil(asked x weight) samples: valid 16 of
    0.7/0.3 is 12 + 5 = 17 samples. The split's figures and the page say so; a split
    that gets what it asked (train 1200) says nothing."""
    path = write_case_config("p2_blend2_u16", tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["samples"]["valid"] = 16
    path.write_text(yaml.safe_dump(cfg))
    figs = report(str(path), browser=False)
    valid = figs["splits"]["valid"]
    assert valid["samples"] == 17
    assert {k: valid["rounding"][k] for k in ("asked", "samples", "per_dataset")} == \
        {"asked": 16, "samples": 17, "per_dataset": [12, 5]}
    assert valid["rounding"]["note"] == ("valid: 17 samples, 1 more than the 16 asked (samples.valid): Megatron's "
                                         "blend gives each dataset ceil(16 x its weight) samples (u16_docs 12, "
                                         "u16_small 5)")
    assert "rounding" not in figs["splits"]["train"]
    page = tmp_path / "page.html"
    assert main(["-q", "report", str(path), "-o", str(page)]) == 0
    assert html.escape(valid["rounding"]["note"]) in page.read_text()
