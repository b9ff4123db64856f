"""The C and Rust readers of examples/ read a rank's micro-batches (from mmfs.json
alone) exactly as mmfs.loader does, from the start and on resume; the PyTorch
example steps a global batch at a time, as Megatron's iterations do."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from golden_cases import write_case_config
from mmfs.loader import Mount
from mount_fixtures import mount_in

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Iterator[Path]:
    # int32 tokens (ids above 65535) and a cyclic unsharded sampler
    base = tmp_path_factory.mktemp("examples")
    config = write_case_config("p3_multi_epoch_i32", base / "config")
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": 2, "micro_batch_size": 3, "dataloader_type": "cyclic",
                       "data_sharding": False}
    config.write_text(yaml.safe_dump(raw))
    with contextlib.ExitStack() as stack:
        yield mount_in(stack, config, base / "mnt")


def _expected(mount: Mount, split: str, rank: int, consumed: int) -> list[str]:
    start = consumed // (mount.training["micro_batch_size"] * mount.training["data_parallel_size"])
    out = []
    for j, batch in enumerate(mount.microbatches(split, rank, consumed), start):
        flat = batch.astype("int64").ravel()
        out.append(f"{j} {int(flat.sum())} {int(flat[0])} {int(flat[-1])}")
    return out


def _check(binary: list[str], layout: Path) -> None:
    mount = Mount(layout)
    assert mount.dtype.name == "int32"
    for rank, consumed in [(0, 0), (1, 0), (1, 6 * 40), (0, 6 * 106)]:
        proc = subprocess.run([*binary, str(layout), "train", str(rank), str(consumed)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == _expected(mount, "train", rank, consumed)
    bad = subprocess.run([*binary, str(layout), "train", "0", "5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "multiple" in bad.stderr


def test_c_reader(layout, tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc)")
    binary = tmp_path / "mmfs_rank_reader"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-o", str(binary), str(EXAMPLES / "c" / "mmfs_rank_reader.c")],
                   check=True, capture_output=True)
    _check([str(binary)], layout)


def test_rust_reader(layout, tmp_path):
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("no Rust toolchain (cargo)")
    env = dict(os.environ, CARGO_TARGET_DIR=str(tmp_path / "target"))
    build = subprocess.run([cargo, "build", "--release", "--offline", "--quiet"], cwd=EXAMPLES / "rust", env=env,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    _check([str(tmp_path / "target" / "release" / "mmfs-rank-reader")], layout)


def test_the_examples_read_only_mmfs_json_fields_the_training_section_has(layout):
    t = json.loads((layout / "mmfs.json").read_text())["training"]
    for key in ("micro_batch_size", "data_parallel_size", "rank_name_width", "microbatches",
                "microbatch_name_width", "ranks_path", "bytes_per_microbatch"):
        assert key in t
        assert key in (EXAMPLES / "c" / "mmfs_rank_reader.c").read_text()
        assert key in (EXAMPLES / "rust" / "src" / "main.rs").read_text()


def _torch_train():
    """examples/torch_train.py as a module (torch is imported only when it runs)."""
    spec = importlib.util.spec_from_file_location("torch_train", EXAMPLES / "torch_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stream(consumed: int, micro_batch_size: int, data_parallel_size: int, count: int) -> list[dict]:
    """What RankStream gives: each micro-batch with the consumed_samples after it."""
    step = micro_batch_size * data_parallel_size
    return [{"consumed_samples": consumed + (k + 1) * step} for k in range(count)]


def test_the_torch_example_steps_a_global_batch_as_megatron_does():
    example = _torch_train()
    # dp 4, mbs 2, global batch 16: an iteration is 2 micro-batches of each rank, and
    # every checkpoint (after an iteration) holds a multiple of 16, as Megatron's does.
    per = example.microbatches_per_iteration(16, 2, 4)
    assert per == 2
    groups = list(example.iterations(_stream(0, 2, 4, 9), per))
    assert [g[-1]["consumed_samples"] for g in groups] == [16, 32, 48, 64]  # the 9th micro-batch: no iteration
    # Resumed at 48 on dp 2: the global batch stays, so an iteration is 4 micro-batches.
    per = example.microbatches_per_iteration(16, 2, 2)
    assert [g[-1]["consumed_samples"] for g in example.iterations(_stream(48, 2, 2, 8), per)] == [64, 80]
    with pytest.raises(ValueError, match=r"global batch size \(16\) is not divisible by micro batch size \(2\) "
                                         r"times data parallel size \(3\)"):
        example.microbatches_per_iteration(16, 2, 3)
    with pytest.raises(ValueError):
        example.microbatches_per_iteration(4, 2, 4)  # less than one micro-batch of every rank


def test_the_torch_examples_resume_suggestion_fits_the_demo():
    """The docstring's resume on another --data-parallel-size is one the demo's global
    batch can take (its `python examples/torch_train.py MOUNT ...` lines)."""
    example = _torch_train()
    training = yaml.safe_load((EXAMPLES.parent / "configs" / "demo.yaml").read_text())["training"]
    sizes = [int(line.split("--data-parallel-size ")[1].split()[0]) for line in example.__doc__.splitlines()
             if "--data-parallel-size " in line and line.strip().startswith("python")]
    assert sizes
    for dp in sizes:
        assert example.microbatches_per_iteration(training["global_batch_size"], training["micro_batch_size"], dp)
