"""Adapters: the torch IterableDataset of a rank's stream (optional: skipped without
torch) against megatron-core's recorded samplers, under a DataLoader with workers
and across a state_dict round trip; the grain data source by its protocol; both
over a restart phase's own valid (phase=) against Megatron-LM's recorded relaunch."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml
from phase_helpers import recorded_config

from golden_cases import PUBLIC, expected_samples, write_case_config
from mmfs.adapters.grain import SampleSource
from mmfs.loader import Mount
from mount_fixtures import mounted


def _mounted_case(tmp_path: Path, case: str, training: dict):
    config = write_case_config(case, tmp_path / case)
    raw = yaml.safe_load(config.read_text())
    raw["training"] = training
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return mounted(config, tmp_path / "mnt")


def _golden_ranks(case: str, layout: str) -> dict:
    return json.loads((PUBLIC / case / f"ranks-{layout}.json").read_text())["ranks"]


def test_loader_imports_neither_torch_nor_grain():
    code = "import sys, mmfs.loader, mmfs.adapters; print(sorted({'torch', 'grain'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_grain_source_by_its_protocol(tmp_path):
    with _mounted_case(tmp_path, "p2_blend2_u16", {"data_parallel_size": 4, "micro_batch_size": 2}) as m:
        source = SampleSource(m.path, "valid")
        rows = expected_samples("p2_blend2_u16", "valid")
        assert len(source) == len(rows)
        want = [r.astype(np.uint16).tobytes() for r in rows]
        assert [source[i].tobytes() for i in range(len(source))] == want
        copy = pickle.loads(pickle.dumps(source))
        assert len(copy) == len(source) and copy[7].tobytes() == want[7]
        with ThreadPoolExecutor(8) as pool:  # concurrent reads give the same records
            got = list(pool.map(lambda i: source[i].tobytes(), [i % len(source) for i in range(400)]))
        assert got == [want[i % len(source)] for i in range(400)]
        items = SampleSource(m.path, "valid", megatron=True, eod_mask_loss=True)
        mount = Mount(m.path)
        item = items[3]
        for key, value in mount.megatron_item("valid", 3, eod_mask_loss=True).items():
            assert np.array_equal(item[key], value)
        with pytest.raises(IndexError):
            source[len(source)]




def _torch():
    return pytest.importorskip("torch")


def _ids(batches) -> list[list[int]]:
    return [b["sample_ids"].tolist() for b in batches]


def test_torch_stream_under_workers_and_a_state_dict_round_trip(tmp_path):
    _torch()
    from mmfs.adapters.torch import RankStream

    golden = _golden_ranks("p2_blend2_u16", "single_dp4_mb2")["train"]
    with _mounted_case(tmp_path, "p2_blend2_u16", {"data_parallel_size": 4, "micro_batch_size": 2}) as m:
        mount = Mount(m.path)
        stream = RankStream(mount, "train", rank=1)
        batches = list(stream.batches(num_workers=2))
        n = len(golden["1"])  # the recording holds the first micro-batches of each rank
        assert _ids(batches)[:n] == golden["1"]  # Megatron's order, none twice, none lost
        assert len(batches) == mount.microbatches_per_rank("train")  # the rank's ranks/ files
        assert [mount.microbatch_samples("train", 1, j) for j in range(n, len(batches))] == _ids(batches)[n:]
        assert stream.state_dict() == {"consumed_samples": len(batches) * 8}
        for b in batches[:3]:
            want = mount.megatron_batch("train", b["sample_ids"].tolist())
            assert all(np.array_equal(b[k].numpy(), v) for k, v in want.items())
        # stop after 5 micro-batches, save, resume in a new stream with 2 workers
        first = RankStream(mount, "train", rank=1)
        head = list(itertools.islice(first.batches(num_workers=2), 5))
        state = first.state_dict()
        assert state == {"consumed_samples": 5 * 8}
        again = RankStream(mount, "train", rank=1)
        again.load_state_dict(state)
        assert _ids(head) + _ids(again.batches(num_workers=2)) == _ids(batches)


def test_torch_stream_on_a_changed_layout_reads_every_sample_once(tmp_path):
    _torch()
    from mmfs.adapters.torch import RankStream

    with _mounted_case(tmp_path, "p2_blend2_u16", {"data_parallel_size": 4, "micro_batch_size": 2}) as m:
        mount = Mount(m.path)
        consumed = 16 * 8  # saved by the dp 4 job; resumed with dp 3, mbs 1
        seen = []
        for rank in range(3):
            stream = RankStream(mount, "train", rank, consumed_samples=consumed, data_parallel_size=3,
                                micro_batch_size=1)
            seen += [i for ids in _ids(stream.batches(num_workers=2)) for i in ids]
            if rank == 1:  # the same micro-batches as the mount's stream folder of that layout
                folder = m.path / "train" / "streams" / f"dp=3,mbs=1,from={consumed}" / "001"
                names = sorted(os.listdir(folder))
                ids = [[int(x) for x in os.getxattr(folder / n, "user.mmfs.samples").split()] for n in names]
                assert ids == _ids(RankStream(mount, "train", 1, consumed_samples=consumed, data_parallel_size=3,
                                              micro_batch_size=1))
        total = mount.samples["train"]
        read = consumed + (total - consumed) // 3 * 3  # the single sampler drops a last partial batch
        assert sorted(seen) == list(range(consumed, read))


def test_torch_stream_of_the_cyclic_sampler(tmp_path):
    _torch()
    from mmfs.adapters.torch import RankStream

    golden = _golden_ranks("p1_single_u16", "cyclic_dp3_mb2_sharded")["train"]
    training = {"data_parallel_size": 3, "micro_batch_size": 2, "dataloader_type": "cyclic"}
    with _mounted_case(tmp_path, "p1_single_u16", training) as m:
        stream = RankStream(Mount(m.path), "train", rank=2)
        n = len(golden["2"])
        assert _ids(itertools.islice(stream.batches(num_workers=2), n)) == golden["2"]


def test_torch_stream_of_the_unsharded_cyclic_sampler_goes_on_from_the_rank_s_own_count(tmp_path):
    """p3's 643 samples on 4 ranks of 1, from 624: ranks 0-2 read 5 more of epoch 0 and
    go on from 644, rank 3 reads 4 and goes on from 640, as each rank's sampler counts."""
    _torch()
    from mmfs.adapters.torch import RankStream
    from mmfs.megatron.sampling.samplers import training_stream

    training = {"data_parallel_size": 4, "micro_batch_size": 1, "dataloader_type": "cyclic", "data_sharding": False}
    with _mounted_case(tmp_path, "p3_multi_epoch_i32", training) as m:
        for rank in (0, 3):
            stream = RankStream(Mount(m.path), "train", rank=rank, consumed_samples=624)
            want = list(itertools.islice(training_stream("cyclic", 643, 624, 1, rank, 4, False), 8))
            assert _ids(itertools.islice(stream.batches(), 8)) == want


def test_torch_example_resumes_on_another_data_parallel_size(tmp_path):
    _torch()
    example = Path(__file__).resolve().parent.parent / "examples" / "torch_train.py"
    ckpt = tmp_path / "ckpt.pt"
    training = {"data_parallel_size": 4, "micro_batch_size": 2, "global_batch_size": 16}
    with _mounted_case(tmp_path, "p2_blend2_u16", training) as m:
        def run(*args: str) -> list[str]:
            proc = subprocess.run([sys.executable, str(example), str(m.path), "--checkpoint", str(ckpt),
                                   "--iterations", "3", *args], capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            return proc.stdout.splitlines()

        # An iteration is a global batch (2 micro-batches of each rank), as in Megatron.
        first = run()
        assert [line.split()[1] for line in first] == ["16", "32", "48"]
        assert first[0].endswith("samples [0, 1, 8, 9]")
        # Resumed on dp 2, the global batch stays 16: 4 micro-batches of each rank.
        resumed = run("--data-parallel-size", "2", "--workers", "1")
        assert resumed[0] == "resuming at consumed_samples 48"
        assert [line.split()[1] for line in resumed[1:]] == ["64", "80", "96"]
        # Megatron's single sampler on dp 2, mbs 2 from 48: rank 0 reads [48, 49], [52, 53], ...
        want = [f"samples {[i for k in range(4 * it, 4 * it + 4) for i in (48 + 4 * k, 49 + 4 * k)]}"
                for it in range(3)]
        assert [line[line.rindex("samples ["):] for line in resumed[1:]] == want


PHASE_CASE, PHASE_LAYOUT = "two_datasets_weights_swap", "sharded,dp=4,mbs=1"


def _phase_case() -> dict:
    return json.loads((Path(__file__).parent / "reference" / "phase_evals.json").read_text())["cases"][PHASE_CASE]


def _mounted_phases(tmp_path: Path):
    """A restart run whose relaunches Megatron-LM's were recorded (record_phase_evals.py), cyclic."""
    return mounted(recorded_config(tmp_path, PHASE_CASE, _phase_case(), "restart", {"dataloader_type": "cyclic"}),
                   tmp_path / "mnt")


def test_grain_reads_a_restart_phase_s_own_valid(tmp_path):
    """phase=1: phase 1's own valid, megatron-core's build for its relaunch's blend (by digest)."""
    import hashlib

    case = _phase_case()
    with _mounted_phases(tmp_path) as m:
        source = SampleSource(m.path, "valid", phase=1)
        assert len(source) == len(case["per_phase"][1]["valid"]) and "phase=1" in repr(source)
        digests = [hashlib.sha256(source[i].astype(np.int64).tobytes()).hexdigest()[:16] for i in range(len(source))]
        assert digests == case["per_phase"][1]["valid"] != case["per_phase"][0]["valid"]
        assert pickle.loads(pickle.dumps(source))[5].tobytes() == source[5].tobytes()
        item = SampleSource(m.path, "valid", megatron=True, phase=1)[5]
        assert np.array_equal(item["tokens"], Mount(m.path).megatron_item("valid", 5, phase=1)["tokens"])


def test_torch_stream_of_a_restart_phase_s_own_valid_on_another_layout(tmp_path):
    """phase=1 on 4 ranks of 1 (the config has 1 rank of 4), from the relaunch's carried
    consumed_valid_samples: what Megatron's relaunched loader read (cyclic, sharded)."""
    _torch()
    from mmfs.adapters.torch import RankStream

    reads = _phase_case()["reads"][PHASE_LAYOUT]
    start = reads["consumed_valid_at_launch"][1]
    with _mounted_phases(tmp_path) as m:
        for rank in range(4):
            want = [batch for phase, ranks in reads["valid"] if phase == 1 for batch in ranks[rank]]
            stream = RankStream(Mount(m.path), "valid", rank, consumed_samples=start, data_parallel_size=4,
                                micro_batch_size=1, phase=1)
            got = list(itertools.islice(stream.batches(), len(want)))
            assert _ids(got) == want
            for batch, ids in zip(got, want):  # phase 1's own samples (phase 0's valid is as long)
                own = Mount(m.path).megatron_batch("valid", ids, phase=1)["tokens"]
                assert np.array_equal(batch["tokens"].numpy(), own)
