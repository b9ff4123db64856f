"""An mmfs mount (or a folder laid out like one, or a config served in this process)
as a training process reads it: samples, micro-batches of a rank, streams of any
layout, in GPTDataset's fields (mmfs.loader's doc says what it reads and how)."""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from mmfs.loader.copy_check import CopyManifest, open_copy, stream_numbers
from mmfs.loader.files import KernelFiles, LoaderError, attribute, open_files, read_file, whole
from mmfs.loader.getitem import SampleFields, check_flags
from mmfs.mount import contract


class Mount:
    """An mmfs mount (or a directory laid out like one), described by its mmfs.json.

    `path` may name a config file instead: its mount's files are then served in this
    process through the C core, the same bytes as a mount of it (mmfs/mount/inprocess.py),
    at paths CONFIG/<path in the mount>; `options` then are those of `mmfs mount -o` that
    apply in a process (map_limit_mb, open_files)."""

    def __init__(self, path: str | os.PathLike, options: str = "") -> None:
        self.path = os.fspath(path)
        self.files = open_files(self.path, options)  # the kernel's, or the in-process one of a config
        info_path = os.path.join(self.path, contract.MANIFEST)
        try:
            info_bytes = self.files.read(info_path)  # (unbuffered: no ioctl)
            self.info: dict[str, Any] = json.loads(info_bytes)
        except FileNotFoundError:
            raise LoaderError(f"{info_path}: not found; is {self.path} an mmfs mount (or a config file)?") from None
        except (OSError, ValueError) as exc:
            raise LoaderError(f"{info_path}: cannot read it: {exc}") from None
        # a plain folder copy's manifest (None for a mount or a config), checked before anything is read
        self.copy: CopyManifest | None = open_copy(self.path, bytes(info_bytes), self.files.copied) \
            if isinstance(self.files, KernelFiles) else None
        info = self.info
        self.dtype = np.dtype(info[contract.KEY_DTYPE]).newbyteorder("<")
        self.sequence_length = int(info[contract.KEY_SEQUENCE_LENGTH])
        self.tokens_per_sample = int(info[contract.KEY_TOKENS_PER_SAMPLE])
        self.add_extra_token = bool(info[contract.KEY_ADD_EXTRA_TOKEN])
        self.eod = info.get(contract.KEY_EOD)
        self.pad = int(info[contract.KEY_PAD])
        self.pad_in_dtype = int(np.array(self.pad).astype(self.dtype))
        self.fields = SampleFields(self.sequence_length, self.add_extra_token, self.eod, self.pad, self.pad_in_dtype)
        self.samples: dict[str, int] = {k: int(v) for k, v in info[contract.KEY_SAMPLES].items()}
        self.training: dict[str, Any] | None = info.get(contract.KEY_TRAINING)
        # a run in phases (docs/phases.md): each phase's [start_sample, end_sample) of train
        self.phases: dict[str, Any] | None = info.get(contract.KEY_PHASES)
        self._phase_starts = [int(p["start_sample"]) for p in self.phases["phases"]] if self.phases else []

    # -- samples ----------------------------------------------------------------

    def _split(self, split: str) -> dict[str, Any]:
        if not isinstance(split, str) or split not in self.samples:
            raise LoaderError(f"{self.path}: no split {split!r} (the mount has {', '.join(self.samples)})")
        return self.info[contract.KEY_SPLITS][split]

    def phase(self, split: str, i: int) -> int | None:
        """The phase of sample i (an index into mmfs.json's phases.phases), or None
        where the split is not phased (valid, test, a run without phases)."""
        self._split(split)
        i = whole("i", i)
        if split != "train" or not self._phase_starts:
            return None
        if i >= self.samples[split]:  # past the run's samples: a restart phase's own (docs/phases.md)
            for k, p in enumerate(self.phases["phases"]):
                first = int(p.get(contract.KEY_BEYOND_FIRST_ID, -1))
                if first <= i < first + int(p.get(contract.KEY_SAMPLER_SAMPLES, 0)) - int(p["samples"]):
                    return k
        return bisect.bisect_right(self._phase_starts, i) - 1

    def phase_spans(self, split: str) -> list[tuple[int, int, int, int]] | None:
        """Each phase as its own cyclic sampler reads it (docs/phases.md): (its first
        sample, its samples, the samples its sampler draws from, the id of its sample
        `samples` past the split's own); None where the split is not phased."""
        self._split(split)
        if split != "train" or not self.phases:
            return None
        return [(int(p["start_sample"]), int(p["samples"]), int(p[contract.KEY_SAMPLER_SAMPLES]),
                 int(p[contract.KEY_BEYOND_FIRST_ID])) for p in self.phases["phases"]]

    def beyond_samples(self, split: str) -> int:
        """How many ids past the split's samples its beyond view serves (a run in phases
        whose restart phases' own datasets are longer than their samples; docs/phases.md)."""
        return int(self._split(split).get(contract.KEY_BEYOND, {}).get(contract.KEY_BEYOND_SAMPLES, 0))

    def _entry(self, split: str, phase: int | None = None) -> dict[str, Any]:
        """mmfs.json's entry of a split, or (phase k) of phase k's own valid or test under
        phase_mode restart (docs/phases.md): its samples, paths and name widths."""
        if phase is None:
            return self._split(split)
        phases = (self.phases or {}).get("phases", [])
        k = whole("phase", phase)
        if k >= len(phases):
            raise LoaderError(f"{self.path}: phase {k} is outside the run's {len(phases)} phase(s)")
        entry = phases[k].get(contract.KEY_SPLITS, {}).get(split) if isinstance(split, str) else None
        if not entry or contract.KEY_PATH not in entry:
            raise LoaderError(f"{self.path}/mmfs.json: phase {k} has no {split!r} samples of its own (under "
                              "phase_mode restart each phase has its own valid and test; train is one split)")
        return entry

    def split_samples(self, split: str, phase: int | None = None) -> int:
        """The samples of a split (of phase `phase`'s own valid or test)."""
        return self.samples[split] if phase is None else int(self._entry(split, phase)[contract.KEY_SAMPLES])

    def sample_path(self, split: str, i: int, phase: int | None = None) -> str:
        """The file of sample i: samples/, or for an id past them (below samples + beyond
        samples) its file in the split's beyond view; phase k: of phase k's own split."""
        s = self._entry(split, phase)
        i = whole("i", i)
        n = self.split_samples(split, phase)
        if i < n:
            return os.path.join(self.path, s[contract.KEY_PATH], contract.file_name(i, int(s[contract.KEY_NAME_WIDTH])))
        beyond = s.get(contract.KEY_BEYOND)
        if beyond is None or i >= n + int(beyond[contract.KEY_BEYOND_SAMPLES]):
            extra = 0 if beyond is None else int(beyond[contract.KEY_BEYOND_SAMPLES])
            raise LoaderError(f"{split}: sample {i} is outside [0, {n + extra})")
        return os.path.join(self.path, beyond[contract.KEY_PATH],
                            contract.file_name(i - n, int(beyond[contract.KEY_NAME_WIDTH])))

    def sample(self, split: str, i: int, phase: int | None = None) -> np.ndarray:
        """Sample i's tokens, in the mount's dtype (pad positions hold the pad in that dtype)."""
        return self._rows(self.sample_path(split, i, phase), 1)[0]

    def pieces(self, split: str, i: int, phase: int | None = None) -> list[tuple[int, int, int]]:
        """(sequence, offset, length) of each piece sample i was cut from."""
        text = self.attribute(self.sample_path(split, i, phase), contract.XATTR_PIECES)
        return [tuple(int(x) for x in p.split(":")) for p in text.split()]

    def megatron_item(self, split: str, i: int, *, eod_mask_loss: bool = False, reset_position_ids: bool = False,
                      reset_attention_mask: bool = False, create_attention_mask: bool = False,
                      inter_document_masking: bool = False, phase: int | None = None) -> dict[str, np.ndarray]:
        """megatron-core 0.19.2's GPTDataset.__getitem__(i) for this split (phase k: for
        phase k's own valid or test dataset), as numpy arrays (without `dataset_id`)."""
        flags = dict(eod_mask_loss=eod_mask_loss, reset_position_ids=reset_position_ids,
                     reset_attention_mask=reset_attention_mask, create_attention_mask=create_attention_mask,
                     inter_document_masking=inter_document_masking)
        raw = self.sample(split, i, phase)[None, :]
        batch = self.fields.items(raw, lambda _row: self.pieces(split, i, phase), flags)
        return {k: v[0] for k, v in batch.items()}

    def megatron_batch(self, split: str, ids: list[int], phase: int | None = None,
                       **flags: bool) -> dict[str, np.ndarray]:
        """megatron_item of each of `ids`, stacked (read from the sample files): what
        Megatron's DataLoader collates for a batch of those samples."""
        check_flags(flags)
        ids = [whole(f"ids[{k}]", i) for k, i in enumerate(ids)]
        raw = np.stack([self.sample(split, i, phase) for i in ids])
        return self.fields.items(raw, lambda row: self.pieces(split, ids[row], phase), flags)

    # -- micro-batches of a data-parallel rank ----------------------------------------

    def _training(self) -> dict[str, Any]:
        if not self.training:
            raise LoaderError(f"{self.path}/mmfs.json has no `training` section: add a training: block "
                              "(data_parallel_size, micro_batch_size) to the config and mount again")
        return self.training

    def _rank_files(self, split: str, phase: int | None) -> tuple[str | None, int, int]:
        """(the folder of the rank folders, files per rank, their name width) of ranks/."""
        t = self._training()
        if phase is None:
            self._split(split)
            return (t[contract.KEY_RANKS_PATH].get(split), int(t[contract.KEY_MICROBATCHES].get(split, 0)),
                    int(t[contract.KEY_MICROBATCH_NAME_WIDTH].get(split, contract.MIN_NAME_WIDTH)))
        e = self._entry(split, phase)
        return (e.get(contract.KEY_RANKS_PATH), int(e.get(contract.KEY_MICROBATCHES, 0)),
                int(e.get(contract.KEY_MICROBATCH_NAME_WIDTH, contract.MIN_NAME_WIDTH)))

    def layout(self, split: str) -> tuple[str, int]:
        """(dataloader_type, micro_batch_size) of the sampler that reads `split`
        (evaluation may have its own: Megatron-Bridge, docs/bridge.md)."""
        t = self._training()
        own = t.get(contract.KEY_SPLIT_LAYOUTS, {}).get(split, {})
        return (str(own.get("dataloader_type", t.get("dataloader_type", "single"))),
                int(own.get(contract.KEY_MICRO_BATCH_SIZE, t[contract.KEY_MICRO_BATCH_SIZE])))

    def micro_batch_size(self, split: str) -> int:
        """The micro-batch size `split` is read in."""
        return self.layout(split)[1]

    def microbatches_per_rank(self, split: str, phase: int | None = None) -> int:
        return self._rank_files(split, phase)[1]

    def microbatch_path(self, split: str, rank: int, j: int, phase: int | None = None) -> str:
        t = self._training()
        rank, j = whole("rank", rank), whole("j", j)
        dp = int(t[contract.KEY_DATA_PARALLEL_SIZE])
        if not rank < dp:
            raise LoaderError(f"rank {rank} is outside [0, {dp}) (data_parallel_size {dp})")
        folder, files, width = self._rank_files(split, phase)
        if not 0 <= j < files:
            raise LoaderError(f"{split}: micro-batch {j} is outside the {files} of each rank")
        rank_dir = f"{rank:0{int(t[contract.KEY_RANK_NAME_WIDTH])}d}"
        return os.path.join(self.path, folder, rank_dir, contract.file_name(j, width))

    def microbatch_samples(self, split: str, rank: int, j: int, phase: int | None = None) -> list[int]:
        """The sample ids (of the split) in micro-batch j of `rank`."""
        ids = self.attribute(self.microbatch_path(split, rank, j, phase), contract.XATTR_SAMPLES)
        return [int(x) for x in ids.split()]

    def _first_microbatch(self, split: str, rank: int, consumed_samples: int, phase: int | None) -> int:
        t = self._training()
        rank, consumed_samples = whole("rank", rank), whole("consumed_samples", consumed_samples)
        step = self.micro_batch_size(split) * int(t[contract.KEY_DATA_PARALLEL_SIZE])
        if consumed_samples % step:
            raise LoaderError(
                f"consumed_samples {consumed_samples} is not a multiple of micro_batch_size x "
                f"data_parallel_size = {step}; resume from a value Megatron saved"
            )
        dp = int(t[contract.KEY_DATA_PARALLEL_SIZE])
        if not 0 <= rank < dp:
            raise LoaderError(f"rank {rank} is outside [0, {dp}) (data_parallel_size {dp})")
        j = consumed_samples // step
        files = self.microbatches_per_rank(split, phase)
        if j > files:
            raise LoaderError(
                f"{split}: consumed_samples {consumed_samples} is past the {files} micro-batches of each rank "
                f"({files * step} samples); the mount holds one pass of the sampler"
            )
        return j

    def microbatches(self, split: str, rank: int, consumed_samples: int = 0,
                     phase: int | None = None) -> Iterator[np.ndarray]:
        """`rank`'s micro-batches, [micro_batch_size, tokens_per_sample] in the mount's dtype,
        from the one a job resumed at consumed_samples reads first (phase k: of phase k's
        own valid or test)."""
        start = self._first_microbatch(split, rank, consumed_samples, phase)
        mbs = self.micro_batch_size(split)
        for j in range(start, self.microbatches_per_rank(split, phase)):
            yield self._rows(self.microbatch_path(split, rank, j, phase), mbs)

    def _rows(self, path: str, rows: int | None) -> np.ndarray:
        """A file of samples, [rows, tokens_per_sample] (rows None: as many as it holds),
        refused in one line where it is cut short (or, in a copy, altered)."""
        data = read_file(self.files, path)
        if self.copy is not None:
            self.copy.check_bytes(path, data)
        row = self.tokens_per_sample * self.dtype.itemsize
        if not data or len(data) % row or (rows is not None and len(data) != rows * row):
            want = f"{rows} samples of {row} bytes" if rows is not None else f"whole samples of {row} bytes"
            raise LoaderError(f"{path}: {len(data)} bytes, not {want}: cut short or not a file of this mount's "
                              "samples; mount again (a copy: copy it again)")
        return np.frombuffer(data, dtype=self.dtype).reshape(-1, self.tokens_per_sample)

    def megatron_batches(self, split: str, rank: int, consumed_samples: int = 0, phase: int | None = None,
                         **flags: bool) -> Iterator[dict[str, np.ndarray]]:
        """The same micro-batches as dicts of stacked megatron_item fields: what
        Megatron's DataLoader gives `rank` (phase k: what phase k's relaunch's loader of
        its own valid or test gives it, on the config's layout; streams for any other)."""
        check_flags(flags)
        start = self._first_microbatch(split, rank, consumed_samples, phase)
        for j, raw in enumerate(self.microbatches(split, rank, consumed_samples, phase), start):
            ids: list[int] = []

            def pieces_of(row: int, j: int = j, ids: list[int] = ids) -> list[tuple[int, int, int]]:
                if not ids:
                    ids.extend(self.microbatch_samples(split, rank, j, phase))
                return self.pieces(split, ids[row], phase)

            yield self.fields.items(raw, pieces_of, flags)

    # -- the stream of any layout from any consumed_samples (docs/streams.md) -----------

    def stream_dir(self, split: str, rank: int, data_parallel_size: int, micro_batch_size: int,
                   consumed_samples: int = 0, sampler: str | None = None, sharding: bool | None = None,
                   phase: int | None = None) -> str:
        """`rank`'s folder of the stream of a layout resumed at consumed_samples:
        MOUNT/<split>/streams/dp=D,mbs=M,from=C[,sampler=...][,sharding=...]/RRR (phase k:
        of phase k's own valid or test, MOUNT/<split>/phases/<k>/streams/...)."""
        entry = self._entry(split, phase)
        dp = whole("data_parallel_size", data_parallel_size)
        rank = whole("rank", rank)
        if not rank < dp:
            raise LoaderError(f"rank {rank} is outside [0, {dp}) (data_parallel_size {dp})")
        name = contract.stream_name(dp, whole("micro_batch_size", micro_batch_size),
                                    whole("consumed_samples", consumed_samples), sampler, sharding)
        folder = contract.streams_dir(split).lstrip("/") if phase is None else entry.get(contract.KEY_STREAMS_PATH)
        if folder is None:
            raise LoaderError(f"{self.path}/mmfs.json: phase {phase}'s {split} names no streams_path: mount it "
                              "with this version of mmfs")
        return os.path.join(self.path, folder, name, f"{rank:0{contract.rank_name_width(dp)}d}")

    def stream_files(self, split: str, rank: int, data_parallel_size: int, micro_batch_size: int,
                     consumed_samples: int = 0, sampler: str | None = None,
                     sharding: bool | None = None, phase: int | None = None) -> list[str]:
        """The micro-batch files of stream_dir(...), in order."""
        folder = self.stream_dir(split, rank, data_parallel_size, micro_batch_size, consumed_samples,
                                 sampler, sharding, phase)
        try:
            names = stream_numbers(folder, self.files.listdir(folder))
        except FileNotFoundError as exc:
            if (exc.strerror or "").startswith("no such stream: "):  # in-process: the reason the daemon logs
                raise LoaderError(f"{folder}: {exc.strerror}") from None
            if self.copy is not None:
                raise LoaderError(f"{folder}: not in the copy: the job reads a stream the copy was not made for "
                                  "(another data-parallel size, micro-batch size or consumed count); copy it with "
                                  "this job's reads (mmfs.adapters.megatron_copy.copy_job_files)") from None
            raise LoaderError(f"{folder}: no such stream (a layout Megatron's sampler refuses at that "
                              "consumed_samples; the mount's log says why)") from None
        except OSError as exc:
            raise LoaderError(f"{folder}: cannot list it: {exc.strerror or exc}") from None
        if self.copy is not None:
            self.copy.check_stream(folder, names, self.files.copied or {})
        return [os.path.join(folder, n) for n in names]

    def microbatch_file(self, path: str, **flags: bool) -> dict[str, np.ndarray]:
        """A micro-batch file (of ranks/ or streams/, a restart phase's own valid or test's
        too) as megatron_batch of its samples, plus `sample_ids`, and in a run in phases
        the `phase` of each train sample."""
        check_flags(flags)
        raw = self._rows(path, None)
        ids = [int(x) for x in self.attribute(path, contract.XATTR_SAMPLES).split()]
        if len(ids) != raw.shape[0]:
            raise LoaderError(f"{path}: {raw.shape[0]} samples but {len(ids)} ids in {contract.XATTR_SAMPLES}")
        split, phase = self.folder_of(path)
        batch = self.fields.items(raw, lambda row: self.pieces(split, ids[row], phase), flags)
        batch["sample_ids"] = np.asarray(ids, dtype=np.int64)
        if split == "train" and self._phase_starts:
            batch["phase"] = np.asarray([self.phase(split, i) for i in ids], dtype=np.int64)
        return batch

    def folder_of(self, path: str) -> tuple[str, int | None]:
        """(split, phase or None) of a file of the mount: <split>/... or <split>/phases/<k>/..."""
        parts = os.path.relpath(path, self.path).split(os.sep)
        if len(parts) > 3 and parts[1] == contract.PHASES and parts[2].isdigit():
            return parts[0], int(parts[2])
        return parts[0], None

    def attribute(self, path: str, name: str) -> str:
        """An extended attribute of a file of the mount (of a plain copy: from its
        mmfs-attributes.json where the file has none)."""
        return attribute(self.files, path, name)
