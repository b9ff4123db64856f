"""benchmarks/megatron_e2e.py without a GPU (issue 32 item 4): the launch lines
(the two runs of a variant differ only in where the data comes from), `prepare`
(the configs of `mmfs config --from-megatron`, and a plain folder copy that holds
every micro-batch each mmfs run reads, byte for byte the mount's), the `_train`
wiring (the mount's provider handed to pretrain(), the losses recorded), and the
comparison of two loss curves."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from mmfs.adapters.megatron import mount_datasets_provider, rank_stream_files
from mmfs.loader import Mount
from mount_fixtures import ROOT, mounted

SCRIPT = ROOT / "benchmarks" / "megatron_e2e.py"


def _e2e():
    spec = importlib.util.spec_from_file_location("megatron_e2e", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DATA_FLAGS = {"--data-path", "--split", "--data-cache-path", "--dataloader-type", "--phase-transition-iterations",
              "--save", "--load", "--save-interval"}


def _flags(words: list[str]) -> dict[str, list[str]]:
    out, key = {}, None
    for w in words:
        if w.startswith("--"):
            key = w
            out[key] = []
        else:
            out[key].append(w)
    return out


VARIANTS = ["single", "cyclic", "phases", "phases-cyclic"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_two_runs_of_a_variant_differ_only_in_where_the_data_comes_from(variant):
    e2e = _e2e()
    megatron, mmfs = [_flags(w) for w in e2e.megatron_runs(variant)], [_flags(w) for w in e2e.mmfs_runs(variant)]
    assert len(megatron) == len(mmfs)
    for run, through in zip(megatron, mmfs):
        assert {k: v for k, v in run.items() if k not in DATA_FLAGS} == \
            {k: v for k, v in through.items() if k not in DATA_FLAGS}
        assert run["--data-cache-path"] == ["cache-megatron"]  # Megatron builds its own indices
        for flag in ("--deterministic-mode", "--transformer-impl", "--no-gradient-accumulation-fusion"):
            assert flag in run
        assert run["--hidden-dropout"] == run["--attention-dropout"] == ["0"]
        assert through["--dataloader-type"] == ["external"]
        assert run.get("--phase-transition-iterations") == through.get("--phase-transition-iterations")
        assert (through["--num-layers"], through["--hidden-size"], through["--seq-length"]) == \
            (["2"], ["128"], ["256"])
    sampler = "cyclic" if variant.endswith("cyclic") else "single"
    assert all(r.get("--dataloader-type", ["single"]) == [sampler] for r in megatron)
    if variant.startswith("phases"):  # both: save, exit at 25, relaunch (Megatron's with phase 1's data)
        assert len(megatron) == 2 and megatron[0]["--data-path"] != megatron[1]["--data-path"]
        assert all(r["--phase-transition-iterations"] == ["25"] and "--load" in r for r in megatron + mmfs)
        assert [r["--load"] for r in mmfs] == [r["--save"] for r in mmfs] == [["ckpt-mmfs"]] * 2
    else:
        assert len(megatron) == 1 and "--load" not in megatron[0] and "--load" not in mmfs[0]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    done = subprocess.run([sys.executable, str(SCRIPT), "prepare", "--out", str(out)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    assert done.returncode == 0, done.stderr
    return out


def _job_args(words: list[str], launch: int) -> SimpleNamespace:
    """The arguments the provider reads, as Megatron's would be for this line's launch
    (a relaunch at iteration 25: the checkpoint's consumed counts, one evaluation of 2
    steps of 32 done)."""
    f = _flags(words)
    transitions = [int(x) for x in f.get("--phase-transition-iterations", [])]
    iteration = transitions[launch - 1] if launch else 0
    gbs = int(f["--global-batch-size"][0])
    return SimpleNamespace(dataloader_type=f["--dataloader-type"][0], seq_length=int(f["--seq-length"][0]),
                           micro_batch_size=int(f["--micro-batch-size"][0]), global_batch_size=gbs,
                           consumed_train_samples=iteration * gbs, consumed_valid_samples=iteration // 25 * 2 * gbs,
                           iteration=iteration, phase_transition_iterations=transitions or None)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_copy_holds_every_micro_batch_the_mmfs_run_reads_as_the_mount_serves_it(prepared, variant):
    """A 50-iteration run on one GPU reads 50 x 8 train micro-batches, 3 evaluations of
    2 x 8 valid ones and 2 x 8 test ones (the split sizes Megatron asks for: 1600, 192,
    64); relaunched at iteration 25 (a run in phases), each launch its 25 iterations,
    and the valid and test of its phase's own (launch 0 one evaluation, launch 1 two
    and test, each from its loader's consumed count). The provider reads all of them
    from the copy, equal to the live mount's, each launch's valid and test its phase's."""
    e2e = _e2e()
    manifest = json.loads((prepared / "e2e.json").read_text())
    assert manifest[variant]["mmfs"] == e2e.mmfs_runs(variant)
    folder = prepared / variant
    config = (folder / "run.yaml").read_text()
    phased = variant.startswith("phases")
    assert "cache_dir: cache-mmfs" in config and ("phases:" in config) == phased
    reads = [{"train": 200, "valid": 16, "test": 0}, {"train": 200, "valid": 32, "test": 16}] if phased else \
        [{"train": 400, "valid": 48, "test": 16}]
    with mounted(folder / "run.yaml", folder / "mnt") as m:
        loader = Mount(m.path)
        assert [{s: r[2] for s, r in launch.items()} for launch in e2e.launch_reads(str(m.path))] == \
            reads
        for k, (words, counts) in enumerate(zip(manifest[variant]["mmfs"], reads, strict=True)):
            args = _job_args(words, k)
            samples = [800, 192, 64] if phased else [1600, 192, 64]
            on_copy = mount_datasets_provider(folder / "mount-copy", get_args=lambda args=args: args,
                                              data_parallel=lambda: (0, 1), to_tensor=np.asarray)(samples)
            on_mount = mount_datasets_provider(m.path, get_args=lambda args=args: args, data_parallel=lambda: (0, 1),
                                               to_tensor=np.asarray)(samples)
            for split, a, b in zip(("train", "valid", "test"), on_copy, on_mount):
                got, want = list(itertools.islice(a, counts[split])), list(itertools.islice(b, counts[split]))
                assert len(got) == len(want) == counts[split]
                for x, y in zip(got, want):
                    assert list(x) == list(y) and all(np.array_equal(x[k], y[k]) for k in x)
                if split != "train" and counts[split] and phased:  # the launch's phase's own, from its count
                    start = args.consumed_valid_samples if split == "valid" else 0
                    files = list(itertools.islice(rank_stream_files(loader, split, 0, 1, 4, start, k), counts[split]))
                    ids = [[int(i) for i in loader.attribute(f, "user.mmfs.samples").split()] for f in files]
                    flat = [i for batch in ids for i in batch]
                    assert flat == list(range(start, start + len(flat))) if variant == "phases" else \
                        len(set(flat)) == len(flat)
                    for x, batch in zip(got, ids):
                        assert np.array_equal(x["tokens"], loader.megatron_batch(split, batch, phase=k)["tokens"])
                assert not counts[split] or got[0]["tokens"].shape == (4, 256)


def test_the_train_wrapper_hands_pretrain_the_mount_s_provider_and_records_the_losses(prepared, tmp_path):
    """`_train` with stand-ins for megatron.training, torch and pretrain_gpt.py (which
    call pretrain(), training_log and evaluate as Megatron-LM's do)."""
    stub = tmp_path / "stub"
    (stub / "megatron" / "training").mkdir(parents=True)
    (stub / "megatron" / "core").mkdir()
    (stub / "megatron" / "__init__.py").write_text("")
    (stub / "torch.py").write_text("def from_numpy(array):\n    return array\n")  # the tensors stay numpy
    (stub / "megatron" / "core" / "__init__.py").write_text(
        "from types import SimpleNamespace\nmpu = SimpleNamespace(get_data_parallel_rank=lambda: 0, "
        "get_data_parallel_world_size=lambda: 1)\n")
    (stub / "megatron" / "training" / "__init__.py").write_text(textwrap.dedent("""\
        from types import SimpleNamespace
        ARGS = SimpleNamespace(dataloader_type="external", seq_length=256, micro_batch_size=4, global_batch_size=32,
                               consumed_train_samples=0, consumed_valid_samples=0, iteration=0, curr_iteration=25)
        def get_args():
            return ARGS
        def pretrain(config, provider, *args, **kw):
            from megatron.training import training
            train, valid, test = provider([1600, 192, 64])
            training.training_log({"lm loss": [3.0, 2.0]}, {}, 1e-3, 1, 1.0)
            training.evaluate()
            print("first tokens", next(train)["tokens"][0][:4].tolist(), config, kw)
        """))
    (stub / "megatron" / "training" / "training.py").write_text(
        "def training_log(*a, **k):\n    return 'logged'\n\ndef evaluate(*a, **k):\n"
        "    return {'lm loss': 5.0}, None, False\n")
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("from megatron.training import pretrain\n\ndef provider(n):\n    raise AssertionError\n\n"
                      "if __name__ == '__main__':\n    import sys\n    pretrain(sys.argv[1], provider, store=None)\n")
    losses = tmp_path / "losses.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub), str(ROOT)]),
               MMFS_MOUNT=str(prepared / "single" / "mount-copy"))
    done = subprocess.run([sys.executable, str(SCRIPT), "_train", str(losses), str(script), "the-config"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    with mounted(prepared / "single" / "run.yaml", tmp_path / "mnt") as m:
        want = np.frombuffer((m.path / "train/ranks/000/0000000.bin").read_bytes(), dtype=np.uint16)[:4].tolist()
    assert f"first tokens {want} the-config {{'store': None}}" in done.stdout
    rows = [json.loads(line) for line in losses.read_text().splitlines()]
    assert rows == [{"kind": "train", "iteration": 1, "lm loss": [3.0, 2.0]},
                    {"kind": "eval", "iteration": 25, "lm loss": [5.0]}]
    assert _e2e().read_losses(losses) == {("train", 1, 0): 1.5, ("eval", 25, 0): 5.0}


def test_the_comparison_prints_both_curves_and_the_largest_difference(tmp_path, capsys):
    e2e = _e2e()

    def write(name: str, rows: list[tuple[str, int, list[float]]]) -> dict:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"kind": k, "iteration": i, "lm loss": v}) + "\n" for k, i, v in rows))
        return e2e.read_losses(path)

    megatron = write("a.jsonl", [("train", 1, [10.0, 4.0]), ("train", 2, [8.0, 4.0]), ("eval", 2, [1.75]),
                                 ("eval", 2, [1.5])])
    assert e2e.compare("v", megatron, dict(megatron), ("train", "eval")) == 0
    assert "v: largest difference 0 over 4 losses" in capsys.readouterr().out
    other = write("b.jsonl", [("train", 1, [10.0, 4.0]), ("train", 2, [8.0, 3.2]), ("eval", 2, [1.75]),
                              ("eval", 2, [1.5])])
    assert e2e.compare("v", megatron, other, ("train", "eval")) == pytest.approx(0.5)
    out = capsys.readouterr().out
    assert "v: train         2                    2.0                    2.5" in out
    assert e2e.compare("v", megatron, write("c.jsonl", [("train", 1, [10.0, 4.0])]), ("train",)) == math.inf
    assert e2e.compare("v", {}, {}, ("train",)) == math.inf
    assert all(shlex.split(" ".join(w)) for w in e2e.mmfs_runs("phases"))  # lines a shell takes as they are
