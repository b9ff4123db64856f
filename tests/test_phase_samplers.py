"""phase_mode restart x dataloader_type cyclic (issue 31 item 1): every view of a
stream reads what Megatron-LM core_v0.19.0's relaunched phases read, each phase with
a MegatronPretrainingRandomSampler over its own dataset (its BlendedDataset, or a bare
prefix's GPTDataset, both longer than the phase), built at the samples consumed in
the phase. Held to tests/reference/phase_samplers.json (record_phase_samplers.py:
Megatron's own training.py, data_samplers.py and megatron-core 0.19.2): ranks/ of a
real mount, streams/ of every recorded layout from 0 and from each recorded resume,
beyond/, `mmfs which`, `mmfs resume-check`, the loader, the grain source, and
`mmfs config --from-megatron ... --next-phase`."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmfs.loader import LoaderError, Mount
from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phases.sampling import cyclic_spans, split_sampler
from mmfs.megatron.sampling.phaseplan import PhasedSampler, check_phased_resume, phased_stream
from mmfs.megatron.sampling.rankplan import plan_ranks, rank_ids
from mmfs.megatron.sampling.resume import Sampling
from mmfs.mount.contract import XATTR_PHASE, XATTR_SAMPLES
from mmfs.mount.tree import Tree
from mmfs.tools.which import which, which_in
from mount_fixtures import mmfs, mounted

HERE = Path(__file__).resolve().parent
REFERENCE = json.loads((HERE / "reference" / "phase_samplers.json").read_text())["cases"]
DATA = HERE / "golden" / "data"


def write_config(tmp: Path, name: str, layout: dict, mode: str = "restart", shift: int = 0, seed: int = 0) -> Path:
    """The recorded run as an mmfs config on `layout` (starts written as the case says:
    iterations, samples or tokens). shift / seed: a negative control's changed boundary
    (iterations added to the second phase's start) and seed."""
    case = REFERENCE[name]
    link = tmp / "data"
    if not link.exists():
        link.symlink_to(DATA, target_is_directory=True)
    gbs, seq = case["global_batch_size"], case["sequence_length"]
    phases = []
    for k, ((start, blend), how) in enumerate(zip(case["phases"], case["start_as"])):
        start += shift if k == 1 else 0
        entry = {"data_path": [blend]} if isinstance(blend, str) else \
            {"datasets": [{"path": p, "weight": w} for p, w in blend.items()]}
        at = {"start_iteration": start, "start_samples": start * gbs, "start_tokens": start * gbs * seq}
        phases.append(entry if k == 0 else {how: at[how], **entry})
    config = {"phases": phases, "phase_mode": mode, "split": case["split"], "seed": case["seed"] + seed,
              "sequence_length": seq, "tokenizer": {"eod": 0}, "cache_dir": str(tmp / "cache"),
              "training": {"data_parallel_size": layout["dp"], "micro_batch_size": layout["mbs"],
                           "global_batch_size": gbs, "train_samples": case["train_samples"],
                           "eval_interval": case["eval_interval"], "eval_iters": case["eval_iters"],
                           "dataloader_type": "cyclic", "data_sharding": layout["data_sharding"]}}
    path = tmp / f"{name}-{layout['dp']}-{layout['mbs']}-{layout['data_sharding']}-{mode}-{shift}-{seed}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def chain(case: dict, layout: dict, spans) -> list[np.ndarray]:
    """Each rank's recorded micro-batches of the whole run ([n, mbs]), as split ids."""
    mbs = layout["mbs"]
    bounds = np.cumsum([0] + [n * mbs for n in layout["phase_microbatches"]])
    out = []
    for local in layout["ranks"]:
        local = np.asarray(local, dtype=np.int64)
        ids = np.concatenate([spans[k].split_ids(local[a:b]) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))])
        out.append(ids.reshape(-1, mbs))
    return out


def resumed(case: dict, resume: dict, spans) -> list[np.ndarray]:
    """A recorded resume's micro-batches of each rank ([n, mbs]), as split ids."""
    mbs = case["layouts"][resume["layout"]]["mbs"]
    return [spans[resume["phase"]].split_ids(np.asarray(r, dtype=np.int64)).reshape(-1, mbs) for r in resume["ranks"]]


def local_of(spans, i: int) -> tuple[int, int]:
    """(phase, its own sample) of split id i."""
    for k, s in enumerate(spans):
        if s.start <= i < s.start + s.listed:
            return k, i - s.start
        if s.beyond <= i < s.beyond + s.length - s.listed:
            return k, s.listed + i - s.beyond
    raise AssertionError(f"sample {i} is in no phase")


def digest(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(tokens).astype(np.int64).tobytes()).hexdigest()[:16]


def check_samples(case: dict, spans, ids, tokens: bytes, dtype) -> None:
    """The bytes of a micro-batch file hold, sample by sample, what Megatron's DataLoader
    delivered for those samples (recorded digests)."""
    rows = np.frombuffer(tokens, dtype=dtype).reshape(len(ids), -1)
    for i, row in zip(ids, rows):
        k, local = local_of(spans, int(i))
        assert digest(row) == case["phase_datasets"][k]["digests"][str(local)], (i, k, local)


def mismatches(case: dict, corpus, layout: dict) -> int:
    """Micro-batches of the corpus's rank views (the C reader's formula) whose ids or
    samples' bytes differ from the recorded run on `layout`."""
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    plan = split_sampler(reader.indices, "cyclic", layout["mbs"], layout["dp"], layout["data_sharding"]).plan(
        0, whole_pass=False)
    bad = 0
    for rank, want in enumerate(chain(case, layout, spans)):
        got = rank_ids(plan, rank)[:len(want)]
        if got.shape != want.shape:
            bad += len(want)
            continue
        for ids, recorded in zip(got, want):
            try:
                assert ids.tolist() == recorded.tolist()
                check_samples(case, spans, ids, b"".join(reader.read(int(i)) for i in ids), reader.dtype)
            except AssertionError:
                bad += 1
    return bad


@pytest.fixture(scope="module", params=sorted(REFERENCE))
def run(request, tmp_path_factory):
    """A recorded case mounted on its first layout (sharded)."""
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    case = REFERENCE[name]
    path = write_config(tmp, name, case["layouts"][0])
    (tmp / "mnt").mkdir()
    with mounted(path, tmp / "mnt") as m:
        yield name, case, path, open_corpus(str(path), progress=False), m


def test_each_phase_is_sized_as_its_relaunch(run):
    name, case, path, corpus, m = run
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    assert [s.length for s in spans] == [p["dataset_length"] for p in case["phase_datasets"]]
    assert [s.listed for s in spans] == [p["num_samples"] for p in case["phase_datasets"]]
    info = json.loads((m.path / "mmfs.json").read_text())
    phases = info["phases"]["phases"]
    assert [p["megatron_dataset"] for p in phases] == [p["megatron_dataset"] for p in case["phase_datasets"]]
    assert [(p["sampler_samples"], p["beyond_first_id"]) for p in phases] == [(s.length, s.beyond) for s in spans]
    beyond = sum(s.length - s.listed for s in spans)
    assert reader.beyond == beyond > 0
    assert info["splits"]["train"]["beyond"] == {"path": "train/beyond", "name_width": 7, "samples": beyond}
    assert len(os.listdir(m.path / "train" / "beyond")) == beyond


def test_ranks_are_the_relaunched_phases(run):
    name, case, path, corpus, m = run
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    layout = case["layouts"][0]
    for rank, want in enumerate(chain(case, layout, spans)):
        folder = m.path / "train" / "ranks" / f"{rank:03d}"
        # the view holds the split's whole micro-batch steps; the run stops at train_iters
        assert len(os.listdir(folder)) >= len(want)
        for j, ids in enumerate(want):
            f = folder / f"{j:07d}.bin"
            assert os.getxattr(f, XATTR_SAMPLES).decode().split() == [str(i) for i in ids], (rank, j)
            check_samples(case, spans, ids, f.read_bytes(), reader.dtype)
    if name == "issue_two_phases":  # the example: iteration 7, rank 0
        assert chain(case, layout, spans)[0][12:14].tolist() == [[68, 53], [51, 60]]


def test_the_ranks_of_every_layout_sharded_and_not(run, tmp_path):
    """Each recorded layout as the config's own: its rank views (the C reader's plan)."""
    name, case, path, corpus, m = run
    for layout in case["layouts"]:
        other = open_corpus(str(write_config(path.parent, name, layout)), progress=False)
        assert mismatches(case, other, layout) == 0, layout
    unsharded = next(lay for lay in case["layouts"] if not lay["data_sharding"])
    tree = Tree(open_corpus(str(write_config(path.parent, name, unsharded)), progress=False))
    spans = cyclic_spans(corpus.splits["train"].indices)
    for rank, want in enumerate(chain(case, unsharded, spans)):
        for j in (0, len(want) // 2, len(want) - 1):
            node = tree.lookup(f"/train/ranks/{rank:03d}/{j:07d}.bin")
            assert tree.xattr(node, XATTR_SAMPLES).decode().split() == [str(i) for i in want[j]]
            check_samples(case, spans, want[j], tree.read(node, 0, 1 << 30), corpus.splits["train"].dtype)


def _stream(layout: dict, consumed: int) -> str:
    return (f"dp={layout['dp']},mbs={layout['mbs']},from={consumed},sampler=cyclic,"
            f"sharding={'true' if layout['data_sharding'] else 'false'}")


def test_streams_of_every_layout_from_zero(run):
    name, case, path, corpus, m = run
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    for layout in case["layouts"]:
        folder = m.path / "train" / "streams" / _stream(layout, 0)
        for rank, want in enumerate(chain(case, layout, spans)):
            files = sorted(os.listdir(folder / f"{rank:03d}"))
            assert len(files) >= len(want)  # (then the last phase's sampler, on to its pass's end)
            for j in sorted({0, len(want) // 3, len(want) - 1}):
                f = folder / f"{rank:03d}" / files[j]
                assert os.getxattr(f, XATTR_SAMPLES).decode().split() == [str(i) for i in want[j]]
                check_samples(case, spans, want[j], f.read_bytes(), reader.dtype)
            assert [os.getxattr(folder / f"{rank:03d}" / files[j], XATTR_SAMPLES).decode().split()
                    for j in range(len(want))] == [[str(i) for i in ids] for ids in want]


def test_streams_from_each_resume_cross_the_boundaries(run):
    """A job relaunched at an iteration inside a phase, on another layout: its phase's
    sampler rebuilt at the samples consumed in the phase, then the later phases."""
    name, case, path, corpus, m = run
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    gbs = case["global_batch_size"]
    for resume in case["resumes"]:
        layout = case["layouts"][resume["layout"]]
        folder = m.path / "train" / "streams" / _stream(layout, resume["iteration"] * gbs)
        whole = chain(case, layout, spans)
        per_iteration = gbs // (layout["dp"] * layout["mbs"])
        after = resume["exit_iteration"] * per_iteration  # the layout's chain from the next phase on
        for rank, want in enumerate(resumed(case, resume, spans)):
            want = np.concatenate([want, whole[rank][after:]])
            got = [os.getxattr(folder / f"{rank:03d}" / f"{j:07d}.bin", XATTR_SAMPLES).decode().split()
                   for j in range(len(want))]
            assert got == [[str(i) for i in ids] for ids in want], (resume, rank)
            f = folder / f"{rank:03d}" / f"{0:07d}.bin"
            check_samples(case, spans, want[0], f.read_bytes(), reader.dtype)


def test_a_layout_that_cuts_a_phase_is_not_there(run):
    """A micro-batch step that would straddle a transition: Megatron's global batch is
    a multiple of mbs x dp, so no such job exists; ENOENT, and the log says why."""
    name, case, path, corpus, m = run
    first = case["phase_datasets"][0]["num_samples"]
    mbs = next(n for n in range(2, first + 2) if first % n)
    folder = m.path / "train" / "streams" / f"dp=1,mbs={mbs},from=0,sampler=cyclic"
    assert not folder.exists()
    assert "not whole micro-batch steps" in m.log.read_text()


def test_beyond_holds_what_only_the_phases_own_samplers_read(run):
    name, case, path, corpus, m = run
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    folder = m.path / "train" / "beyond"
    for k, (span, recorded) in enumerate(zip(spans, case["phase_datasets"])):
        for local in range(span.listed, span.length):
            if str(local) not in recorded["digests"]:
                continue  # no recorded layout read it
            f = folder / f"{span.beyond + local - span.listed - len(reader):07d}.bin"
            assert digest(np.frombuffer(f.read_bytes(), dtype=reader.dtype)) == recorded["digests"][str(local)]
            assert os.getxattr(f, XATTR_PHASE).decode() == str(k)
    first = folder / "0000000.bin"
    dataset = os.getxattr(first, "user.mmfs.dataset").decode()
    gpt, sample = reader.locate(len(reader))
    assert dataset == gpt.name and os.getxattr(first, "user.mmfs.pieces").decode()


def test_which_reads_every_iteration_as_the_relaunches_do(run):
    name, case, path, corpus, m = run
    spans = cyclic_spans(corpus.splits["train"].indices)
    layout = case["layouts"][0]
    want = chain(case, layout, spans)
    per_iteration = case["global_batch_size"] // (layout["dp"] * layout["mbs"])
    for iteration in range(1, len(want[0]) // per_iteration + 1):
        result = which_in(corpus, iteration)
        phase = result["phases"][0]["phase"]
        for r in result["ranks"]:
            for b in r["microbatches"]:
                ids = [s["sample"] for s in b["samples"]]
                assert ids == want[r["rank"]][b["stream_index"]].tolist(), (iteration, r["rank"])
                assert {s["phase"] for s in b["samples"]} == {phase}
    gbs = case["global_batch_size"]
    for resume in case["resumes"]:
        if resume["layout"] != 0:
            continue
        result = which_in(corpus, None, consumed=resume["iteration"] * gbs)
        first = resumed(case, resume, spans)
        for r in result["ranks"]:
            assert [[s["sample"] for s in b["samples"]] for b in r["microbatches"]] == \
                first[r["rank"]][:per_iteration].tolist()
    if name == "issue_two_phases":
        proc = mmfs("which", path, "--iteration", 7, "--rank", 0, "--json")
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)["ranks"][0]["microbatches"]
        assert [[s["sample"] for s in b["samples"]] for b in got] == [[68, 53], [51, 60]]
        assert which(str(m.path), 7, rank=0)["ranks"] == json.loads(proc.stdout)["ranks"]


def test_resume_check_within_the_phase_a_job_resumes_in(run):
    """The job ran on the config's layout up to a recorded resume and resumes on that
    resume's layout: what the two read in the phase, against the old layout's whole phase."""
    name, case, path, corpus, m = run
    spans = cyclic_spans(corpus.splits["train"].indices)
    gbs = case["global_batch_size"]
    old_layout = case["layouts"][0]
    old_chain = chain(case, old_layout, spans)
    old_bounds = np.cumsum([0] + old_layout["phase_microbatches"])
    checked = 0
    for resume in case["resumes"]:
        p = resume["phase"]
        if p == len(spans) - 1:
            continue  # the last phase's pass runs past the recorded run (train_iters)
        new = case["layouts"][resume["layout"]]
        consumed = resume["iteration"] * gbs
        steps = (consumed - spans[p].start) // (old_layout["dp"] * old_layout["mbs"])
        phase_reads = [r[old_bounds[p]:old_bounds[p + 1]] for r in old_chain]
        before = np.concatenate([r[:steps].ravel() for r in phase_reads])
        after = np.concatenate([r.ravel() for r in resumed(case, resume, spans)])
        expected = np.unique(np.concatenate([r.ravel() for r in phase_reads]))
        ids, counts = np.unique(np.concatenate([before, after]), return_counts=True)
        repeated, skipped = ids[counts > 1], np.setdiff1d(expected, ids)
        to = f"dp={new['dp']},mbs={new['mbs']},sampler=cyclic,sharding={'true' if new['data_sharding'] else 'false'}"
        report = check_phased_resume(spans, Sampling(old_layout["dp"], old_layout["mbs"], "cyclic", True), consumed,
                                     Sampling(new["dp"], new["mbs"], "cyclic", new["data_sharding"]))
        assert report.repeated.tolist() == repeated.tolist() and report.skipped.tolist() == skipped.tolist()
        assert report.expected == len(expected) and report.read_after == len(after)
        proc = mmfs("resume-check", path, "--consumed", consumed, "--to", to, "--json")
        got = json.loads(proc.stdout)
        assert proc.returncode == (0 if repeated.size + skipped.size == 0 else 1), proc.stderr
        assert (got["repeated"], got["skipped"], got["phase_at_resume"]) == (repeated.size, skipped.size, p)
        assert got["first_repeated"] == repeated[:10].tolist()
        checked += 1
    assert checked >= 2


def test_the_loader_and_the_grain_source_read_the_relaunched_phases(run):
    from mmfs.adapters.grain import SampleSource

    name, case, path, corpus, m = run
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    mount = Mount(m.path)
    gbs = case["global_batch_size"]
    layout = case["layouts"][0]
    whole = chain(case, layout, spans)
    for resume in case["resumes"]:
        if resume["layout"] != 0:
            continue
        consumed = resume["iteration"] * gbs
        step = layout["dp"] * layout["mbs"]
        for rank in range(layout["dp"]):
            got = list(mount.megatron_batches("train", rank, consumed_samples=consumed))
            want = whole[rank][consumed // step:]
            assert len(got) >= len(want)
            for j in (0, len(want) - 1):
                ids = mount.microbatch_samples("train", rank, consumed // step + j)
                assert ids == want[j].tolist()
                direct = mount.megatron_batch("train", ids)
                assert all(np.array_equal(got[j][k], direct[k]) for k in direct)
    # a micro-batch of a stream that holds a sample past the run's own: its fields and phase
    for layout, rank in ((lay, r) for lay in case["layouts"] for r in range(lay["dp"])):
        folder = Mount(m.path).stream_dir("train", rank, layout["dp"], layout["mbs"], 0, "cyclic",
                                          layout["data_sharding"])
        for f in sorted(os.listdir(folder)):
            ids = [int(i) for i in os.getxattr(os.path.join(folder, f), XATTR_SAMPLES).decode().split()]
            if max(ids) >= len(reader):
                batch = mount.microbatch_file(os.path.join(folder, f), eod_mask_loss=True)
                assert batch["sample_ids"].tolist() == ids
                assert batch["phase"].tolist() == [local_of(spans, i)[0] for i in ids]
                assert batch["tokens"].shape == (len(ids), case["sequence_length"])
                source = SampleSource(m.path, "train")
                beyond = max(ids)
                assert source[beyond].tobytes() == reader.read(beyond)
                assert mount.phase("train", beyond) == local_of(spans, beyond)[0]
                return
    raise AssertionError("no recorded layout read a sample past the run's own")


def test_config_from_megatron_launches_reads_as_the_relaunches(tmp_path):
    """One launch line per phase (Megatron-LM's --phase-transition-iterations) as a config:
    its rank views are the recorded relaunches."""
    name = "bare_middle_phase"
    case = REFERENCE[name]
    (tmp_path / "data").symlink_to(DATA, target_is_directory=True)
    for layout in (case["layouts"][0], case["layouts"][1]):
        common = (f"--split {case['split']} --seq-length {case['sequence_length']} --seed {case['seed']} "
                  f"--micro-batch-size {layout['mbs']} --global-batch-size {case['global_batch_size']} "
                  f"--train-samples {case['train_samples']} --eval-interval {case['eval_interval']} "
                  f"--eval-iters {case['eval_iters']} --world-size {layout['dp']} --dataloader-type cyclic "
                  f"--tokenizer-type NullTokenizer --vocab-size 50257 --data-cache-path cache "
                  f"--phase-transition-iterations {','.join(str(t) for t, _ in case['phases'][1:])}"
                  + ("" if layout["data_sharding"] else " --no-data-sharding"))
        launches = []
        for k, (_, blend) in enumerate(case["phases"]):
            data = blend if isinstance(blend, str) else " ".join(f"{w} {p}" for p, w in blend.items())
            (tmp_path / f"phase{k}.args").write_text(f"--data-path {data}\n{common}\n")
            launches += (["--next-phase"] if launches else []) + [f"@phase{k}.args"]
        proc = mmfs("config", "--from-megatron", *launches, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        config = tmp_path / "run.yaml"
        config.write_text(proc.stdout)
        corpus = open_corpus(str(config), progress=False)
        assert corpus.config.training.dataloader_type == "cyclic"
        assert mismatches(case, corpus, layout) == 0


# -- the checks can fail ---------------------------------------------------------------


def test_negative_controls(run):
    """A run with one boundary moved or another seed, and the whole-run permutation mmfs
    used before, do not pass the comparison; the model agrees with the plans."""
    name, case, path, corpus, m = run
    layout = case["layouts"][0]
    assert mismatches(case, corpus, layout) == 0
    if name == "issue_two_phases":
        for shift, seed in ((1, 0), (0, 1)):  # (the samplers ignore the seed; the samples' bytes do not)
            other = open_corpus(str(write_config(path.parent, name, layout, shift=shift, seed=seed)), progress=False)
            assert mismatches(case, other, layout) > 0
    reader = corpus.splits["train"]
    spans = cyclic_spans(reader.indices)
    whole_run = plan_ranks(len(reader), layout["mbs"], layout["dp"], "cyclic", layout["data_sharding"])
    want = chain(case, layout, spans)[0]
    assert not np.array_equal(rank_ids(whole_run, 0)[:len(want)], want)
    sampler = PhasedSampler(spans, layout["mbs"], layout["dp"], layout["data_sharding"])
    stream = phased_stream(spans, 0, layout["mbs"], 0, layout["dp"], layout["data_sharding"])
    model = np.stack([next(stream) for _ in range(len(want))])
    assert np.array_equal(model, want)
    assert all(np.array_equal(sampler.microbatch(0, n)[0], want[n]) for n in range(len(want)))


def test_the_torch_rank_stream_reads_the_relaunched_phases(run):
    """RankStream (skipped without torch) from a recorded resume: its micro-batches are the
    resume's, then the layout's later phases, across its stream folders."""
    torch = pytest.importorskip("torch")
    from mmfs.adapters.torch import RankStream

    name, case, path, corpus, m = run
    spans = cyclic_spans(corpus.splits["train"].indices)
    gbs = case["global_batch_size"]
    resume = case["resumes"][-1]
    layout = case["layouts"][resume["layout"]]
    after = resume["exit_iteration"] * gbs // (layout["dp"] * layout["mbs"])
    for rank in range(layout["dp"]):
        want = np.concatenate([resumed(case, resume, spans)[rank], chain(case, layout, spans)[rank][after:]])
        stream = RankStream(Mount(m.path), "train", rank, consumed_samples=resume["iteration"] * gbs,
                            data_parallel_size=layout["dp"], micro_batch_size=layout["mbs"],
                            dataloader_type="cyclic", data_sharding=layout["data_sharding"])
        got = [b["sample_ids"].tolist() for b in itertools.islice(stream, len(want) + 2)]
        assert got[:len(want)] == want.tolist()
        assert torch.is_tensor(next(iter(stream))["tokens"])
    with pytest.raises(LoaderError, match="not whole micro-batch steps"):
        RankStream(Mount(m.path), "train", 0, consumed_samples=0, data_parallel_size=1,
                   micro_batch_size=next(n for n in range(2, 99) if spans[0].listed % n), dataloader_type="cyclic")
