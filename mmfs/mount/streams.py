"""`<split>/streams/`: the micro-batches of any layout from any consumed_samples.

    <split>/streams/dp=<D>,mbs=<M>,from=<C>[,sampler=single|cyclic][,sharding=true|false]/<RRR>/<NNNNNNN>.bin

(and under phase_mode restart `<split>/phases/<PPP>/streams/...`: a phase's own valid
or test, as its relaunch's loader reads it; declarations.stream_folders lists them).

File j of rank folder RRR is the j-th micro-batch Megatron's sampler, built with
data_parallel_size D, micro_batch_size M and consumed_samples C, yields to that
rank in one pass: to the end of the split (single) or of the current epoch
(cyclic). In a run in phases under cyclic, each phase has its own sampler
(sampling/phaseplan.py): the rest of C's phase, each later phase, the last one's
pass. The sampler defaults to the `training:` block's (else single), sharding
to its data_sharding (else Megatron's default, true).

A layout folder exists when it is looked up (the streams folder lists nothing).
Each is a view per rank, read by the C micro-batch reader on a plan that starts
at C. The first lookup of a layout comes to Python, which makes it and hands the
views of every layout held to the C handlers (`on_change`); from then on they
serve it without Python. At most MAX_LAYOUTS are held, and beyond the one just
made at most MAX_PERMUTATION_BYTES of their permutations: the least recently used
(by Python's lookups and the C handlers' stamps) is dropped. A name that is not this spelling, or a layout
Megatron's sampler refuses, is not there (ENOENT) and the daemon logs why, once
per name.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mmfs.config.training import MAX_DATA_PARALLEL_SIZE
from mmfs.megatron.phases.sampling import split_sampler
from mmfs.megatron.sampling.rankplan import RankPlan, native_plan, plan_stream
from mmfs.megatron.sampling.samplers import SamplerError
from mmfs.mount.contract import STREAM_NAME, STREAM_NAME_HELP, name_width, rank_name_width, streams_dir
from mmfs.mount.declarations import microbatch_view, stream_folders
from mmfs.mount.views import Registry, View
from mmfs.native import ffi, lib

log = logging.getLogger(__name__)

MAX_LAYOUTS = 16  # layouts held at once (each holds its epoch's permutation)
MAX_PERMUTATION_BYTES = 512 << 20  # 4 bytes a sample: 16 layouts of an 8M-sample split
MAX_LOGGED = 1024  # refused names remembered, so that each is logged once


@dataclass(frozen=True)
class Layout:
    """A parsed layout folder name."""

    data_parallel_size: int
    micro_batch_size: int
    consumed: int
    dataloader_type: str
    data_sharding: bool
    global_batch_size: int = 0  # batch: the split's global batch (the config's)
    seed: int = 0  # batch: the config's seed


def parse_layout(name: str, training: Any, split: str = "train") -> Layout:
    """The layout a folder name spells (SamplerError why not). training: the
    config's TrainingConfig or None, for the defaults (the sampler that reads `split`)."""
    m = STREAM_NAME.fullmatch(name)
    if m is None:
        raise SamplerError(f"not a stream layout: the name is {STREAM_NAME_HELP} (decimal numbers, no "
                           "leading zeros)")
    dp, mbs, consumed = int(m["dp"]), int(m["mbs"]), int(m["consumed"])
    if not 1 <= dp <= MAX_DATA_PARALLEL_SIZE:
        raise SamplerError(f"dp={dp}: data_parallel_size must be 1 to {MAX_DATA_PARALLEL_SIZE}")
    if mbs < 1:
        raise SamplerError("mbs=0: micro_batch_size must be at least 1")
    sampler = m["sampler"] or (training.layout(split)[0] if training is not None else "single")
    if m["sharding"] and sampler != "cyclic":
        raise SamplerError("sharding= applies only to the cyclic sampler")
    sharding = m["sharding"] == "true" if m["sharding"] else (training.data_sharding if training is not None else True)
    if sampler == "batch":  # Megatron-Bridge's: the config's global batch and seed
        if training is None:
            raise SamplerError("sampler=batch needs the config's training: block (its global batch size)")
        return Layout(dp, mbs, consumed, sampler, sharding, training.split_batch_size(split), training.batch_seed)
    return Layout(dp, mbs, consumed, sampler, sharding)


class Streams:
    """The stream layouts of a mount's splits, made on lookup, LRU-bounded."""

    def __init__(self, corpus: Any, mtime_ns: int) -> None:
        self.corpus = corpus
        self.training = corpus.config.training
        self.mtime_ns = mtime_ns
        self.folders = stream_folders(corpus)  # "valid", "valid/phases/001", ...: the split each reads
        self._layouts: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._refused: OrderedDict[tuple[str, str], str] = OrderedDict()  # -> why
        self._lock = threading.Lock()
        # The views of every layout held, as the C handlers serve them, and
        # their use stamps (mmfs_fuse_tick's clock, written by C).
        self.registry = Registry([])
        self.used = ffi.new("int64_t[]", 1)
        self.on_change: Callable[[Registry, Any], None] | None = None

    def layout(self, folder: str, name: str) -> StreamLayout | None:
        """The layout folder `name` of the streams of `folder` (a key of self.folders:
        "train", "valid/phases/001"), or None (logged once) if there is none."""
        split = self.folders.get(folder)
        if split is None:
            return None
        key = (folder, name)
        with self._lock:
            held = self._layouts.get(key)
            if held is not None:
                held.touched = lib.mmfs_fuse_tick()
                return held
            if key in self._refused:
                return None
        try:
            layout = parse_layout(name, self.training, folder.split("/")[0])
            if layout.micro_batch_size > len(split):
                raise SamplerError(f"mbs={layout.micro_batch_size} is above the split's {len(split)} samples")
            made = StreamLayout(folder, name, split, layout, self.mtime_ns)
        except SamplerError as exc:
            with self._lock:
                if key not in self._refused:
                    log.warning("%s/%s: no such stream: %s", streams_dir(folder), name, exc)
                    self._refused[key] = str(exc)
                    if len(self._refused) > MAX_LOGGED:
                        self._refused.popitem(last=False)
            return None
        with self._lock:
            held = self._layouts.setdefault(key, made)
            held.touched = lib.mmfs_fuse_tick()
            if held is made:
                while self._too_many():
                    del self._layouts[min(self._layouts, key=self._last_use)]
                self._publish()
            return held

    def refusal(self, folder: str, name: str) -> str | None:
        """Why layout folder `name` of `folder` is not there, if it was refused (and is
        still remembered)."""
        with self._lock:
            return self._refused.get((folder, name))

    def find_view(self, path: str) -> tuple[Registry, View] | None:
        """The view of a held layout's rank folder at `path`, with its layout's own
        registry (which keeps it alive and readable once the layout is dropped)."""
        with self._lock:
            for layout in self._layouts.values():
                view = layout.registry.by_path.get(path)
                if view is not None:
                    return layout.registry, view
        return None

    def _too_many(self) -> bool:
        if len(self._layouts) > MAX_LAYOUTS:
            return True
        held = sum(map(_held_bytes, self._layouts.values()))
        return len(self._layouts) > 1 and held > MAX_PERMUTATION_BYTES

    def _last_use(self, key: tuple[str, str]) -> int:
        layout = self._layouts[key]
        index = self.registry.index
        used = [self.used[index[id(v)]] for v in layout.registry.views if id(v) in index]
        return max([layout.touched, *used])

    def _publish(self) -> None:
        """Hand the views of the layouts held to the C handlers (if serving)."""
        views = [v for layout in self._layouts.values() for v in layout.registry.views]
        registry = Registry(views)
        used = ffi.new("int64_t[]", max(len(views), 1))
        if self.on_change is not None:
            self.on_change(registry, used)
        self.registry, self.used = registry, used  # the old ones unused by C from here


def _held_bytes(layout: StreamLayout) -> int:
    return layout.plan.permutation_bytes


class StreamLayout:
    """One layout folder: a view per rank over a plan that starts at C."""

    def __init__(self, folder: str, name: str, split: Any, layout: Layout, mtime_ns: int) -> None:
        self.path = f"{streams_dir(folder)}/{name}"
        phased = split_sampler(split.indices, layout.dataloader_type, layout.micro_batch_size,
                               layout.data_parallel_size, layout.data_sharding)
        self.plan: RankPlan = phased.plan(layout.consumed) if phased is not None else \
            plan_stream(len(split), layout.micro_batch_size, layout.data_parallel_size, layout.consumed,
                        layout.dataloader_type, layout.data_sharding, layout.global_batch_size, layout.seed)
        self.plan_c = native_plan(self.plan)
        dp = layout.data_parallel_size
        width = rank_name_width(dp)
        self.rank_names = [f"{r:0{width}d}" for r in range(dp)]
        views: list[View] = []
        for rank in range(dp):
            view = microbatch_view(folder, split, self.plan, self.plan_c, rank, width, mtime_ns,
                                   folder=self.path, count=self.plan.files_of(rank))
            view.width = name_width(self.plan.files_per_rank)  # one width for every rank
            views.append(view)
        self.registry = Registry(views)
        self.touched = 0
