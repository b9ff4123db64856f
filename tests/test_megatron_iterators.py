"""The provider against Megatron-LM's own data path (issue 32 item 5): what
build_train_valid_test_data_iterators, given pretrain_gpt.py's provider, handed
each data-parallel rank in the first iterations (recorded from megatron-core
0.19.2 and Megatron-LM core_v0.19.0 by reference/record_megatron_iterators.py, which
also ran mmfs's provider inside the same function and found every micro-batch
equal), here without torch or Megatron: the mount of `mmfs config --from-megatron`
of the same launch line, read by mount_datasets_provider with the arguments
Megatron's parse_args and validate_args gave the job. Single and cyclic (into the
next epoch; unsharded with ranks whose passes end apart), resumed, resumed on
another data-parallel size, and a phase relaunch (phase_mode restart) under the
single and the cyclic sampler, sharded and not, on the config's data-parallel size
and on another with --eval-micro-batch-size 1 (the phase's own valid and test through
its streams/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mmfs.adapters.megatron import mount_datasets_provider
from mount_fixtures import ROOT, mounted

REFERENCE = Path(__file__).resolve().parent / "reference"
sys.path.insert(0, str(REFERENCE))
from record_megatron_iterators import digest  # noqa: E402  (the recorder's own digest: one definition)

RECORDED = json.loads((REFERENCE / "megatron_iterators.json").read_text())
SPLITS = ("train", "valid", "test")


def test_the_recorder_found_mmfs_equal_to_megatron_in_megatron_s_own_function():
    assert RECORDED["megatron_core_version"] == "0.19.2"
    relaunches = {name: (case["launch"][-1], case["world_size"], case["data_parallel_size"])
                  for name, case in RECORDED["cases"].items() if len(case["launch"]) > 1}
    # a relaunch under each sampler, and one on another data-parallel size than the mount's
    assert {("--dataloader-type cyclic" in line, "--no-data-sharding" in line) for line, _, _ in relaunches.values()} \
        == {(False, False), (True, False), (True, True)}
    assert any(world != size for _, world, size in relaunches.values())
    assert {name: case["mmfs_equal"] for name, case in RECORDED["cases"].items()} == \
        {name: True for name in RECORDED["cases"]}


@pytest.mark.parametrize("name", sorted(RECORDED["cases"]))
def test_the_provider_gives_each_rank_what_megatron_s_loader_gave_it(tmp_path, name):
    case = RECORDED["cases"][name]
    (tmp_path / "data").symlink_to(Path(__file__).resolve().parent / "golden" / "data", target_is_directory=True)
    argv = []
    for k, line in enumerate(case["launch"]):
        (tmp_path / f"launch{k}.args").write_text(f"{line} --data-cache-path cache\n")
        argv += (["--next-phase"] if k else []) + [f"@launch{k}.args"]
    env = dict(os.environ, WORLD_SIZE=str(case["world_size"]), PYTHONPATH=str(ROOT))
    made = subprocess.run([sys.executable, "-m", "mmfs.cli", "config", "--from-megatron", *argv], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert made.returncode == 0, made.stderr
    (tmp_path / "run.yaml").write_text(made.stdout)
    args = SimpleNamespace(**case["provider_args"])
    size = case["data_parallel_size"]
    with mounted(tmp_path / "run.yaml", tmp_path / "mnt") as m:
        for rank in range(size):
            provider = mount_datasets_provider(m.path, get_args=lambda: args, data_parallel=lambda r=rank: (r, size),
                                               to_tensor=np.asarray)
            iterators = dict(zip(SPLITS, provider(case["num_samples"])))
            for split, ranks in case["megatron"].items():
                want = ranks[str(rank)]
                got = [digest(next(iterators[split])) for _ in want]
                assert got == want, f"{split}, rank {rank}: the first micro-batch that differs is " \
                                    f"{next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)}"
