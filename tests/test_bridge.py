"""Megatron-Bridge 0.6.x (issue 42 item 5): `mmfs config --from-bridge` of a Bridge
run_config.yaml, mounted for real, serves what Bridge's own loaders read, and
mmfs.adapters.bridge's datasets hold Bridge's samples.

The reference is tests/reference/bridge.json, recorded from megatron-bridge 0.6.2's
data/loaders.py, samplers.py and utils.py over megatron-core 0.19.2's datasets by
tests/reference/record_bridge.py, with the run_config.yaml Bridge's ConfigContainer
wrote (bridge_run_config.yaml) and a train_state.pt saved as Bridge saves it. Each run is
that run_config.yaml with the run's KEY=VALUE overrides and world size, as a launch
would give them: train single and cyclic (sharded and not), validation (the cyclic
sampler on the eval batch sizes), test, another data-parallel size, train_samples, and
resumes from train_state counts (the streams the config's comments name).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import matrix_cases as mc
from matrix_mounts import write_data
from matrix_reference import describe, digest, file_digests
from mmfs import cli
from mmfs.adapters.bridge import mount_datasets_provider
from mmfs.errors import MmfsError
from mmfs.loader import Mount
from mmfs.tools.megatron.bridge import read_train_state
from mount_fixtures import mounted

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
REFERENCE = json.loads((REFERENCE_DIR / "bridge.json").read_text())
RUN_CONFIG = REFERENCE_DIR / "bridge_run_config.yaml"
TRAIN_STATE = REFERENCE_DIR / "bridge_train_state.pt"
RUNS = REFERENCE["runs"]
SPLITS = ("train", "valid", "test")


def config_text(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["config", "--from-bridge", *argv])
    return code, out.getvalue(), err.getvalue()


def run_args(name: str) -> list[str]:
    run = RUNS[name]
    args = [str(RUN_CONFIG), *run["overrides"], "--world-size", str(run["world_size"])]
    counts = run["train_state"]
    if counts:
        args += ["--consumed-train-samples", str(counts["consumed_train_samples"]),
                 "--consumed-valid-samples", str(counts["consumed_valid_samples"])]
    return args


@pytest.fixture(scope="module")
def launch_dir(tmp_path_factory) -> Path:
    """The folder Bridge was launched from: data/ (mmfs's writer) and the configs."""
    folder = tmp_path_factory.mktemp("bridge")
    write_data(folder / "data")
    return folder


FRESH = sorted(name for name, run in RUNS.items() if not run["train_state"])
RESUMED = sorted(name for name, run in RUNS.items() if run["train_state"])


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, launch_dir):
    name = request.param
    code, text, err = config_text(*run_args(name))
    assert code == 0, err
    config = launch_dir / f"{name}.yaml"
    config.write_text(text)
    with mounted(config, launch_dir / f"mnt-{name}") as m:
        yield SimpleNamespace(name=name, ref=RUNS[name], text=text, path=m.path, mount=Mount(m.path),
                              training=yaml.safe_load(text)["training"])


def digests_of(run, path) -> list[str]:
    return file_digests(Path(path).read_bytes(), run.mount.dtype, run.mount.tokens_per_sample)


def test_data_is_what_bridge_read(launch_dir):
    import hashlib
    for name, want in REFERENCE["data"].items():
        for ext in ("bin", "idx"):
            assert hashlib.sha256((launch_dir / "data" / f"{name}.{ext}").read_bytes()).hexdigest() == want[ext]


def test_samples(run):
    """samples/ of every split: Bridge's datasets (its counts, its seed) sample for sample."""
    for split in SPLITS:
        want = run.ref["samples"][split]
        got = [digests_of(run, run.mount.sample_path(split, i))[0] for i in range(run.mount.samples.get(split, 0))]
        assert not describe(f"{run.name} {split}/samples", got, want)


def rank_files(run, split: str, rank: int) -> list[list[str]]:
    return [digests_of(run, run.mount.microbatch_path(split, rank, j))
            for j in range(run.mount.microbatches_per_rank(split))]


@pytest.mark.parametrize("run", FRESH, indirect=True)
def test_ranks(run):
    """train/ranks, valid/ranks, test/ranks: each rank's micro-batches, file j the j-th its
    Bridge DataLoader gives in one pass (valid: the cyclic sampler on the eval batch sizes)."""
    t, dp = run.training, run.ref["data_parallel_size"]
    for split in SPLITS:
        mbs, gbs = (t["micro_batch_size"], t["global_batch_size"]) if split == "train" else \
            (t["eval_micro_batch_size"], t["eval_global_batch_size"])
        kind = t["valid_dataloader_type"] if split == "valid" else t["dataloader_type"]
        total = len(run.ref["samples"][split])
        files = total // gbs * (gbs // (mbs * dp)) if kind == "batch" else total // (mbs * dp)
        for rank in range(run.ref["data_parallel_size"]):
            want = run.ref["ranks"][str(rank)][split][:files]
            assert run.mount.microbatches_per_rank(split) == files
            assert not describe(f"{run.name} {split}/ranks/{rank:03d}", rank_files(run, split, rank), want)


@pytest.mark.parametrize("run", RESUMED, indirect=True)
def test_resumed_streams(run):
    """A resume from train_state's counts: the streams the config's comments name hold
    what Bridge's loaders read from there (train, and valid from consumed_valid_samples);
    test reads from 0 (test/ranks)."""
    named = dict(re.findall(r"(train|valid)/streams/([^/]+)/RRR", run.text))
    assert set(named) == {"train", "valid"}
    width = run.mount.training["rank_name_width"]
    for split in ("train", "valid"):
        for rank in range(run.ref["data_parallel_size"]):
            folder = run.path / split / "streams" / named[split] / f"{rank:0{width}d}"
            got = [digests_of(run, f) for f in sorted(folder.iterdir())]
            want = run.ref["ranks"][str(rank)][split]
            assert not describe(f"{run.name} {split}/streams/{named[split]}/{rank}", got, want)
    for rank in range(run.ref["data_parallel_size"]):
        assert not describe(f"{run.name} test/ranks/{rank}", rank_files(run, "test", rank),
                            run.ref["ranks"][str(rank)]["test"])


def test_provider(run):
    """mmfs.adapters.bridge: Bridge's provider signature, map-style datasets whose item i is
    Bridge's sample i (its tokens and last label), for the counts Bridge asks."""
    dataset_config = SimpleNamespace(seq_length=mc.SEQUENCE_LENGTH, random_seed=31, create_attention_mask=True)
    datasets = mount_datasets_provider(run.path)(run.ref["num_samples"], dataset_config)
    for split, ds in zip(SPLITS, datasets):
        want = run.ref["samples"][split]
        assert len(ds) == len(want)
        got = [digest(np.append(ds[i]["tokens"], ds[i]["labels"][-1])) for i in range(len(ds))]
        assert not describe(f"{run.name} provider {split}", got, want)
        assert ds[0]["attention_mask"].shape == (1, mc.SEQUENCE_LENGTH, mc.SEQUENCE_LENGTH)
    with pytest.raises(MmfsError, match="random_seed 1234 differs"):
        mount_datasets_provider(run.path)(run.ref["num_samples"], SimpleNamespace(random_seed=1234))
    with pytest.raises(MmfsError, match="asks 100000 train samples"):
        mount_datasets_provider(run.path)([100000, 0, 0], dataset_config)


def test_train_state_file():
    """bridge_train_state.pt (saved as Bridge saves it) gives the resumed run's counts
    where torch imports; without torch, one line naming the options to give instead."""
    counts = RUNS["resume-cyclic"]["train_state"]
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(MmfsError, match="needs torch; give --consumed-train-samples"):
            read_train_state(str(TRAIN_STATE))
        return
    assert read_train_state(str(TRAIN_STATE)) == (counts["consumed_train_samples"], counts["consumed_valid_samples"])
    code, text, _ = config_text(str(RUN_CONFIG), "--world-size", "2", "--train-state", str(TRAIN_STATE))
    assert code == 0 and f"from={counts['consumed_train_samples']}/RRR" in text


def test_config_keys():
    """What the config says of Bridge's rules: dataset.random_seed (not rng.seed), the eval
    batch sizes, validation's cyclic sampler, and the sample counts Bridge computed."""
    code, text, _ = config_text(*run_args("samples"))
    assert code == 0
    config = yaml.safe_load(text)
    assert config["seed"] == 31
    t = config["training"]
    assert (t["valid_dataloader_type"], t["eval_micro_batch_size"], t["eval_global_batch_size"]) == ("cyclic", 1, 8)
    assert t["train_samples"] == 200 and "train_iters" not in t


BAD = [
    (["dataset.dataloader_type=batch", "dataset.drop_last=false"], "dataset.drop_last: false: the batch sampler"),
    (["dataset.dataloader_type=external"], "dataset.dataloader_type: 'external'"),
    (["dataset.mock=true"], "dataset.mock: True"),
    (["dataset.dataloader_type=single", "dataset.drop_last=false"], "dataset.drop_last: false"),
    (["dataset._target_=megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig"], "dataset._target_"),
    (["validation.skip_train=true"], "validation.skip_train"),
    (["validation.eval_interval=null"], "validation.eval_interval: missing or 0"),
    (["validation.eval_global_batch_size=5"], "validation.eval_global_batch_size: 5 is not a multiple of "
                                              "validation.eval_micro_batch_size x the data-parallel size"),
    (["train.global_batch_size=6", "--world-size", "4"], "train.global_batch_size: 6 is not a multiple of "
                                                         "train.micro_batch_size x the data-parallel size"),
    (["+dist.eval_context_parallel_size=2"], "dist.eval_context_parallel_size"),
    (["train.no_such_key=1"], "train.no_such_key is not in the config"),
    (["nosection.key=1"], "nosection is not a section"),
    (["train.train_iters"], "an override is KEY=VALUE"),
    (["model.tensor_model_parallel_size=2", "--world-size", "3"], "--world-size: 3 is not a multiple"),
    (["tokenizer.tokenizer_type=Nope"], "tokenizer.tokenizer_type: Nope"),
    (["dataset.random_seed=-1"], "dataset.random_seed: -1"),
    (["dataset.split=abc"], "dataset.split: 'abc' is not a split"),
    (["dataset.seq_length=4294967296"], "dataset.seq_length: 4294967296"),
    (["dataset.blend=[[data/web],[-1]]"], "dataset.blend[1][0]: the weight -1 of data/web"),
    (["dataset.blend=5"], "dataset.blend: expected [[paths...]"),
    (["dataset.blend=null"], "dataset.blend: missing"),
    (["dataset.mid_level_dataset_surplus=.nan"], "dataset.mid_level_dataset_surplus: nan"),
    (["dataset.add_extra_token_to_sequence=3"], "dataset.add_extra_token_to_sequence: expected true or false"),
    (["train.micro_batch_size=0"], "train.micro_batch_size: must be at least 1"),
]


@pytest.mark.parametrize("extra,words", BAD, ids=[b[1] for b in BAD])
def test_refused(extra, words):
    """What mmfs does not serve, or Bridge refuses: one line naming the key, exit 2."""
    args = [str(RUN_CONFIG), *extra]
    if "--world-size" not in extra:
        args += ["--world-size", "2"]
    code, text, err = config_text(*args)
    assert code == 2 and text == ""
    assert words in err and err.count("\n") == 1, err


def test_noted_keys_and_warnings():
    """rampup_batch_size and step_batch_size_schedule: no effect in Bridge 0.6.x (a comment);
    no world size: data-parallel size 1 with a warning."""
    code, text, err = config_text(str(RUN_CONFIG), "train.rampup_batch_size=[4,4,48]")
    assert code == 0 and "# ignored train.rampup_batch_size: has no effect" in text
    assert "data-parallel size 1" in err and "data_parallel_size: 1" in text


def test_checkpoint_folder(tmp_path):
    """A checkpoint's folder: run_config.yaml read where it lies (paths as Bridge got them),
    its train_state.pt beside it read where torch imports (else a comment says why not)."""
    folder = tmp_path / "iter_0000042"
    folder.mkdir()
    shutil.copy(RUN_CONFIG, folder / "run_config.yaml")
    code, text, _ = config_text(str(folder / "run_config.yaml"), "--data-parallel-size", "2")
    assert code == 0 and "path: data/web" in text and "streams" not in text
    shutil.copy(TRAIN_STATE, folder / "train_state.pt")
    code, text, _ = config_text(str(folder / "run_config.yaml"), "--data-parallel-size", "2")
    try:
        import torch  # noqa: F401
        assert code == 0 and "train/streams/dp=2,mbs=2,from=168/RRR" in text
    except ImportError:
        assert code == 0 and "# not read: " in text and "needs torch" in text


def test_which(run):
    """`mmfs which` of train, valid and test: each rank's micro-batches of an iteration (an
    evaluation step for valid and test, on the eval sizes and valid's cyclic sampler), as
    Bridge's loaders read them; a resumed run: --consumed at its train_state counts."""
    from mmfs.megatron.corpus import open_corpus
    from mmfs.tools.which import which_in
    corpus = open_corpus(str(run.path.parent / f"{run.name}.yaml"), progress=False)
    t, dp, counts = run.training, run.ref["data_parallel_size"], run.ref["train_state"]
    for split in SPLITS:
        mbs, gbs = (t["micro_batch_size"], t["global_batch_size"]) if split == "train" else \
            (t["eval_micro_batch_size"], t["eval_global_batch_size"])
        per = gbs // (mbs * dp)
        start = {"train": counts.get("consumed_train_samples", 0),
                 "valid": counts.get("consumed_valid_samples", 0)}.get(split, 0)
        steps = min(len(run.ref["ranks"]["0"][split]) // per, 3)
        for step in range(steps):
            at = start + step * gbs
            answer = which_in(corpus, None, split, consumed=at) if start else which_in(corpus, step + 1, split)
            for r in range(dp):
                got = [[run.ref["samples"][split][s["sample"]] for s in mb["samples"]]
                       for mb in answer["ranks"][r]["microbatches"]]
                want = run.ref["ranks"][str(r)][split][step * per:(step + 1) * per]
                assert not describe(f"{run.name} which {split} step {step} rank {r}", got, want)


def write_config(folder: Path, training: dict, **extra) -> Path:
    config = {"datasets": [{"path": str(folder / "data" / "web")}], "split": "80,15,5",
              "sequence_length": mc.SEQUENCE_LENGTH, "tokenizer": {"eod": mc.EOD, "pad": None},
              "training": {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8,
                           "train_iters": 10, "eval_interval": 5, "eval_iters": 2, **training}, **extra}
    path = folder / "keys.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


GOOD_KEYS = [
    ({"eval_micro_batch_size": 1, "eval_global_batch_size": 6}, {"valid": 36, "test": 12}, ("single", 1)),
    ({"valid_dataloader_type": "cyclic", "data_sharding": False}, {"valid": 48, "test": 16}, ("cyclic", 2)),
    ({}, {"valid": 48, "test": 16}, ("single", 2)),
]


@pytest.mark.parametrize("keys,counts,valid_layout", GOOD_KEYS)
def test_eval_keys(launch_dir, keys, counts, valid_layout):
    """The training: block's evaluation keys: the valid and test counts Bridge's rule gives,
    each split's sampler and micro-batch size (data_sharding also for a cyclic valid)."""
    from mmfs.config.schema import load_config
    config = load_config(str(write_config(launch_dir, keys)))
    assert {s: config.samples[s] for s in ("valid", "test")} == counts
    assert config.training.layout("valid") == valid_layout
    assert config.training.layout("test")[1] == valid_layout[1] and config.training.layout("train") == ("single", 2)


BAD_KEYS = [
    ({"eval_global_batch_size": 3}, {}, "training.eval_global_batch_size: 3 is not a multiple"),
    ({"valid_dataloader_type": "batch"}, {}, "training.valid_dataloader_type: 'batch' is not a dataloader type"),
    ({"eval_micro_batch_size": 0}, {}, "training.eval_micro_batch_size"),
    ({"eval_micro_batch_size": 1, "step_batch_size_schedule": "0:8"}, {},
     "training.eval_micro_batch_size: Megatron-Bridge's evaluation keys with step_batch_size_schedule"),
    ({"valid_dataloader_type": "cyclic"}, {"phase_mode": "continue", "phases": [{"start_iteration": 4}]},
     "phases: Megatron-Bridge's evaluation keys"),
]


@pytest.mark.parametrize("keys,extra,words", BAD_KEYS, ids=[b[2][:40] for b in BAD_KEYS])
def test_eval_keys_refused(launch_dir, keys, extra, words):
    from mmfs.config.schema import load_config
    if "phases" in extra:
        extra["phases"] = [{"datasets": [{"path": str(launch_dir / "data" / "web")}]},
                           {"start_iteration": 4, "datasets": [{"path": str(launch_dir / "data" / "code")}]}]
    with pytest.raises(MmfsError, match=re.escape(words)):
        path = write_config(launch_dir, keys, **extra)
        if "step_batch_size_schedule" in keys:  # Megatron-LM refuses it with a global batch size
            text = yaml.safe_load(path.read_text())
            del text["training"]["global_batch_size"]
            path.write_text(yaml.safe_dump(text))
        load_config(str(path))


FORMS = [
    ["dataset.blend=null", "dataset.data_path=0.6 data/web 0.4 data/code"],
    ["dataset.blend=null", "dataset.data_path=[0.6, data/web, 0.4, data/code]"],
]


@pytest.mark.parametrize("form", FORMS, ids=["data_path string", "data_path list"])
def test_data_path_forms(launch_dir, form):
    """Bridge's data_path (a string of words or a list, as --data-path) is the blend
    megatron-core's get_blend_from_list makes of it: the same config as `blend`."""
    from mmfs.config.schema import load_config

    def loaded(*extra: str) -> dict:
        code, text, err = config_text(str(RUN_CONFIG), *extra, "--world-size", "2")
        assert code == 0, err
        path = launch_dir / "form.yaml"
        path.write_text(text)
        out = load_config(str(path)).as_dict()
        return {k: out[k] for k in ("datasets", "split", "seed", "samples", "training")}

    assert loaded(*form) == loaded()


def test_blend_per_split(launch_dir):
    """blend_per_split: [train, valid, test] (each a blend or null), without split."""
    code, text, err = config_text(str(RUN_CONFIG), "dataset.blend=null",
                                  "dataset.blend_per_split=[[[data/web], null], [[data/code], null], null]",
                                  "--world-size", "2")
    assert code == 0, err
    config = yaml.safe_load(text)
    assert config["blend_per_split"] == {"train": [{"path": "data/web"}], "valid": [{"path": "data/code"}],
                                         "test": None}
    assert "split" not in config


@pytest.mark.parametrize("run", ["cyclic"], indirect=True)
def test_provider_in_process(run):
    """The provider given the config file instead of a mount: its files served in this
    process (mmfs.loader.Mount of a config), the same samples."""
    config = str(run.path.parent / f"{run.name}.yaml")
    datasets = mount_datasets_provider(config)(run.ref["num_samples"], SimpleNamespace(random_seed=31))
    for split, ds in zip(SPLITS, datasets):
        got = [digest(np.append(ds[i]["tokens"], ds[i]["labels"][-1])) for i in range(len(ds))]
        assert not describe(f"in-process provider {split}", got, run.ref["samples"][split])
