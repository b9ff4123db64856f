"""The reference matrix (issue 31 item 5): every view of a real mount against what
Megatron reads, in every cell of {single, cyclic sharded, cyclic unsharded} x {no
phases, continue, restart} x {constant batch, ramp-up, step schedule} (restart under
a schedule: refused, as Megatron-LM needs a fixed batch for its phase transitions), for
each storage kind {an IndexedDataset pair, a JSONL text tokenized into the cache by
the config, the pair in the S3 test server} (the last two over the constant-batch
cells: a schedule moves where iterations start, not how a byte is read).

The reference is tests/reference/matrix.json, recorded from megatron-core 0.19.2 and
Megatron-LM core_v0.19.0's own training-side code by tests/reference/record_matrix.py
(each launch's datasets, samplers, batch sizes and evaluations; matrix_reference.py
reads it). The views: samples/, ranks/, streams/ at and around each phase start,
`mmfs which` for train, valid and test, `mmfs resume-check`, mmfs.loader, the torch and
grain adapters (where installed), and the --dataloader-type external provider. One
mount per storage kind and cell, shared by the tests of that cell.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from s3_server import MotoServer, use_test_credentials

import matrix_cases as mc
from matrix_mounts import BUCKET, Run, differences, loader_files, write_config, write_data
from matrix_reference import CELLS, REFERENCE, Cell, describe, digest, file_digests, wrong
from mmfs import cli
from mmfs.adapters.megatron import mount_datasets_provider
from mmfs.errors import MmfsError
from mmfs.megatron.corpus import open_corpus
from mmfs.mount.contract import XATTR_SAMPLES
from mount_fixtures import mounted

STORAGES = ("local", "text", "s3")
ACTIVE = [name for name, cell in CELLS.items() if "refused" not in cell]
REFUSED = [name for name, cell in CELLS.items() if "refused" in cell]

# Cells that are wrong on main until another branch merges, skipped with the branch that
# fixes them: (sampler, mode, part) -> "branch NAME (issue N): what it fixes"; part "train"
# is every view of the train stream, "evals" restart's valid and test after its first
# launch. Empty: cyclic-phases, phase-evals and megatron-path have merged.
PENDING: dict[tuple[str, str, str], str] = {}


def pending(cell: Cell, part: str) -> None:
    reason = PENDING.get((cell.sampler, cell.mode, part))
    if reason:
        pytest.skip(f"{cell.name} {part}: pending {reason}")


# -- the data, the configs and the mounts -----------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("matrix-data")
    write_data(folder / "data")
    return folder


@pytest.fixture(scope="module")
def s3(data):
    """The S3 test server holding the pairs; this process and the mounts talk to it only."""
    server = MotoServer()
    with pytest.MonkeyPatch.context() as mp:
        use_test_credentials(mp)
        for name in mc.DATASETS:
            for ext in ("bin", "idx"):
                server.put(BUCKET, f"data/{name}.{ext}", (data / "data" / f"{name}.{ext}").read_bytes())
        yield server
        server.stop()


# A batch schedule moves where iterations start, not how a byte is read: the text and s3
# kinds run the constant-batch cells (every sampler and mode), the local kind all of them.
RUNS = [(s, c) for s in STORAGES for c in ACTIVE if s == "local" or c.endswith("/constant")]


@pytest.fixture(scope="module", params=RUNS, ids=[f"{s}:{c}" for s, c in RUNS])
def run(request, data, tmp_path_factory):
    storage, name = request.param
    cell = Cell(name)
    endpoint = request.getfixturevalue("s3").url if storage == "s3" else None
    folder = tmp_path_factory.mktemp(f"{storage}-{name.replace('/', '-')}")
    config = write_config(name, storage, data, folder, endpoint)
    with mounted(config, folder / "mnt") as m:
        yield Run(cell, storage, config, m.path)


# -- the data are what Megatron read ------------------------------------------------------


def test_generated_data_is_what_megatron_read(data, tmp_path):
    """The pairs mmfs's writer makes, and the pairs a text config tokenizes into its cache,
    are byte for byte the ones megatron-core's IndexedDatasetBuilder wrote for the recording."""
    for name, want in REFERENCE["data"].items():
        for ext in ("bin", "idx"):
            assert hashlib.sha256((data / "data" / f"{name}.{ext}").read_bytes()).hexdigest() == want[ext], name
    config = write_config("single/restart/constant", "text", data, tmp_path)  # all three datasets
    open_corpus(str(config), progress=False)
    for name, want in REFERENCE["data"].items():
        pairs = sorted((data / "cache-text" / "text").glob(f"{name}-*_text_document.bin"))
        assert pairs, name
        for ext in ("bin", "idx"):
            got = hashlib.sha256(pairs[-1].with_suffix(f".{ext}").read_bytes()).hexdigest()
            assert got == want[ext], (name, ext)


# -- samples/ -------------------------------------------------------------------------------


def test_samples(run):
    """samples/ of train, valid and test; under restart also each launch's own valid and test
    (<split>/phases/<phase>/samples, where mmfs.json's phases section says)."""
    cell, mount = run.cell, run.mount
    got = [run.digests(mount.sample_path("train", i))[0] for i in range(mount.samples["train"])]
    assert not describe("train/samples", got, cell.train_samples())
    for split in ("valid", "test"):
        got = [run.digests(mount.sample_path(split, i))[0] for i in range(mount.samples[split])]
        assert not describe(f"{split}/samples", got, cell.eval_samples(split))  # the first launch's
    if cell.mode == "restart":
        pending(cell, "evals")
        for launch, split in itertools.product(range(len(cell.base["launches"])), ("valid", "test")):
            info = run.phase_split(launch, split)
            folder = run.path / info["path"]
            got = [run.digests(folder / f"{i:0{info['name_width']}d}.bin")[0] for i in range(info["samples"])]
            assert not describe(f"{info['path']}", got, cell.eval_samples(split, launch))


# -- ranks/ ------------------------------------------------------------------------------


def test_ranks(run):
    """Every micro-batch file of every rank: file j is the j-th micro-batch the rank reads."""
    cell = run.cell
    pending(cell, "train")
    if cell.exact_stream:
        for rank in range(mc.DATA_PARALLEL_SIZE):
            want = cell.train_stream(rank)
            got = run.rank_files("train", rank)
            assert len(got) >= len(want)
            assert not describe(f"train/ranks/{rank:03d}", got[:len(want)], want)
    else:
        check_phase_properties(run, {rank: list(zip(run.rank_ids("train", rank), run.rank_files("train", rank)))
                                     for rank in range(mc.DATA_PARALLEL_SIZE)})


def check_phase_properties(run: Run, streams: dict[int, list[tuple[list[int], list[str]]]]) -> None:
    """continue x cyclic (mmfs's own order, docs/phases.md): each rank's micro-batch j, read
    by the iteration that consumes samples from j x mbs x dp, holds samples of that
    iteration's phase only (each the sample samples/ shows under its id), and the
    iterations of a phase read each of its samples exactly once."""
    cell = run.cell
    samples = cell.train_samples()
    read: dict[int, list[int]] = {}
    for rank, microbatches in streams.items():
        for j, (ids, digests) in enumerate(microbatches[:mc.TRAIN_SAMPLES // cell.group]):
            phase = cell.phase_of(j * cell.group)
            assert [cell.phase_of(i) for i in ids] == [phase] * len(ids), (rank, j, ids)
            assert digests == [samples[i] for i in ids], (rank, j, ids)
            read.setdefault(phase, []).extend(ids)
    for phase, (a, b) in enumerate(zip(cell.bounds, cell.bounds[1:])):
        assert sorted(read[phase]) == list(range(a, b)), f"phase {phase} not read exactly once"


def test_ranks_evals(run):
    """valid/ranks and test/ranks: the stream each rank's valid and test loader reads from 0
    (the first launch's under restart); under restart each launch's own
    <split>/phases/<phase>/ranks, from the micro-batch its loader starts at."""
    cell = run.cell
    for rank in range(mc.DATA_PARALLEL_SIZE):
        want = [mb for launch, ranks in cell.valid_steps() if launch == 0 for mb in ranks[rank]]
        assert not describe(f"valid/ranks/{rank:03d}", run.rank_files("valid", rank)[:len(want)], want)
        want = [mb for step in cell.test_steps(0) for mb in step[rank]]
        assert not describe(f"test/ranks/{rank:03d}", run.rank_files("test", rank)[:len(want)], want)
    if cell.mode != "restart":
        return
    pending(cell, "evals")
    for launch, rank in itertools.product(range(len(cell.base["launches"])), range(mc.DATA_PARALLEL_SIZE)):
        valid = run.phase_split(launch, "valid")
        first = cell.base["launches"][launch]["valid_sampler_consumed"] // cell.group
        want = [mb for k, ranks in cell.valid_steps() if k == launch for mb in ranks[rank]]
        got = run.phase_rank_files(valid, rank)[first:first + len(want)]
        assert not describe(f"{valid['ranks_path']}/{rank:03d}", got, want)
        test = run.phase_split(launch, "test")
        want = [mb for step in cell.test_steps(launch) for mb in step[rank]]
        assert not describe(f"{test['ranks_path']}/{rank:03d}", run.phase_rank_files(test, rank)[:len(want)], want)


# -- streams/ -----------------------------------------------------------------------------


def test_streams(run):
    """streams/dp=D,mbs=M,from=C at and around each phase start, on the job's layout and
    another: a job relaunched there (Megatron-LM: its launch's sampler at the consumed
    samples of its phase; then the next launches from 0)."""
    cell = run.cell
    pending(cell, "train")
    for key in cell.resumed():
        layout = dict(part.split("=") for part in key.split(","))
        dp, mbs, at = int(layout["dp"]), int(layout["mbs"]), int(layout["from"])
        for rank in range(dp):
            files = run.mount.stream_files("train", rank, dp, mbs, at)
            got = [run.digests(f) for f in files]
            if cell.exact_stream:
                want, launch_part = cell.resumed_stream(key, rank)
                assert len(got) >= launch_part, f"{key} rank {rank}: {len(got)} files"
                n = min(len(got), len(want))  # what was recorded of it (STREAM_SAMPLES), or the folder's end
                assert not describe(f"train/streams/{key}/{rank:03d}", got[:n], want[:n])
            elif (dp, mbs) == (mc.DATA_PARALLEL_SIZE, mc.MICRO_BATCH_SIZE):  # mmfs's order: the rank's files from C
                assert got == run.rank_files("train", rank)[at // cell.group:][:len(got)], key
            else:  # another layout: every micro-batch in the phase of the samples it consumes
                for j, f in enumerate(files):
                    ids = [int(i) for i in os.getxattr(f, XATTR_SAMPLES).split()]
                    phase = cell.phase_of(at + j * dp * mbs)
                    assert {cell.phase_of(i) for i in ids} == {phase}, (key, rank, j, ids)


# -- which ----------------------------------------------------------------------------------


def test_which_train(run):
    """`mmfs which --iteration I` for every iteration of the run: each rank's micro-batches,
    their tokens read back from the dataset pieces it names."""
    cell = run.cell
    pending(cell, "train")
    for iteration in range(1, cell.train_iters + 1):
        answer = run.which(iteration)
        got = run.which_digests(answer)
        first = cell.microbatches_before(iteration)
        count = (cell.consumed[iteration] - cell.consumed[iteration - 1]) // cell.group
        assert answer["consumed_samples"] == cell.consumed[iteration - 1:iteration + 1], iteration
        for rank in range(mc.DATA_PARALLEL_SIZE):
            if cell.exact_stream:
                want = cell.train_stream(rank)[first:first + count]
                assert not describe(f"which --iteration {iteration} rank {rank}", got[rank], want)
            else:  # mmfs's order: the iteration's phase, each sample the one samples/ shows under its id
                phase, samples = cell.phase_of_iteration(iteration), cell.train_samples()
                for mb, digests in zip(answer["ranks"][rank]["microbatches"], got[rank]):
                    assert {s["phase"] for s in mb["samples"]} == {phase}, iteration
                    assert digests == [samples[s["sample"]] for s in mb["samples"]], iteration


def test_which_evals(run):
    """`mmfs which --split valid|test --iteration I`: every evaluation step of the run (valid
    goes on from one evaluation to the next; test is evaluated once, from 0)."""
    cell = run.cell
    steps = cell.valid_steps()
    for step, (launch, want) in enumerate(steps, start=1):
        if launch > 0:
            break
        assert not describe(f"which --split valid --iteration {step}", run.which_digests(run.which(step, "valid")),
                            want)
    last = len(cell.base["launches"]) - 1  # the launch that evaluates test: the last
    if cell.mode == "restart":
        pending(cell, "evals")
    for step, want in enumerate(cell.test_steps(last), start=1):
        assert not describe(f"which --split test --iteration {step}", run.which_digests(run.which(step, "test")), want)
    for step, (launch, want) in enumerate(steps, start=1):
        if launch > 0:
            assert not describe(f"which --split valid --iteration {step}",
                                run.which_digests(run.which(step, "valid")), want)


# -- resume-check --------------------------------------------------------------------------


def resume_check(run: Run, at: int, layout: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["resume-check", str(run.config), "--consumed", str(at), "--to", layout, "--json"])
    return code, json.loads(out.getvalue())


def test_resume_check(run):
    """resume-check at and around each phase start: on the job's own layout every sample once;
    on another, the samples repeated and skipped as Megatron's samplers read them (the old
    job's pass against a relaunch's: to the end of the split or epoch, a restart phase's end)."""
    cell = run.cell
    pending(cell, "train")
    for key, entry in cell.resumed().items():
        layout, at = key.rsplit(",from=", 1)
        code, answer = resume_check(run, int(at), layout)
        if "repeated" not in entry:  # the job's own layout
            assert (code, answer["repeated"], answer["skipped"]) == (0, 0, 0), key
        elif cell.exact_stream:
            want = (entry["repeated"], entry["skipped"])
            assert (answer["repeated"], answer["skipped"]) == want, key
            assert code == (0 if want == (0, 0) else 1), key


# -- mmfs.loader, the adapters and the provider --------------------------------------------


def _from(cell: Cell, at: int, rank: int, count: int) -> list[list[str]]:
    """The first `count` micro-batches `rank` reads from consumed_samples `at` on the job's layout."""
    if at == 0:
        return cell.train_stream(rank)[:count]
    key = f"dp={mc.DATA_PARALLEL_SIZE},mbs={mc.MICRO_BATCH_SIZE},from={at}"
    return cell.resumed_stream(key, rank)[0][:count]


def _rows(batch: dict) -> list[str]:
    tokens, labels = np.asarray(batch["tokens"]), np.asarray(batch["labels"])
    return [digest(np.concatenate([t, lab[-1:]])) for t, lab in zip(tokens, labels)]


def _starts(cell: Cell) -> list[int]:
    return [0, *(cell.consumed[t] for t in mc.PHASE_STARTS)]


@pytest.mark.parametrize("served", ["mount", "in_process"])
def test_loader(run, served):
    """mmfs.loader's megatron_batches: what Megatron's DataLoader gives each rank, from 0 and
    from each phase start; and valid's from 0 (of the mount, and of the config in-process)."""
    cell, mount = run.cell, getattr(run, served)
    pending(cell, "train")
    for at, rank in itertools.product(_starts(cell), range(mc.DATA_PARALLEL_SIZE)):
        got = [_rows(b) for b in itertools.islice(mount.megatron_batches("train", rank, consumed_samples=at), 4)]
        if cell.exact_stream:
            assert not describe(f"megatron_batches(train, {rank}, {at})", got, _from(cell, at, rank, 4))
        else:
            assert got == run.rank_files("train", rank)[at // cell.group:][:4]
    for rank in range(mc.DATA_PARALLEL_SIZE):
        want = [mb for launch, ranks in cell.valid_steps() if launch == 0 for mb in ranks[rank]][:4]
        got = [_rows(b) for b in itertools.islice(mount.megatron_batches("valid", rank), 4)]
        assert not describe(f"megatron_batches(valid, {rank})", got, want)


@pytest.mark.parametrize("served", ["mount", "in_process"])
def test_torch_adapter(run, served):
    pytest.importorskip("torch")
    from mmfs.adapters.torch import RankStream

    cell, mount = run.cell, getattr(run, served)
    pending(cell, "train")
    for at, rank in itertools.product(_starts(cell), range(mc.DATA_PARALLEL_SIZE)):
        got = [_rows(b) for b in itertools.islice(iter(RankStream(mount, "train", rank, consumed_samples=at)), 4)]
        if cell.exact_stream:
            assert not describe(f"RankStream(train, {rank}, {at})", got, _from(cell, at, rank, 4))
        else:
            assert got == run.rank_files("train", rank)[at // cell.group:][:4]


@pytest.mark.parametrize("served", ["path", "config"])
def test_grain_adapter(run, served):
    """grain's source of the mount, and of the config in-process (the protocol only: grain
    need not be installed to build one, nor to pickle it to a worker, which opens it anew)."""
    from mmfs.adapters.grain import SampleSource

    source = pickle.loads(pickle.dumps(SampleSource(str(getattr(run, served)), "train")))
    got = [digest(np.asarray(source[i])) for i in range(len(source))]
    assert not describe("grain SampleSource(train)", got, run.cell.train_samples())


def _batches(where: Path, args: SimpleNamespace, rank: int) -> tuple[list, list, list]:
    """The first 4 train, 2 valid and 2 test micro-batches the provider of `where` gives `rank`."""
    provider = mount_datasets_provider(
        where, get_args=lambda: args, data_parallel=lambda: (rank, mc.DATA_PARALLEL_SIZE), to_tensor=lambda a: a)
    train, valid, test = provider([mc.TRAIN_SAMPLES, 1, 1])
    return list(itertools.islice(train, 4)), list(itertools.islice(valid, 2)), list(itertools.islice(test, 2))


def _same_batches(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(
        x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.mark.parametrize("served", ["path", "config"])
def test_provider(run, served):
    """The provider on each rank of a job launched at each phase start: train from
    args.consumed_train_samples, valid from args.consumed_valid_samples, test from 0, as
    the launch's own loaders read them (restart: relaunched there with
    --phase-transition-iterations, so valid and test are the phase's own). Given the config
    instead of the mount (served in-process), every field of each batch is the mount's."""
    cell = run.cell
    pending(cell, "train")
    steps = cell.valid_steps()
    eval_batch = sum(len(mb) for r in steps[0][1] for mb in r)
    keys = mc.SCHEDULES[cell.schedule]
    for at, rank in itertools.product(_starts(cell), range(mc.DATA_PARALLEL_SIZE)):
        launch = cell.phase_of(at) if cell.mode == "restart" else 0
        valid_at = cell.consumed.index(at) // mc.EVAL_INTERVAL * mc.EVAL_ITERS  # evaluation steps before
        args = SimpleNamespace(  # Megatron-LM's args of that launch
            dataloader_type="external", seq_length=mc.SEQUENCE_LENGTH, micro_batch_size=mc.MICRO_BATCH_SIZE,
            global_batch_size=keys.get("global_batch_size", cell.group), rampup_batch_size=keys.get(
                "rampup_batch_size"), step_batch_size_schedule=keys.get("step_batch_size_schedule"),
            train_samples=mc.TRAIN_SAMPLES, train_iters=cell.train_iters, eval_interval=mc.EVAL_INTERVAL,
            eval_iters=mc.EVAL_ITERS, iteration=cell.consumed.index(at), consumed_train_samples=at,
            consumed_valid_samples=valid_at * eval_batch,
            phase_transition_iterations=mc.PHASE_STARTS if cell.mode == "restart" else None)
        train, valid, test = _batches(getattr(run, served), args, rank)
        if served == "config":
            assert all(map(_same_batches, (train, valid, test), _batches(run.path, args, rank))), (at, rank)
        got = [_rows(b) for b in train]
        if cell.exact_stream:
            assert not describe(f"provider train from {at}, rank {rank}", got, _from(cell, at, rank, 4))
        else:
            assert got == run.rank_files("train", rank)[at // cell.group:][:4]
        want = [mb for k, ranks in steps[valid_at:] if k == launch for mb in ranks[rank]][:2]
        got = [_rows(b) for b in valid]
        assert not describe(f"provider valid from step {valid_at}, rank {rank}", got, want)
        want = [mb for step in cell.test_steps(launch) for mb in step[rank]][:2]
        assert not describe(f"provider test, rank {rank}", [_rows(b) for b in test], want)


# -- the same bytes without a mount ---------------------------------------------------------


def test_in_process_serves_the_mounts_bytes(run):
    """Mount(CONFIG), served in this process through the C core without FUSE, against the
    mount of the same config: every file mmfs.loader reads of the cell (mmfs.json, samples
    with their beyond ids, each rank's micro-batches, the streams of its relaunches, each
    restart phase's own valid and test), its attribute and its stream folder's listing."""
    files = list(loader_files(run.mount, run.cell))
    assert len(files) > mc.TRAIN_SAMPLES
    assert differences(run.mount, run.in_process, run.cell) == []
    assert run.in_process.info == run.mount.info


# -- what Megatron refuses ------------------------------------------------------------------


@pytest.mark.parametrize("name", REFUSED)
def test_refused_cells(name, data, tmp_path):
    """restart under a batch-size schedule: Megatron-LM's phase transitions count a phase's
    samples as iterations x the global batch size, so they need a fixed one; mmfs refuses it
    in one line, as the recording says."""
    assert "fixed global batch size" in CELLS[name]["refused"]
    config = write_config(name, "local", data, tmp_path)
    with pytest.raises(MmfsError) as exc:
        open_corpus(str(config), progress=False)
    message = str(exc.value)
    assert "phase_mode: restart" in message and "fixed global batch size" in message and "\n" not in message


# -- the check can fail ----------------------------------------------------------------------


@pytest.mark.parametrize("change", ["seed", "boundary"])
def test_matrix_check_fails_when_a_case_changes(change, data, tmp_path):
    """A negative control: the recorded cell single/restart/constant with one seed or one
    phase boundary changed, read in this process (samples and each rank's micro-batches,
    compared as the view tests compare them), is found wrong."""
    cell = Cell("single/restart/constant")
    config = write_config(cell.name, "local", data, tmp_path)
    changed = yaml.safe_load(config.read_text())
    if change == "seed":
        changed["seed"] = mc.SEED + 1
    else:
        changed["phases"][1]["start_iteration"] = mc.PHASE_STARTS[0] + 1
    config.write_text(yaml.safe_dump(changed, sort_keys=False))
    corpus = open_corpus(str(config), progress=False)
    reader = corpus.splits["train"]
    tokens = corpus.sample_tokens
    samples = [file_digests(reader.read(i), corpus.dtype, tokens)[0] for i in range(len(reader))]
    assert len(wrong(samples, cell.train_samples())) > 0
    from mmfs.megatron.sampling.rankplan import microbatch_ids, plan_ranks

    plan = plan_ranks(len(reader), mc.MICRO_BATCH_SIZE, mc.DATA_PARALLEL_SIZE)
    got = [[samples[i] for i in microbatch_ids(plan, 0, j)] for j in range(plan.files_per_rank)]
    assert len(wrong(got, cell.train_stream(0))) > 0

