"""The YAML config: every user mistake is one clear error naming the file and the
key, raised before any index is built."""

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from golden_cases import BLEND_CONFIG, GOLDEN
from mmfs.config.schema import load_config
from mmfs.errors import ConfigError
from mmfs.megatron import open_corpus

BASE = BLEND_CONFIG


def write(tmp_path, config, name="config.yaml"):
    link = tmp_path / "data"
    if not link.exists():
        link.symlink_to(GOLDEN / "data", target_is_directory=True)
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return path


def with_(**changes):
    config = {k: v for k, v in BASE.items()}
    for key, value in changes.items():
        if value is DROP:
            config.pop(key, None)
        else:
            config[key] = value
    return config


DROP = object()

ERRORS = [
    ("unknown top-level key", with_(sequence_lenght=64), "sequence_lenght"),
    ("unknown dataset key", with_(datasets=[{"path": "data/u16_docs", "wieght": 1}]), "datasets[0].wieght"),
    ("wrong type", with_(sequence_length="long"), "sequence_length"),
    ("bool is not an int", with_(sequence_length=True), "sequence_length"),
    ("sequence_length < 1", with_(sequence_length=0), "sequence_length"),
    ("missing sequence_length", with_(sequence_length=DROP), "sequence_length"),
    ("negative weight", with_(datasets=[{"path": "data/u16_docs", "weight": -1},
                                        {"path": "data/u16_small", "weight": 2}]), "datasets[0].weight"),
    ("zero weight", with_(datasets=[{"path": "data/u16_docs", "weight": 0},
                                    {"path": "data/u16_small", "weight": 0}]), "datasets[0].weight"),
    ("weight on some only", with_(datasets=[{"path": "data/u16_docs", "weight": 1},
                                            {"path": "data/u16_small"}]), "datasets[1].weight"),
    ("split does not parse", with_(split="ninety,ten"), "split"),
    ("split all zero", with_(split="0,0,0"), "split"),
    ("split of four", with_(split="1,1,1,1"), "split"),
    ("missing dataset", with_(datasets=[{"path": "data/nope"}]), "datasets[0].path"),
    ("duplicate names", with_(datasets=[{"path": "data/u16_docs", "name": "a"},
                                        {"path": "data/u16_small", "name": "a"}]), "datasets"),
    ("one dataset, two names", with_(datasets=DROP, blend_per_split={
        "train": [{"path": "data/u16_docs", "name": "a"}],
        "valid": [{"path": "data/u16_docs", "name": "b"}]}, split=DROP), "blend_per_split"),
    ("no datasets", with_(datasets=DROP), "datasets"),
    ("two sources", with_(data_path="data/u16_docs"), "datasets"),
    ("split with blend_per_split",
     with_(datasets=DROP, blend_per_split={"train": [{"path": "data/u16_docs"}]}), "split"),
    ("negative samples", with_(samples={"train": -5}), "samples.train"),
    ("unknown split in samples", with_(samples={"training": 5}), "samples.training"),
    ("negative surplus", with_(mid_level_dataset_surplus=-0.1), "mid_level_dataset_surplus"),
    ("bad tokenizer key", with_(tokenizer={"eos": 3}), "tokenizer.eos"),
    ("bad seed", with_(seed=-1), "seed"),
    ("bad data_path pairs", with_(datasets=DROP, data_path="0.5 data/u16_docs 0.5"), "data_path"),
    ("bad data_path weight", with_(datasets=DROP, data_path="half data/u16_docs x data/u16_small"), "data_path"),
    ("bad bool", with_(add_extra_token_to_sequence="yes"), "add_extra_token_to_sequence"),
]


@pytest.mark.parametrize("what,config,key", ERRORS, ids=[e[0] for e in ERRORS])
def test_config_errors_name_file_and_key(tmp_path, what, config, key):
    path = write(tmp_path, config)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: {key}"), message
    assert "\n" not in message


@pytest.mark.parametrize("text,where", [
    ("datasets: [\n  - path: x\n", "line"),     # unterminated YAML
    ("just a string", "mapping"),
    ("", "mapping"),
])
def test_bad_yaml(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=where):
        load_config(str(path))


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("what,config,key,fragment", [
    ("split with no sequences", with_(split="999,1,0", datasets=[{"path": "data/u16_small"}]),
     "datasets", "0 of the 500 sequences"),
    ("weights without a size", with_(samples={"train": 100, "valid": None, "test": 5}),
     "samples.valid", "sample count"),
])
def test_impossible_configs(tmp_path, what, config, key, fragment):
    path = write(tmp_path, config)
    with pytest.raises(ConfigError) as err:
        open_corpus(str(path), progress=False)
    assert str(err.value).startswith(f"{path}: {key}"), str(err.value)
    assert fragment in str(err.value)


def test_blend_that_overdraws_a_dataset_is_an_error(tmp_path, monkeypatch):
    """A blend drawing more samples from a dataset than it holds is refused (Megatron would
    index past its end). Megatron's sizes make this rare, so force such an index."""
    import mmfs.megatron.build.builder as builder

    def greedy_for_the_first(weights, size):
        return {"dataset_index": np.zeros(size, dtype=np.int16),
                "dataset_sample_index": np.arange(size, dtype=np.int64)}

    monkeypatch.setattr(builder, "build_blending_indices", greedy_for_the_first)
    path = write(tmp_path, with_(samples={"train": 100, "valid": 4000, "test": 5}))
    with pytest.raises(ConfigError, match=r"valid blend draws 4000 samples from u16_docs but it has only"):
        open_corpus(str(path), progress=False)


def test_relative_paths_resolve_against_the_yaml_folder(tmp_path, monkeypatch):
    path = write(tmp_path, with_(datasets=[{"path": "data/u16_docs"}], split="100,0,0",
                                 samples={"train": 5}))
    monkeypatch.chdir("/")
    corpus = open_corpus(str(path), progress=False)
    assert len(corpus.splits["train"]) > 5
    assert corpus.indices["train"].gpts[0].params.dataset_path == "data/u16_docs"


def test_data_path_string_form_equals_the_list_form(tmp_path):
    a = open_corpus(str(write(tmp_path, BASE, "a.yaml")), progress=False)
    b = open_corpus(str(write(tmp_path, with_(datasets=DROP, data_path="0.7 data/u16_docs 0.3 data/u16_small"),
                              "b.yaml")), progress=False)
    for split in a.splits:
        assert len(a.splits[split]) == len(b.splits[split])
        assert a.splits[split].read(1) == b.splits[split].read(1)


def test_cli_reports_config_errors_in_one_line(tmp_path):
    path = write(tmp_path, with_(split="bad"))
    result = subprocess.run([sys.executable, "-m", "mmfs.cli", "build", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert str(path) in result.stderr and "split" in result.stderr


def test_cli_build_reports_progress_and_timings(tmp_path):
    path = write(tmp_path, BASE)
    result = subprocess.run([sys.executable, "-m", "mmfs.cli", "build", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "building train/u16_docs" in result.stderr
    assert "sample index" in result.stderr and " s)" in result.stderr
    assert "train: 100 samples" in result.stdout


def test_dataset_files_resolve_as_realpath_with_each_folder_resolved_once(tmp_path):
    """parse_blend resolves each folder once (ten thousand datasets in one folder):
    the same files as os.path.realpath, through symbolic links to folders and to
    prefixes, `.` and `..`."""
    from mmfs.config.blend import dataset_file

    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "sub" / "x").write_text("")
    (tmp_path / "real" / "y").symlink_to(tmp_path / "real" / "sub" / "x")
    real_folders: dict[str, str] = {}
    for path in ["link/a", "link/sub/../b", "link/y", "./link//c", "link/sub/..", "link/", "../q", "y",
                 str(tmp_path / "link" / "d")]:
        for base in [str(tmp_path), str(tmp_path / "link")]:
            expected = os.path.realpath(os.path.join(base, path))
            assert dataset_file(path, base, real_folders) == expected == dataset_file(path, base), path
