"""Issue 41: no wrong batch from a partial copy or a mismatched mount. A plain folder
copy missing a file, cut short, altered, short of what the job reads, or without its
attributes or manifest; a stream folder with a gap; a mount of another seed, data
path, split or tokenizer; --skip-train; None, NaN, inf or missing arguments: each one
line, exit 2, never a traceback or a silent wrong batch."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from test_megatron_provider import megatron_args, provide

from golden_cases import write_case_config
from mmfs.adapters.megatron_copy import copy_job_files
from mmfs.loader import LoaderError, Mount
from mmfs.loader.copy_check import COPY_MANIFEST
from mount_fixtures import mount_in

DP, MBS = 2, 2


@pytest.fixture(scope="module")
def mount(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        base = tmp_path_factory.mktemp("guard")
        config = write_case_config("p2_blend2_u16", base / "config")
        raw = yaml.safe_load(config.read_text())
        raw["training"] = {"data_parallel_size": DP, "micro_batch_size": MBS, "global_batch_size": 8}
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        yield Mount(mount_in(stack, config, base / "mnt"))


def job(mount: Mount, **changes):
    """The arguments of a job that fits the mount (its own data, seed and split)."""
    cfg = mount.info["config"]
    words = [w for d in cfg["datasets"] for w in (str(d["weight"]), d["path"])]
    given = dict(seq_length=mount.sequence_length, micro_batch_size=MBS, global_batch_size=8, seed=cfg["seed"],
                 data_path=words, split=cfg["split"])
    return megatron_args(**{**given, **changes})


def refused(capsys, path, args, samples=(40, 0, 0), rank=0) -> str:
    with pytest.raises(SystemExit) as exit_:
        provide(path, args, rank, DP, samples)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mmfs: error: ") and "Traceback" not in err, err
    return err


def make_copy(mount: Mount, dest: Path, count: int = 10) -> Path:
    copy_job_files(mount.path, dest, DP, {"train": (MBS, 0, count)})
    return dest


def stream_folder(copy: Path, rank: int = 0) -> Path:
    return copy / "train" / "streams" / f"dp={DP},mbs={MBS},from=0" / f"{rank:03d}"


def test_a_complete_copy_gives_the_mount_s_batches(mount, tmp_path):
    copy = make_copy(mount, tmp_path / "copy")
    table = json.loads((copy / COPY_MANIFEST).read_text())
    assert table["digest"] == "sha256" and "mmfs.json" in table["files"] and "mmfs-attributes.json" in table["files"]
    entry = table["streams"][str(stream_folder(copy).relative_to(copy))]
    assert entry["files"] == 10 and entry["first_sample"] is not None and entry["last_sample"] is not None
    args = job(mount)
    for a, b in zip(provide(mount.path, args, 1, DP, (40, 0, 0))[0], provide(copy, args, 1, DP, (40, 0, 0))[0]):
        assert all((a[k] == b[k]).all() for k in a)


def test_a_copy_missing_a_micro_batch_file_names_it(mount, tmp_path, capsys):
    copy = make_copy(mount, tmp_path / "copy")
    (stream_folder(copy) / "0000004.bin").unlink()
    err = refused(capsys, copy, job(mount))
    assert "0000004.bin: missing" in err and "gap" in err
    (stream_folder(copy) / "0000009.bin").unlink()  # also the last, so the names have no gap after 4
    for name in ("0000005.bin", "0000006.bin", "0000007.bin", "0000008.bin"):
        (stream_folder(copy) / name).unlink()
    assert "0000004.bin: missing (4 of the 10 files the copy holds there)" in refused(capsys, copy, job(mount))


def test_a_cut_or_altered_file_is_one_line(mount, tmp_path, capsys):
    copy = make_copy(mount, tmp_path / "copy")
    path = stream_folder(copy, 1) / "0000003.bin"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    err = refused(capsys, copy, job(mount), rank=1)
    assert f"{path}: {len(data) - 100} bytes, the copy recorded {len(data)}" in err
    path.write_bytes(bytes(reversed(data)))  # same size, other bytes: found when it is read
    train = provide(copy, job(mount), 1, DP, (40, 0, 0))[0]
    assert len(list(itertools.islice(train, 3))) == 3
    with pytest.raises(SystemExit):
        next(train)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: its bytes differ from the copy's" in err, err


def test_a_short_copy_is_refused_up_front(mount, tmp_path, capsys):
    copy = make_copy(mount, tmp_path / "copy", count=4)
    err = refused(capsys, copy, job(mount), samples=(40, 0, 0))
    assert "the copy holds 4 of the 10 micro-batches this rank reads of train" in err
    assert provide(copy, job(mount), 0, DP, (16, 0, 0))[0] is not None  # a job that reads 4 fits


def test_an_incomplete_copy_or_a_folder_that_is_no_copy(mount, tmp_path, capsys):
    copy = make_copy(mount, tmp_path / "copy")
    (copy / COPY_MANIFEST).unlink()  # a copy cut short before its manifest
    assert "mmfs-copy.json: not found: the copy is incomplete" in refused(capsys, copy, job(mount))
    other = tmp_path / "other"
    other.mkdir()
    shutil.copyfile(Path(mount.path) / "mmfs.json", other / "mmfs.json")  # no attributes, no manifest
    err = refused(capsys, other, job(mount))
    assert "not an mmfs mount" in err and "not a complete copy" in err and "mount it again" not in err


def test_a_stream_folder_with_a_gap_is_refused_by_mount(mount, tmp_path):
    copy = make_copy(mount, tmp_path / "copy")
    (stream_folder(copy) / "0000002.bin").unlink()
    with pytest.raises(LoaderError, match=r"0000002.bin: missing \(the folder holds 0000003.bin after it\)"):
        Mount(copy).stream_files("train", 0, DP, MBS, 0)


def test_copying_again_after_a_cut_copy_leaves_nothing_unrecorded(mount, tmp_path):
    copy = make_copy(mount, tmp_path / "copy")
    (copy / COPY_MANIFEST).unlink()
    (stream_folder(copy) / "0000009.bin").write_bytes(b"cut")
    copy_job_files(mount.path, copy, DP, {"train": (MBS, 0, 5)})
    assert sorted(os.listdir(stream_folder(copy))) == [f"{j:07d}.bin" for j in range(5)]
    assert len(Mount(copy).stream_files("train", 0, DP, MBS, 0)) == 5


# -- the data the job names against the mount's ---------------------------------------------


def test_a_job_that_fits_the_mount_is_served(mount):
    assert provide(mount.path, job(mount), 0, DP, (40, 0, 0))[0] is not None


@pytest.mark.parametrize("change, words", [
    (lambda m: {"seed": m.info["config"]["seed"] + 1}, "the mount's seed is {seed}, the job's --seed {seed1}"),
    (lambda m: {"data_path": [m.info["config"]["datasets"][0]["path"]]}, "the mount's datasets are ["),
    (lambda m: {"data_path": ["1", m.info["config"]["datasets"][1]["path"],
                              "1", m.info["config"]["datasets"][0]["path"]]}, "the job's --data-path ["),
    (lambda m: {"data_path": [w for d in m.info["config"]["datasets"] for w in ("1", d["path"])]},
     "(weight 1)"),
    (lambda m: {"split": "50,25,25"}, "the job's --split '50,25,25'"),
    (lambda m: {"data_path": None, "train_data_path": [m.info["config"]["datasets"][0]["path"]]},
     "the job's per split"),
    (lambda m: {"tokenizer_type": "GPT2BPETokenizer", "vocab_file": "/nowhere/vocab.json"}, None),
])
def test_a_mount_of_other_data_is_one_line_naming_both(mount, capsys, change, words):
    changes = change(mount)
    if words is None:  # the golden case gives eod by hand: no tokenizer to compare (docs/megatron.md)
        assert provide(mount.path, job(mount, **changes), 0, DP, (40, 0, 0))[0] is not None
        return
    seed = mount.info["config"]["seed"]
    err = refused(capsys, mount.path, job(mount, **changes))
    assert words.format(seed=seed, seed1=seed + 1) in err, err


def test_another_tokenizer_than_the_mount_s_is_refused(tmp_path, capsys):
    from test_megatron_provider import DATA

    vocab = Path(__file__).resolve().parent / "golden"
    assert vocab.is_dir()
    config = {"datasets": [{"path": str(DATA / "u16_docs")}], "split": "90,8,2",
              "sequence_length": 32, "tokenizer": {"eod": 0, "type": "NullTokenizer", "vocab_size": 100},
              "cache_dir": str(tmp_path / "cache"),
              "training": {"data_parallel_size": 1, "micro_batch_size": 1, "global_batch_size": 1}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with contextlib.ExitStack() as stack:
        m = Mount(mount_in(stack, path, tmp_path / "mnt"))
        args = megatron_args(seq_length=32, micro_batch_size=1, global_batch_size=1, tokenizer_type="GPT2BPETokenizer")
        with pytest.raises(SystemExit):
            provide(m.path, args, 0, 1, (10, 0, 0))
        err = capsys.readouterr().err
        assert "the mount's tokenizer is NullTokenizer, the job's --tokenizer-type GPT2BPETokenizer" in err, err


def test_skip_train_is_refused(mount, capsys):
    assert "--skip-train makes Megatron read the validation split from sample 0" in \
        refused(capsys, mount.path, job(mount, skip_train=True), samples=(0, 16, 0))


@pytest.mark.parametrize("name", ["seq_length", "micro_batch_size", "global_batch_size", "consumed_train_samples",
                                  "consumed_valid_samples", "eval_micro_batch_size", "iteration"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, "8", "missing", None])
def test_a_bad_number_in_the_job_s_arguments_is_one_line(mount, capsys, name, value):
    args = job(mount)
    if value == "missing":
        delattr(args, name)
    else:
        setattr(args, name, value)
    optional = name not in ("seq_length", "micro_batch_size", "global_batch_size")
    if value in ("missing", None) and optional:
        assert provide(mount.path, args, 0, DP, (40, 0, 0))[0] is not None  # Megatron's default
        return
    err = refused(capsys, mount.path, args)
    assert "the job's " in err and name.split("_")[0] in err.replace("-", "_"), err


@pytest.mark.parametrize("samples", [(float("nan"), 0, 0), (40, None, "x"), (40,)])
def test_bad_sample_counts_are_one_line(mount, capsys, samples):
    refused(capsys, mount.path, job(mount), samples=samples)


@pytest.mark.parametrize("name, value", [("rampup_batch_size", float("nan")), ("rampup_batch_size", ["8", "x", "1"]),
                                         ("rampup_batch_size", [8, 8]), ("phase_transition_iterations", "3,x"),
                                         ("phase_transition_iterations", 7), ("step_batch_size_schedule", 5)])
def test_a_bad_list_or_schedule_argument_is_one_line(mount, capsys, name, value):
    args = job(mount)
    setattr(args, name, value)
    assert f"the job's --{name.replace('_', '-')}" in refused(capsys, mount.path, args)


# the recorded launch line of tests/reference/megatron_iterators.json's cases, its data relative
LAUNCH = ("--tokenizer-type NullTokenizer --vocab-size 50256 --seed 1234 --seq-length 128 --micro-batch-size 2 "
          "--global-batch-size 16 --eval-interval 10 --eval-iters 2 --train-iters 20 "
          "--data-path 0.7 data/u16_docs 0.3 data/u16_small --split 90,8,2 --world-size 4")


def test_the_mount_of_a_launch_line_fits_that_line_s_arguments_and_no_other(tmp_path, capsys):
    """The config `mmfs config --from-megatron` writes of a launch line, mounted; the
    provider given the arguments Megatron's parse_args makes of that line (data_path a
    list of words as written, split a string, seed and vocab_size ints) serves; each
    data argument changed is refused naming both values."""
    from test_megatron_provider import DATA

    from mmfs.cli import main

    (tmp_path / "data").symlink_to(DATA, target_is_directory=True)
    (tmp_path / "launch.args").write_text(LAUNCH + " --data-cache-path cache\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["config", "--from-megatron", "@launch.args"]) == 0
    finally:
        os.chdir(cwd)
    (tmp_path / "run.yaml").write_text(capsys.readouterr().out)
    args = dict(seq_length=128, micro_batch_size=2, global_batch_size=16, seed=1234, split="90,8,2",
                data_path=["0.7", "data/u16_docs", "0.3", "data/u16_small"], tokenizer_type="NullTokenizer",
                vocab_size=50256)
    with contextlib.ExitStack() as stack:
        m = Mount(mount_in(stack, tmp_path / "run.yaml", tmp_path / "mnt"))
        assert provide(m.path, megatron_args(**args), 1, 4, (320, 0, 0))[0] is not None
        for change, words in (({"seed": 77}, "the mount's seed is 1234, the job's --seed 77"),
                              ({"split": "80,10,10"}, "the mount's split is '90,8,2', the job's --split '80,10,10'"),
                              ({"data_path": ["0.3", "data/u16_docs", "0.7", "data/u16_small"]},
                               "the mount's datasets are [data/u16_docs (weight 0.7), data/u16_small (weight 0.3)]"),
                              ({"vocab_size": 32000}, "vocab_size 50256, the job's --vocab-size 32000")):
            with pytest.raises(SystemExit):
                provide(m.path, megatron_args(**{**args, **change}), 1, 4, (320, 0, 0))
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and words in err, err


def test_no_data_sharding_against_a_sharded_cyclic_mount_is_refused(tmp_path, capsys):
    config = write_case_config("p2_blend2_u16", tmp_path / "config")
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": DP, "micro_batch_size": MBS, "global_batch_size": 8,
                       "dataloader_type": "cyclic"}
    config.write_text(yaml.safe_dump(raw))
    with contextlib.ExitStack() as stack:
        m = Mount(mount_in(stack, config, tmp_path / "mnt"))
        assert provide(m.path, job(m, data_sharding=True), 0, DP, (40, 0, 0))[0] is not None
        err = refused(capsys, m.path, job(m, data_sharding=False))
        assert "the mount's sampler is cyclic with data_sharding, the job's --no-data-sharding" in err
