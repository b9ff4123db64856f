"""The mount's views, declared: which directories of generated files a corpus
gets, and what each file holds. Adding a view is one declaration here, plus
one C reader (`mmfs_<reader>_length`/`mmfs_<reader>_tokens` in native/) if its
bytes are new. The stream layouts (made on lookup: streams.py) are declared here
too: which folders have a `streams/` (stream_folders) and the view of a layout's
rank (microbatch_view).
"""

from __future__ import annotations

from typing import Any

from mmfs.errors import MountError, NativeError
from mmfs.megatron.phases.sampling import sample_phase, split_sampler
from mmfs.megatron.sampling.rankplan import native_plan, plan_splits
from mmfs.mount.contract import (
    DOCUMENTS,
    RANKS,
    SAMPLES,
    SEQUENCES,
    XATTR_DATASET,
    XATTR_PHASE,
    XATTR_PIECES,
    XATTR_SAMPLES,
    beyond_dir,
    dataset_dir,
    phase_dir,
    phase_name_width,
    rank_dir,
    rank_name_width,
    sample_dir,
)
from mmfs.mount.views import View
from mmfs.native import error_detail, ffi, lib


def sample_view(split_name: str, split: Any, mtime_ns: int, folder: str | None = None) -> View:
    """A split's samples in training order: `/<split>/samples` (or `folder`)."""

    phased = getattr(split.indices, "phases", None) is not None

    def xattrs(i: int) -> dict[str, bytes]:
        dataset, pieces = split.provenance(i)
        out = {
            XATTR_DATASET: dataset.encode(),
            XATTR_PIECES: " ".join(f"{s}:{o}:{n}" for s, o, n in pieces).encode(),
        }
        if phased:
            out[XATTR_PHASE] = str(split.indices.phase_of(i)).encode()
        return out

    def describe_file(i: int) -> str:
        try:
            gpt, k = split.locate(i)
        except Exception as exc:  # the blend or shuffle index itself is bad: say that
            return f" ({exc})"
        phase = f", phase {split.indices.phase_of(i)}" if phased else ""
        return f" (dataset {gpt.name}, its sample {k}{phase})"

    return View(sample_dir(split_name) if folder is None else folder, len(split), split.dtype, "split", split.c,
                mtime_ns,
                file_tokens=split.sample_tokens,
                xattr_names=(XATTR_DATASET, XATTR_PIECES) + ((XATTR_PHASE,) if phased else ()),
                xattrs=xattrs, keep=split, describe_file=describe_file)


def beyond_view(split_name: str, split: Any, mtime_ns: int) -> View:
    """The samples past a split's own that a restart phase's cyclic sampler reads (its
    relaunch's dataset is longer than its share of the run): `/<split>/beyond`, file f
    being the split's sample id len(split) + f (docs/phases.md)."""
    first = len(split)

    def xattrs(f: int) -> dict[str, bytes]:
        dataset, pieces = split.provenance(first + f)
        return {XATTR_DATASET: dataset.encode(),
                XATTR_PIECES: " ".join(f"{s}:{o}:{n}" for s, o, n in pieces).encode(),
                XATTR_PHASE: str(sample_phase(split.indices, first + f)).encode()}

    def describe_file(f: int) -> str:
        try:
            gpt, k = split.locate(first + f)
        except Exception as exc:  # the index itself is bad: say that
            return f" ({exc})"
        phase = sample_phase(split.indices, first + f)
        return f" (sample {first + f}: dataset {gpt.name}, its sample {k}, phase {phase})"

    return View(beyond_dir(split_name), split.beyond, split.dtype, "beyond", split.c, mtime_ns,
                file_tokens=split.sample_tokens, xattr_names=(XATTR_DATASET, XATTR_PIECES, XATTR_PHASE),
                xattrs=xattrs, keep=split, describe_file=describe_file)


def sequence_view(name: str, source: Any, mtime_ns: int) -> View:
    """A dataset's sequences, in its own dtype: `/datasets/<name>/sequences`."""
    ds = source.dataset
    return View(dataset_dir(name, SEQUENCES), int(ds.num_sequences), ds.dtype, "sequence",
                source.c, mtime_ns, total_tokens=lambda: ds.num_tokens, keep=source,
                describe_file=lambda i: f" (sequence {i} of {ds.path_prefix})")


def document_view(name: str, source: Any, mtime_ns: int) -> View:
    """A dataset's documents (their sequences concatenated): `/datasets/<name>/documents`."""
    ds = source.dataset
    return View(dataset_dir(name, DOCUMENTS), int(ds.num_documents), ds.dtype, "document",
                source.documents_c, mtime_ns, total_tokens=lambda: ds.num_tokens, keep=source,
                describe_file=lambda i: f" (document {i} of {ds.path_prefix})")


def microbatch_ids(plan_c: Any, rank: int, j: int) -> list[int]:
    """The sample ids of micro-batch file j of `rank`, by the C reader's own formula."""
    out = ffi.new("int64_t[]", max(plan_c.micro_batch_size, 1))
    rc = lib.mmfs_microbatch_ids(plan_c, rank, j, out)
    if rc < 0:
        raise NativeError(f"micro-batch {j} of rank {rank}: {error_detail(rc)}")
    return list(out[0:plan_c.micro_batch_size])


def microbatch_view(split_name: str, split: Any, plan: Any, plan_c: Any, rank: int, rank_width: int,
                    mtime_ns: int, folder: str | None = None, count: int | None = None) -> View:
    """Data-parallel rank `rank`'s micro-batches of a split, in the order
    Megatron's sampler hands them to it: `/<split>/ranks/<rank>` (or
    `<folder>/<rank>`, with `count` files, for a stream)."""
    c = ffi.new("mmfs_microbatches *")
    c.plan = plan_c
    c.split = split.c
    c.rank = rank

    def xattrs(j: int) -> dict[str, bytes]:
        return {XATTR_SAMPLES: " ".join(map(str, microbatch_ids(plan_c, rank, j))).encode()}

    path = rank_dir(split_name, rank, rank_width) if folder is None else f"{folder}/{rank:0{rank_width}d}"
    return View(path, plan.files_per_rank if count is None else count, split.dtype,
                "microbatch", c, mtime_ns, file_tokens=plan.micro_batch_size * split.sample_tokens,
                xattr_names=(XATTR_SAMPLES,), xattrs=xattrs, keep=(split, plan, plan_c),
                describe_file=lambda j: f" (rank {rank}, samples {microbatch_ids(plan_c, rank, j)})")


def _check_name(name: str, what: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise MountError(
            f"{what} {name!r} cannot be a directory name in the mount; give the dataset a "
            "`name:` without '/' in the config"
        )


def declare_views(corpus: Any, dataset_mtimes: dict[str, int], mtime_ns: int) -> list[View]:
    """Every view of a corpus: each split's samples, each dataset's documents
    and sequences, each rank's micro-batches."""
    views = [sample_view(name, split, mtime_ns) for name, split in corpus.splits.items()]
    views += [beyond_view(name, split, mtime_ns) for name, split in corpus.splits.items() if split.beyond]
    views += rank_views(corpus, mtime_ns)
    views += phase_views(corpus, mtime_ns)
    sources = {id(s.dataset): s for s in corpus.sources.values()}
    for entry in corpus.datasets:
        _check_name(entry.name, "dataset name")
        source, m = sources[id(entry.dataset)], dataset_mtimes[entry.name]
        views += [document_view(entry.name, source, m), sequence_view(entry.name, source, m)]
    return views


def phase_views(corpus: Any, mtime_ns: int) -> list[View]:
    """Under phase_mode restart: each phase's own valid and test, as its relaunch
    builds them, `/<split>/phases/<phase>/samples` and (with a `training:` block)
    `/<split>/phases/<phase>/ranks/<rank>`, as the split's own folders are."""
    phases = corpus.phase_splits
    width = phase_name_width(len(phases))
    training = corpus.config.training
    views = []
    for k, own in enumerate(phases):
        for name, split in own.items():
            folder = phase_dir(name, k, width)
            views.append(sample_view(name, split, mtime_ns, folder=f"{folder}/{SAMPLES}"))
            if training is None:
                continue
            plan = plan_splits(training, {name: len(split)})[name]
            if plan.files_per_rank == 0:
                continue
            plan_c = native_plan(plan, corpus.placer)
            rank_width = rank_name_width(training.data_parallel_size)
            views += [microbatch_view(name, split, plan, plan_c, rank, rank_width, mtime_ns, folder=f"{folder}/{RANKS}")
                      for rank in range(training.data_parallel_size)]
    return views


def stream_folders(corpus: Any) -> dict[str, Any]:
    """The folders that hold a `streams/` of any layout from any consumed_samples
    (docs/streams.md), each with the split its layouts read: every split's ("valid"),
    and under phase_mode restart each phase's own valid and test ("valid/phases/001"),
    which a relaunch reads from its carried consumed_valid_samples (docs/phases.md)."""
    training = corpus.config.training
    withheld = training is not None and training.hybrid_context_parallel  # train's: not what a rank trains on
    folders = {name: split for name, split in corpus.splits.items() if not (withheld and name == "train")}
    width = phase_name_width(len(corpus.phase_splits))
    for k, own in enumerate(corpus.phase_splits):
        folders.update({phase_dir(name, k, width).lstrip("/"): split for name, split in own.items()})
    return folders


def rank_views(corpus: Any, mtime_ns: int) -> list[View]:
    """With a `training:` block: every data-parallel rank's micro-batches of each
    split that has at least one micro-batch per rank."""
    training = corpus.config.training
    if training is None:
        return []
    plans = plan_splits(training, {name: len(split) for name, split in corpus.splits.items()})
    for name, split in corpus.splits.items():  # a phased run's cyclic samplers: one per phase
        phased = split_sampler(split.indices, *training.layout(name), training.data_parallel_size,
                               training.data_sharding)
        if phased is not None:
            plans[name] = phased.plan(0, whole_pass=False)
    width = rank_name_width(training.data_parallel_size)
    views = []
    for name, plan in plans.items():
        if plan.files_per_rank == 0 or (training.hybrid_context_parallel and name == "train"):
            continue  # hybrid context parallel: train's ranks are not what a rank trains on (manifest.py)
        plan_c = native_plan(plan, corpus.placer)
        views += [microbatch_view(name, corpus.splits[name], plan, plan_c, rank, width, mtime_ns)
                  for rank in range(training.data_parallel_size)]
    return views
