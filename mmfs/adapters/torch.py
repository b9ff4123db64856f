"""One data-parallel rank's stream of a mount as a torch IterableDataset.

    stream = RankStream(Mount("/mnt/data"), "train", rank=3, consumed_samples=4096)
    for batch in stream.batches(num_workers=2):   # a DataLoader over the stream
        ...                                       # tokens, labels, loss_mask, position_ids
        torch.save({"data": stream.state_dict(), ...}, "ckpt.pt")

The stream is the micro-batches Megatron's sampler (the mount's `training:` layout,
or another data_parallel_size / micro_batch_size given here) yields that rank from
`consumed_samples`, in the order Megatron's training loop reads them (`cyclic`: on
into later epochs, as cyclic_iter does). Each is megatron-core's batch (the fields
of Mount.megatron_batch) plus `sample_ids` and `consumed_samples`, the global count
after the step that reads it (and, in a run in phases, each train sample's `phase`).
The micro-batches are the files of the mount's stream folder for that layout and
consumed_samples (`<split>/streams/dp=D,mbs=M,from=C/RRR/`, docs/streams.md; for
`cyclic`, one folder an epoch; in a run in phases, one folder to the end of the last
phase's pass, each phase read by its own sampler), so any layout
and any consumed_samples Megatron would accept work. `phase=k` reads phase k's own
valid or test (phase_mode restart: `<split>/phases/<PPP>/streams/`), as that phase's
relaunch reads it from its consumed_valid_samples. Megatron's sampler (the
exact port in mmfs.megatron.sampling.samplers) is run here only to refuse, with its own
words, a consumed_samples it would refuse.

With DataLoader workers, worker w of W reads micro-batches w, w + W, ...; the
DataLoader hands them out round-robin, which is the stream's own order. The
consumed_samples that state_dict() holds is that of the last batch `batches()`
gave out (workers run ahead; what they fetched and nobody took is read again after
a load_state_dict()).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from mmfs.loader import LoaderError, Mount
from mmfs.megatron.sampling.phaseplan import PhaseSpan, phased_stream
from mmfs.megatron.sampling.samplers import SamplerError, training_stream


class RankStream(torch.utils.data.IterableDataset):
    """Megatron's micro-batches of one rank, from consumed_samples."""

    def __init__(self, mount: Mount, split: str = "train", rank: int = 0, *, consumed_samples: int = 0,
                 data_parallel_size: int | None = None, micro_batch_size: int | None = None,
                 dataloader_type: str | None = None, data_sharding: bool | None = None, phase: int | None = None,
                 **flags: bool) -> None:
        t = mount.training or {}
        self.mount, self.split, self.rank, self.flags, self.phase = mount, split, rank, flags, phase
        self.data_parallel_size = int(data_parallel_size or t.get("data_parallel_size") or 0)
        own = mount.layout(split) if t else ("single", 0)  # the split's own sampler (evaluation may have its own)
        self.micro_batch_size = int(micro_batch_size or own[1])
        if not self.data_parallel_size or not self.micro_batch_size:
            raise LoaderError(f"{mount.path}: give data_parallel_size and micro_batch_size (the mount has no "
                              "training section)")
        self.dataloader_type = dataloader_type or own[0]
        self.data_sharding = t.get("data_sharding", True) if data_sharding is None else data_sharding
        self.total = int(mount.samples.get(split, 0)) if phase is None else mount.split_samples(split, phase)
        self.load_state_dict({"consumed_samples": consumed_samples})

    @property
    def step(self) -> int:
        """Samples all ranks consume per micro-batch of one rank."""
        return self.micro_batch_size * self.data_parallel_size

    def state_dict(self) -> dict[str, int]:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        consumed = int(state["consumed_samples"])
        if consumed < 0:
            raise LoaderError(f"consumed_samples {consumed} is negative")
        # Megatron's own checks (the single sampler takes any count; the cyclic one a
        # multiple of micro_batch_size x data_parallel_size within the epoch), before
        # any worker starts.
        self._sampler(consumed)
        self.consumed_samples = consumed

    def _phase_spans(self) -> list[PhaseSpan] | None:
        """A run in phases read by the cyclic sampler: each phase's own (docs/phases.md)."""
        spans = self.mount.phase_spans(self.split)
        if spans is None or self.dataloader_type != "cyclic" or self.phase is not None:
            return None
        return [PhaseSpan(*span) for span in spans]

    def _sampler(self, consumed: int) -> Iterator[list[int]]:
        try:
            spans = self._phase_spans()
            stream = phased_stream(spans, consumed, self.micro_batch_size, self.rank, self.data_parallel_size,
                                   self.data_sharding) if spans else \
                training_stream(self.dataloader_type, self.total, consumed, self.micro_batch_size,
                                self.rank, self.data_parallel_size, self.data_sharding)
            first = next(stream, None)
        except SamplerError as exc:
            raise LoaderError(f"{self.split}: {exc}") from None
        return iter(()) if first is None else itertools.chain([first], stream)

    def _files(self, rank: int, consumed: int) -> list[str]:
        cyclic = self.dataloader_type == "cyclic"
        return self.mount.stream_files(self.split, rank, self.data_parallel_size, self.micro_batch_size,
                                       consumed, self.dataloader_type, self.data_sharding if cyclic else None,
                                       self.phase)

    def _segments(self, start: int) -> Iterator[list[str]]:
        """The rank's files of each stream folder it reads from `start`: one for
        `single` (to the end of the split), one an epoch for `cyclic`."""
        consumed = start
        while self.dataloader_type == "cyclic" or consumed < self.total:
            files = self._files(self.rank, consumed)
            yield files
            if self.dataloader_type != "cyclic" or not files:
                return
            # the rank's own sampler count (Megatron's cyclic sampler counts per rank: in an
            # unsharded pass that does not divide, ranks end it apart)
            consumed += len(files) * self.step

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        start = self.consumed_samples
        files = itertools.chain.from_iterable(self._segments(start))
        for k, path in itertools.islice(enumerate(files), worker, None, workers):
            batch = self.mount.microbatch_file(path, **self.flags)
            out = {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in batch.items()}
            out["consumed_samples"] = torch.tensor(start + (k + 1) * self.step, dtype=torch.int64)
            yield out

    def batches(self, **loader_args: Any) -> Iterator[dict[str, torch.Tensor]]:
        """Iterate a DataLoader over the stream (batch_size=None: the micro-batches as
        they are); state_dict() follows what it gave out."""
        loader = torch.utils.data.DataLoader(self, batch_size=None, **loader_args)
        for batch in loader:
            self.consumed_samples = int(batch["consumed_samples"])
            yield batch
