"""Hostile configs: each is refused with one line naming the file and the key (or
the line), exit 2, never a traceback; and a property test over config values."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from golden_cases import GOLDEN
from mmfs.cli import main
from mmfs.config.schema import load_config
from mmfs.errors import ConfigError
from mmfs.megatron import open_corpus
from mmfs.mount.tree import Tree

BASE = """\
datasets: [{path: data/u16_docs}]
split: "90,8,2"
samples: {train: 100, valid: 10, test: 5}
sequence_length: 64
tokenizer: {eod: 50256, pad: null}
cache_dir: cache
"""


def write(folder, text: str, name: str = "config.yaml") -> str:
    link = os.path.join(folder, "data")
    if not os.path.lexists(link):
        os.symlink(GOLDEN / "data", link, target_is_directory=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["-q", *argv])
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str, path: str, fragment: str) -> str:
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"mmfs: error: {path}: "), lines[0]
    assert fragment in lines[0], lines[0]
    return lines[0]


def alias_bomb() -> str:
    levels = ["    l0: &l0 [" + ", ".join(["lol"] * 10) + "]"]
    levels += [f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return BASE.replace("tokenizer: {eod: 50256, pad: null}",
                        "tokenizer:\n  eod: 1\n  class:\n" + "\n".join(levels))


# (config text, what the one line must contain)
REFUSED = {
    "no tokenizer": (BASE.replace("tokenizer: {eod: 50256, pad: null}\n", ""), "tokenizer: missing"),
    "no eod": (BASE.replace("eod: 50256, ", ""), "tokenizer.eod: missing"),
    "sequence_length 2**31": (BASE.replace("sequence_length: 64", "sequence_length: 2147483648"),
                              "sequence_length: must be at most 2147483646"),
    "sequence_length 2**31-1 with the extra token": (
        BASE.replace("sequence_length: 64", "sequence_length: 2147483647"), "sequence_length"),
    "surplus NaN": (BASE + "mid_level_dataset_surplus: .nan\n", "mid_level_dataset_surplus"),
    "surplus inf": (BASE + "mid_level_dataset_surplus: .inf\n", "mid_level_dataset_surplus"),
    "surplus 1e400": (BASE + "mid_level_dataset_surplus: 1e400\n", "mid_level_dataset_surplus"),
    "pad 2**63": (BASE.replace("pad: null", "pad: 9223372036854775808"), "tokenizer.pad"),
    "eod 2**64": (BASE.replace("eod: 50256", "eod: 18446744073709551616"), "tokenizer.eod"),
    "date in tokenizer.class": (BASE.replace("pad: null", "pad: null, class: 2024-01-01"),
                                "tokenizer.class: a YAML date"),
    "bad date in tokenizer_path": (BASE.replace("pad: null", "pad: null, tokenizer_path: 2024-13-45"),
                                   "tokenizer.tokenizer_path"),
    "set in tokenizer identifiers": (
        BASE.replace("pad: null", "pad: null, unique_identifiers: {a: !!set {x: null}}"),
        "tokenizer.unique_identifiers.a: a YAML set"),
    "binary in tokenizer.class": (BASE.replace("pad: null", "pad: null, class: !!binary aGk="),
                                  "tokenizer.class: binary data"),
    "5000-deep nesting": (BASE + "cache_dir: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper"),
    "5001-digit integer": (BASE + "seed: " + "7" * 5001 + "\n", "seed: an integer of 5001"),
    "alias bomb under tokenizer.class": (alias_bomb(), "aliases expand to"),
    "alias cycle": (BASE.replace("pad: null", "pad: null, unique_identifiers: &c {a: *c}"), "cycle"),
    "explicit tag that does not convert": (BASE.replace("eod: 50256", "eod: !!int twelve"), "line 5"),
    "integer key": (BASE + "7: x\n", "7: unknown key"),
    "line breaks in a dataset path": (BASE.replace("data/u16_docs", '"data/u\\x1e1\\n6"'),
                                      "datasets[0].path: no dataset at"),
    "bool is not an int": (BASE.replace("sequence_length: 64", "sequence_length: true"),
                           "sequence_length"),
    "seed 2**32": (BASE + "seed: 4294967296\n", "seed: must be at most 4294967295"),
    "samples 2**63": (BASE.replace("train: 100", "train: 9223372036854775808"), "samples.train"),
    "weight overflows a float": (
        BASE.replace("[{path: data/u16_docs}]", "[{path: data/u16_docs, weight: " + "9" * 400 + "}]"),
        "datasets[0].weight: expected a finite number"),
    "split part overflows a float": (BASE.replace('"90,8,2"', '"' + "9" * 400 + ',1,1"'), "split"),
    "NUL in cache_dir": (BASE.replace("cache_dir: cache", 'cache_dir: "ca\\0che"'), "cache_dir"),
    "weights with only the train count": (
        BASE.replace("[{path: data/u16_docs}]", "[{path: data/u16_docs, weight: 1}]")
            .replace("{train: 100, valid: 10, test: 5}", "{train: 100}"),
        "samples.valid: missing"),
    "weights with a zero-share split and no count": (
        BASE.replace("[{path: data/u16_docs}]", "[{path: data/u16_docs, weight: 1}]")
            .replace('"90,8,2"', '"100,0,0"').replace("{train: 100, valid: 10, test: 5}", "{train: 100}"),
        "samples.valid: missing"),
    "weighted blend_per_split without its count": (
        BASE.replace("datasets: [{path: data/u16_docs}]",
                     "blend_per_split: {train: [{path: data/u16_docs, weight: 1}], "
                     "valid: [{path: data/u16_small, weight: 1}]}")
            .replace('split: "90,8,2"\n', "").replace("{train: 100, valid: 10, test: 5}", "{train: 100}"),
        "samples.valid: missing"),
    "eod that uint16 tokens cannot hold": (BASE.replace("eod: 50256", "eod: 70000"),
                                           "tokenizer.eod: 70000 cannot occur in the datasets' uint16 tokens"),
    "pad that uint16 tokens cannot hold": (BASE.replace("pad: null", "pad: 70000"),
                                           "tokenizer.pad: 70000 does not fit the datasets' uint16 tokens"),
    "dataset path ending in .bin": (BASE.replace("data/u16_docs}", "data/u16_docs.bin}"),
                                    "datasets[0].path: data/u16_docs.bin ends in .bin: Megatron appends"),
    "dataset path ending in .idx": (BASE.replace("data/u16_docs}", "data/u16_docs.idx}"),
                                    "give the prefix data/u16_docs"),
    "data_path entry ending in .idx": (BASE.replace("datasets: [{path: data/u16_docs}]",
                                                    'data_path: "data/u16_small data/u16_docs.idx"'),
                                       "data_path[1].path: data/u16_docs.idx ends in .idx"),
    "data_path weight after a path": (
        BASE.replace("datasets: [{path: data/u16_docs}]",
                     'data_path: "data/u16_docs data/u16_small 0.5 data/i32_docs"'), "data_path"),
    # a path past PATH_MAX was echoed whole: one "line" of megabytes (a data_args_path file of one long word)
    "dataset path of 1,000,000 bytes": (BASE.replace("data/u16_docs}", "data/" + "x" * 1_000_000 + "}"),
                                        "datasets[0].path: 'data/xxx"),
    "cache_dir of 5,000 bytes": (BASE.replace("cache_dir: cache", "cache_dir: " + "c" * 5000),
                                 "cache_dir: 'ccc"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line(tmp_path, case):
    text, fragment = REFUSED[case]
    path = write(str(tmp_path), text)
    code, out, err = run_cli("build", path)
    assert_one_line_error(code, err, path, fragment)
    assert out == "" and len(err) < 1000


@pytest.mark.parametrize("datasets", ["[{path: data/i32_docs}]", "[{path: data/u16_docs}, {path: data/i32_docs}]"])
def test_token_ids_past_uint16_are_taken_when_a_dataset_holds_int32(tmp_path, datasets):
    text = BASE.replace("[{path: data/u16_docs}]", datasets).replace("eod: 50256, pad: null", "eod: 70000, pad: 70001")
    code, _out, err = run_cli("build", write(str(tmp_path), text))
    assert code == 0, err


def test_config_file_that_is_not_a_regular_file(tmp_path):
    fifo = str(tmp_path / "fifo.yaml")
    os.mkfifo(fifo)  # opening it would block: it must be refused before that
    code, _, err = run_cli("build", fifo)
    assert_one_line_error(code, err, fifo, "FIFO")
    code, _, err = run_cli("build", str(tmp_path))
    assert_one_line_error(code, err, str(tmp_path), "directory")


def test_oversized_config(tmp_path):
    path = write(str(tmp_path), BASE + "# " + "x" * (3 << 20) + "\n")
    code, _, err = run_cli("build", path)
    assert_one_line_error(code, err, path, "larger than 2 MiB")


def test_without_eod_mount_refuses_before_the_daemon(tmp_path):
    """Once `build` worked and `mount` crashed in the tree; now both refuse at load."""
    path = write(str(tmp_path), REFUSED["no tokenizer"][0])
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code, _, err = run_cli("mount", path, str(mnt))
    assert_one_line_error(code, err, path, "tokenizer")
    assert not os.path.ismount(mnt)


def test_with_eod_the_tree_describes_it(tmp_path):
    path = write(str(tmp_path), BASE.replace("pad: null", "pad: 50256"))  # pad == eod: none
    assert run_cli("build", path)[0] == 0
    info = json.loads(Tree(open_corpus(path, progress=False)).lookup("/mmfs.json").data)
    assert info["eod_id"] == 50256 and info["pad_id"] == -1


@pytest.mark.parametrize("data_path,odd", [("data/u16_docs data/u16_small", False),
                                           ("data/u16_docs data/u16_small data/i32_docs", True)])
def test_data_path_of_paths_only(tmp_path, data_path, odd):
    """Megatron's get_blend_from_list: paths without weights are a blend with weights None,
    the same as `datasets:` without weights."""
    folder = str(tmp_path)
    text = BASE.replace("datasets: [{path: data/u16_docs}]", f'data_path: "{data_path}"')
    words = data_path.split()
    listed = BASE.replace("[{path: data/u16_docs}]", json.dumps([{"path": w} for w in words]))
    a = load_config(write(folder, text, "a.yaml"))
    b = load_config(write(folder, listed, "b.yaml"))
    assert a.blend.weights is None and [d.path for d in a.blend.datasets] == words
    assert a.blend == b.blend
    corpus_a = open_corpus(a.path, progress=False)
    corpus_b = open_corpus(b.path, progress=False)
    for split, reader in corpus_b.splits.items():
        other = corpus_a.splits[split]
        assert len(other) == len(reader) > 0
        assert [other.read(i) for i in range(0, len(reader), 7)] == \
               [reader.read(i) for i in range(0, len(reader), 7)]


def test_data_path_with_weights_still_pairs(tmp_path):
    text = BASE.replace("datasets: [{path: data/u16_docs}]",
                        'data_path: "0.7 data/u16_docs 0.3 data/u16_small"')
    config = load_config(write(str(tmp_path), text))
    assert config.blend.weights == [0.7, 0.3]


def test_first_word_a_path_makes_every_word_a_path(tmp_path):
    """As Megatron: once a weight position holds no number, every word is a path
    (here "0.5" then names a dataset that does not exist)."""
    text = BASE.replace("datasets: [{path: data/u16_docs}]", 'data_path: "data/u16_docs 0.5"')
    with pytest.raises(ConfigError, match=r"data_path\[1\]\.path: no dataset at .*0\.5"):
        load_config(write(str(tmp_path), text))


# -- the property: any value of any key gives a valid config or one line, exit 2 --

KEYS = ["datasets", "data_path", "blend_per_split", "split", "samples", "samples.train",
        "samples.valid", "sequence_length", "seed", "add_extra_token_to_sequence",
        "drop_last_partial_validation_sequence", "mid_level_dataset_surplus", "tokenizer",
        "tokenizer.eod", "tokenizer.pad", "tokenizer.vocab_size", "tokenizer.class",
        "tokenizer.tokenizer_path", "tokenizer.unique_identifiers", "datasets.0",
        "datasets.0.weight", "datasets.0.name", "datasets.0.path", "unknown_key"]

# Integers a build accepts stay small (fast); the large ones are refused anywhere
# (sample counts of 10**13 and up need terabytes of index).
INTS = st.integers(-10, 5000) | st.sampled_from(
    [2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**13, 10**30, -(2**63), 10**4000])
FLOATS = st.floats(0, 2) | st.sampled_from(
    [float("nan"), float("inf"), -float("inf"), -0.0, 1e308, 5e-324, -1.5, 1e9, 1e10])
SCALARS = st.none() | st.booleans() | INTS | FLOATS | st.text(max_size=12) | st.sampled_from(
    ["969,30,1", "1,0,0", "0,0,0", "data/u16_small", "0.5 data/u16_docs 0.5 data/u16_small",
     "1 2 3 4", "a\0b", "", "..", "/"])
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6) | INTS, inner, max_size=3),
                      max_leaves=6)


def _set(config: dict, key: str, value) -> None:
    """config[a][b]... = value along the dotted key (list positions as digits), when
    the path still exists after earlier changes."""
    *parents, last = key.split(".")
    node = config
    for p in [*parents, None]:
        step = last if p is None else p
        if isinstance(node, list) and step.isdigit() and int(step) < len(node):
            step = int(step)
        elif not isinstance(node, dict):
            return
        if p is None:
            node[step] = value
        else:
            node = node.get(step) if isinstance(node, dict) else node[step]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("property"))


def _check_build(folder: str, text: str) -> None:
    with tempfile.TemporaryDirectory(dir=folder) as sub:
        path = write(sub, text)
        code, _, err = run_cli("build", path)
        if code != 0:
            assert_one_line_error(code, err, path, "")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3))
def test_any_config_values_build_or_fail_in_one_line(folder, changes):
    config = yaml.safe_load(BASE)
    config["datasets"][0]["weight"] = 1.0
    config["samples"]["test"] = 5
    for key, value in changes:
        _set(config, key, value)
    config["cache_dir"] = "cache"  # random paths must not write caches outside the test folder
    _check_build(folder, yaml.safe_dump(config))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=200) | st.builds(
    lambda a, b: BASE + a + b, st.sampled_from(["seed: ", "split: ", "samples: ", "tokenizer: ",
                                                "x: ", "? ", "- ", "&a ", "*a ", "!!"]),
    st.text(max_size=40)))
def test_any_yaml_text_builds_or_fails_in_one_line(folder, text):
    _check_build(folder, text)
