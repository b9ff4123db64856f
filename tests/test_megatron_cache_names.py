"""The index cache is shared with Megatron (issue 42 item 6): for a launch line of
each tokenizer type pretrain_gpt.py takes, `mmfs config --from-megatron` and `mmfs
build` write the very files Megatron-LM's own build writes (their names hash the
tokenizer's unique identifiers), recorded by tests/reference/record_megatron_cache_names.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from golden_cases import GOLDEN
from mmfs import cli

HERE = Path(__file__).resolve().parent
RECORDED = json.loads((HERE / "reference" / "megatron_cache_names.json").read_text())
PREPROCESS = HERE / "golden" / "preprocess"


def _folder(tmp_path: Path, monkeypatch) -> Path:
    for link, target in (("data", GOLDEN / "data"), ("tok", PREPROCESS / "tokenizers"),
                         ("hf", PREPROCESS / "hf_tokenizer")):
        (tmp_path / link).symlink_to(target, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "1")
    return tmp_path


def _config(case: dict, capsys) -> dict:
    assert cli.main(["config", "--from-megatron", *shlex.split(case["launch"])]) == 0
    out = capsys.readouterr().out
    Path("run.yaml").write_text(out)
    return yaml.safe_load(out)


def test_the_provenance_is_recorded():
    p = RECORDED["provenance"]
    assert p["megatron-core"] == "0.19.2" and "core_v0.19.0" in p["megatron_lm_pretrain_gpt"]
    assert "parse_args" in p["args"]


@pytest.mark.parametrize("name", sorted(RECORDED["cases"]))
def test_the_identifiers_are_megatron_s(name, tmp_path, monkeypatch, capsys):
    case = RECORDED["cases"][name]
    _folder(tmp_path, monkeypatch)
    block = _config(case, capsys)["tokenizer"]
    assert block["unique_identifiers"] == case["unique_identifiers"]
    assert (block["eod"], block["pad"]) == (case["eod"], None if case["pad"] in (None, -1) else case["pad"])


@pytest.mark.parametrize("name", sorted(RECORDED["cases"]))
def test_mmfs_build_writes_megatron_s_file_names(name, tmp_path, monkeypatch, capsys):
    case = RECORDED["cases"][name]
    folder = _folder(tmp_path, monkeypatch)
    _config(case, capsys)
    assert cli.main(["build", "run.yaml"]) == 0
    written = sorted(p.name for p in (folder / "cache").rglob("*") if p.is_file() and p.suffix in (".npy", ".txt"))
    assert written == case["files"]
