"""Read an mmfs mount from a training process: numpy only (no torch, no C core).

    m = Mount("/mnt/data")
    m.sample("train", 42)                      # tokens, in the mount's dtype
    m.megatron_item("train", 42)               # what megatron-core's GPTDataset[42] returns
    for batch in m.megatron_batches("train", rank=3, consumed_samples=4096):
        ...                                    # what Megatron's DataLoader gives rank 3

Everything comes from the files and `mmfs.json` (see README.md, "The mount"):
sample files `<split>/samples/NNNNNNN.bin`, micro-batch files
`<split>/ranks/RRR/NNNNNNN.bin` (the `training` section names their shape), and the
extended attributes `user.mmfs.pieces` (a sample's pieces) and `user.mmfs.samples`
(a micro-batch's sample ids). The arrays work as the source of a torch
Dataset / IterableDataset (torch.from_numpy) and with JAX (jnp.asarray).

`megatron_item` ports megatron-core 0.19.2's GPTDataset.__getitem__ (with
_get_ltor_masks_and_position_ids and the inter_document_masking path) to numpy,
with two facts a file of tokens does not carry by itself:
- a padded sample (the short last validation sample) holds the pad id in the
  mount's dtype, so pad -1 reads as 65535 in uint16, which is also a real token
  id there (an EOD of 65535, say). Where the two can collide (the pad does not
  survive the dtype), the sample's pieces say how many tokens are real;
- cu_seqlens counts the pieces (Megatron's per-"document" parts, which are the
  .idx sequences), read from `user.mmfs.pieces`.
Megatron caches the loss mask of a cacheable config (no eod_mask_loss, no reset_*)
and then zeroes pad positions in that very tensor, so in one Megatron process the
pad positions of the first sample it reads stay masked in later samples; mmfs
gives every sample its own mask (what Megatron gives a fresh dataset object).
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from mmfs.errors import MmfsError
from mmfs.mount import contract


class LoaderError(MmfsError):
    """The mount (or the question asked of it) does not fit: one line, what to do."""


# In a plain folder copy of some of a mount's files (for a machine without FUSE, see
# mmfs/adapters/megatron_copy.py): the extended attributes those files had on the
# mount, {path relative to the folder: {name: value}}, read where a file has none.
COPIED_ATTRIBUTES = "mmfs-attributes.json"


FLAGS = ("eod_mask_loss", "reset_position_ids", "reset_attention_mask", "create_attention_mask",
         "inter_document_masking")


def _whole(name: str, value: Any) -> int:
    """An id or count argument: an int (a bool is not one), at least 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LoaderError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise LoaderError(f"{name} must be 0 or more, got {value}")
    return int(value)


def _check_flags(flags: dict) -> None:
    unknown = set(flags) - set(FLAGS)
    if unknown:
        raise TypeError(f"unknown flag {sorted(unknown)[0]!r} (flags: {', '.join(FLAGS)})")


class Mount:
    """An mmfs mount (or a directory laid out like one), described by its mmfs.json."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        info_path = os.path.join(self.path, contract.MANIFEST)
        try:
            with open(info_path, encoding="utf-8") as f:
                self.info: dict[str, Any] = json.load(f)
        except FileNotFoundError:
            raise LoaderError(f"{info_path}: not found; is {self.path} an mmfs mount?") from None
        except (OSError, ValueError) as exc:
            raise LoaderError(f"{info_path}: cannot read it: {exc}") from None
        info = self.info
        self.dtype = np.dtype(info[contract.KEY_DTYPE]).newbyteorder("<")
        self.sequence_length = int(info[contract.KEY_SEQUENCE_LENGTH])
        self.tokens_per_sample = int(info[contract.KEY_TOKENS_PER_SAMPLE])
        self.add_extra_token = bool(info[contract.KEY_ADD_EXTRA_TOKEN])
        self.eod = info.get(contract.KEY_EOD)
        self.pad = int(info[contract.KEY_PAD])
        self.pad_in_dtype = int(np.array(self.pad).astype(self.dtype))
        self.samples: dict[str, int] = {k: int(v) for k, v in info[contract.KEY_SAMPLES].items()}
        self.training: dict[str, Any] | None = info.get(contract.KEY_TRAINING)
        # a run in phases (docs/phases.md): each phase's [start_sample, end_sample) of train
        self.phases: dict[str, Any] | None = info.get(contract.KEY_PHASES)
        self._phase_starts = [int(p["start_sample"]) for p in self.phases["phases"]] if self.phases else []
        self._copied = _copied_attributes(self.path)  # None for a mount

    # -- samples ----------------------------------------------------------------

    def _split(self, split: str) -> dict[str, Any]:
        if not isinstance(split, str) or split not in self.samples:
            raise LoaderError(f"{self.path}: no split {split!r} (the mount has {', '.join(self.samples)})")
        return self.info[contract.KEY_SPLITS][split]

    def phase(self, split: str, i: int) -> int | None:
        """The phase of sample i (an index into mmfs.json's phases.phases), or None
        where the split is not phased (valid, test, a run without phases)."""
        self._split(split)
        i = _whole("i", i)
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

    def sample_path(self, split: str, i: int) -> str:
        """The file of sample i: samples/, or for an id past them (below samples + beyond
        samples) its file in the split's beyond view."""
        s = self._split(split)
        i = _whole("i", i)
        n = self.samples[split]
        if i < n:
            return os.path.join(self.path, s[contract.KEY_PATH], contract.file_name(i, int(s[contract.KEY_NAME_WIDTH])))
        beyond = s.get(contract.KEY_BEYOND)
        if beyond is None or i >= n + int(beyond[contract.KEY_BEYOND_SAMPLES]):
            extra = 0 if beyond is None else int(beyond[contract.KEY_BEYOND_SAMPLES])
            raise LoaderError(f"{split}: sample {i} is outside [0, {n + extra})")
        return os.path.join(self.path, beyond[contract.KEY_PATH],
                            contract.file_name(i - n, int(beyond[contract.KEY_NAME_WIDTH])))

    def sample(self, split: str, i: int) -> np.ndarray:
        """Sample i's tokens, in the mount's dtype (pad positions hold the pad in that dtype)."""
        return np.frombuffer(_read(self.sample_path(split, i)), dtype=self.dtype)

    def pieces(self, split: str, i: int) -> list[tuple[int, int, int]]:
        """(sequence, offset, length) of each piece sample i was cut from."""
        text = self.attribute(self.sample_path(split, i), contract.XATTR_PIECES)
        return [tuple(int(x) for x in p.split(":")) for p in text.split()]

    def megatron_item(self, split: str, i: int, *, eod_mask_loss: bool = False, reset_position_ids: bool = False,
                      reset_attention_mask: bool = False, create_attention_mask: bool = False,
                      inter_document_masking: bool = False) -> dict[str, np.ndarray]:
        """megatron-core 0.19.2's GPTDataset.__getitem__(i) for this split, as numpy arrays
        (without `dataset_id`)."""
        flags = dict(eod_mask_loss=eod_mask_loss, reset_position_ids=reset_position_ids,
                     reset_attention_mask=reset_attention_mask, create_attention_mask=create_attention_mask,
                     inter_document_masking=inter_document_masking)
        raw = self.sample(split, i)[None, :]
        batch = self._items(raw, lambda _row: self.pieces(split, i), flags)
        return {k: v[0] for k, v in batch.items()}

    def megatron_batch(self, split: str, ids: list[int], **flags: bool) -> dict[str, np.ndarray]:
        """megatron_item of each of `ids`, stacked (read from the sample files): what
        Megatron's DataLoader collates for a batch of those samples."""
        _check_flags(flags)
        ids = [_whole(f"ids[{k}]", i) for k, i in enumerate(ids)]
        raw = np.stack([self.sample(split, i) for i in ids])
        return self._items(raw, lambda row: self.pieces(split, ids[row]), flags)

    # -- micro-batches of a data-parallel rank ----------------------------------------

    def _training(self) -> dict[str, Any]:
        if not self.training:
            raise LoaderError(f"{self.path}/mmfs.json has no `training` section: add a training: block "
                              "(data_parallel_size, micro_batch_size) to the config and mount again")
        return self.training

    def microbatches_per_rank(self, split: str) -> int:
        self._split(split)
        return int(self._training()[contract.KEY_MICROBATCHES].get(split, 0))

    def microbatch_path(self, split: str, rank: int, j: int) -> str:
        t = self._training()
        rank, j = _whole("rank", rank), _whole("j", j)
        dp = int(t[contract.KEY_DATA_PARALLEL_SIZE])
        if not rank < dp:
            raise LoaderError(f"rank {rank} is outside [0, {dp}) (data_parallel_size {dp})")
        files = self.microbatches_per_rank(split)
        if not 0 <= j < files:
            raise LoaderError(f"{split}: micro-batch {j} is outside the {files} of each rank")
        rank_dir = f"{rank:0{int(t[contract.KEY_RANK_NAME_WIDTH])}d}"
        name = contract.file_name(j, int(t[contract.KEY_MICROBATCH_NAME_WIDTH][split]))
        return os.path.join(self.path, t[contract.KEY_RANKS_PATH][split], rank_dir, name)

    def microbatch_samples(self, split: str, rank: int, j: int) -> list[int]:
        """The sample ids (of the split) in micro-batch j of `rank`."""
        ids = self.attribute(self.microbatch_path(split, rank, j), contract.XATTR_SAMPLES)
        return [int(x) for x in ids.split()]

    def _first_microbatch(self, split: str, rank: int, consumed_samples: int) -> int:
        t = self._training()
        rank, consumed_samples = _whole("rank", rank), _whole("consumed_samples", consumed_samples)
        step = int(t[contract.KEY_MICRO_BATCH_SIZE]) * int(t[contract.KEY_DATA_PARALLEL_SIZE])
        if consumed_samples % step:
            raise LoaderError(
                f"consumed_samples {consumed_samples} is not a multiple of micro_batch_size x "
                f"data_parallel_size = {step}; resume from a value Megatron saved"
            )
        dp = int(t[contract.KEY_DATA_PARALLEL_SIZE])
        if not 0 <= rank < dp:
            raise LoaderError(f"rank {rank} is outside [0, {dp}) (data_parallel_size {dp})")
        j = consumed_samples // step
        files = self.microbatches_per_rank(split)
        if j > files:
            raise LoaderError(
                f"{split}: consumed_samples {consumed_samples} is past the {files} micro-batches of each rank "
                f"({files * step} samples); the mount holds one pass of the sampler"
            )
        return j

    def microbatches(self, split: str, rank: int, consumed_samples: int = 0) -> Iterator[np.ndarray]:
        """`rank`'s micro-batches, [micro_batch_size, tokens_per_sample] in the mount's dtype,
        from the one a job resumed at consumed_samples reads first."""
        start = self._first_microbatch(split, rank, consumed_samples)
        mbs = int(self._training()[contract.KEY_MICRO_BATCH_SIZE])
        for j in range(start, self.microbatches_per_rank(split)):
            data = _read(self.microbatch_path(split, rank, j))
            yield np.frombuffer(data, dtype=self.dtype).reshape(mbs, self.tokens_per_sample)

    def megatron_batches(self, split: str, rank: int, consumed_samples: int = 0,
                         **flags: bool) -> Iterator[dict[str, np.ndarray]]:
        """The same micro-batches as dicts of stacked megatron_item fields: what
        Megatron's DataLoader gives `rank`."""
        _check_flags(flags)
        start = self._first_microbatch(split, rank, consumed_samples)
        for j, raw in enumerate(self.microbatches(split, rank, consumed_samples), start):
            ids: list[int] = []

            def pieces_of(row: int, j: int = j, ids: list[int] = ids) -> list[tuple[int, int, int]]:
                if not ids:
                    ids.extend(self.microbatch_samples(split, rank, j))
                return self.pieces(split, ids[row])

            yield self._items(raw, pieces_of, flags)

    # -- the stream of any layout from any consumed_samples (docs/streams.md) -----------

    def stream_dir(self, split: str, rank: int, data_parallel_size: int, micro_batch_size: int,
                   consumed_samples: int = 0, sampler: str | None = None, sharding: bool | None = None) -> str:
        """`rank`'s folder of the stream of a layout resumed at consumed_samples:
        MOUNT/<split>/streams/dp=D,mbs=M,from=C[,sampler=...][,sharding=...]/RRR."""
        self._split(split)
        dp = _whole("data_parallel_size", data_parallel_size)
        rank = _whole("rank", rank)
        if not rank < dp:
            raise LoaderError(f"rank {rank} is outside [0, {dp}) (data_parallel_size {dp})")
        name = contract.stream_name(dp, _whole("micro_batch_size", micro_batch_size),
                                    _whole("consumed_samples", consumed_samples), sampler, sharding)
        return os.path.join(self.path, contract.streams_dir(split).lstrip("/"), name,
                            f"{rank:0{contract.rank_name_width(dp)}d}")

    def stream_files(self, split: str, rank: int, data_parallel_size: int, micro_batch_size: int,
                     consumed_samples: int = 0, sampler: str | None = None,
                     sharding: bool | None = None) -> list[str]:
        """The micro-batch files of stream_dir(...), in order."""
        folder = self.stream_dir(split, rank, data_parallel_size, micro_batch_size, consumed_samples,
                                 sampler, sharding)
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(contract.FILE_SUFFIX))
        except FileNotFoundError:
            raise LoaderError(f"{folder}: no such stream (a layout Megatron's sampler refuses at that "
                              "consumed_samples; the mount's log says why)") from None
        except OSError as exc:
            raise LoaderError(f"{folder}: cannot list it: {exc.strerror or exc}") from None
        return [os.path.join(folder, n) for n in names]

    def microbatch_file(self, path: str, **flags: bool) -> dict[str, np.ndarray]:
        """A micro-batch file (of ranks/ or streams/) as megatron_batch of its samples,
        plus `sample_ids`, and in a run in phases the `phase` of each train sample."""
        _check_flags(flags)
        raw = np.frombuffer(_read(path), dtype=self.dtype).reshape(-1, self.tokens_per_sample)
        ids = [int(x) for x in self.attribute(path, contract.XATTR_SAMPLES).split()]
        if len(ids) != raw.shape[0]:
            raise LoaderError(f"{path}: {raw.shape[0]} samples but {len(ids)} ids in {contract.XATTR_SAMPLES}")
        split = os.path.relpath(path, self.path).split(os.sep)[0]
        batch = self._items(raw, lambda row: self.pieces(split, ids[row]), flags)
        batch["sample_ids"] = np.asarray(ids, dtype=np.int64)
        if split == "train" and self._phase_starts:
            batch["phase"] = np.asarray([self.phase(split, i) for i in ids], dtype=np.int64)
        return batch

    def attribute(self, path: str, name: str) -> str:
        """An extended attribute of a file of the mount (of a plain copy: from its
        mmfs-attributes.json where the file has none)."""
        try:
            return os.getxattr(path, name).decode()
        except OSError as exc:
            copied = (self._copied or {}).get(os.path.relpath(path, self.path), {}).get(name)
            if copied is not None:
                return copied
            raise LoaderError(f"{path}: cannot read its {name} attribute: {exc.strerror or exc}") from None

    # -- GPTDataset.__getitem__, for a stack of samples ---------------------------------

    def _text(self, raw: np.ndarray, pieces_of) -> np.ndarray:
        """Megatron's int64 text: the tokens, with pad positions holding the pad id itself."""
        text = raw.astype(np.int64)
        if self.pad_in_dtype != self.pad:  # the pad did not survive the dtype (-1 in uint16)
            # Padding fills a sample's tail, so only a sample ending in that value may be padded.
            for row in np.flatnonzero(raw[:, -1] == self.pad_in_dtype):
                real = sum(length for _s, _o, length in pieces_of(int(row)))
                text[row, real:] = self.pad
        return text

    def _items(self, raw: np.ndarray, pieces_of, flags: dict[str, bool]) -> dict[str, np.ndarray]:
        S, pad, eod = self.sequence_length, self.pad, self.eod
        text = self._text(raw, pieces_of)
        b = text.shape[0]
        if self.add_extra_token:
            tokens, labels = text[:, :-1].copy(), text[:, 1:].copy()
        else:
            tokens, labels = text.copy(), np.roll(text, -1, axis=1)
            labels[:, -1] = pad
        is_eod = np.zeros_like(tokens, dtype=bool) if eod is None else tokens == eod
        loss_mask = np.ones((b, S), dtype=np.float32)
        if flags.get("eod_mask_loss"):
            loss_mask[is_eod] = 0.0
        positions = np.broadcast_to(np.arange(S, dtype=np.int64), (b, S))
        # Where each position's document starts: one past the last EOD before it.
        reset_pos, reset_attn = flags.get("reset_position_ids"), flags.get("reset_attention_mask")
        if reset_pos or reset_attn:
            after_eod = np.zeros((b, S), dtype=np.int64)
            after_eod[:, 1:] = np.where(is_eod[:, :-1], np.arange(1, S, dtype=np.int64), 0)
            doc_start = np.maximum.accumulate(after_eod, axis=1)
        position_ids = positions - doc_start if reset_pos else positions.copy()
        loss_mask[labels == pad] = 0.0
        tokens[tokens == pad] = 0
        labels[labels == pad] = 0
        if flags.get("inter_document_masking"):
            cu_seqlens = np.full((b, S + 1), S, dtype=np.int32)
            max_seqlen = np.empty(b, dtype=np.int32)
            position_ids = position_ids.copy()
            for row in range(b):
                cu = self._cu_seqlens([length for _s, _o, length in pieces_of(row)])
                cu_seqlens[row, :len(cu)] = cu
                max_seqlen[row] = np.diff(cu).max()
                for start, end in zip(cu[:-1], cu[1:]):
                    position_ids[row, start:end] = np.arange(end - start)
            return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids,
                    "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen}
        if flags.get("create_attention_mask"):
            rows = np.arange(S)[:, None]
            cols = np.arange(S)[None, :]
            if reset_attn:  # attend to [start of own document, self]
                masked = (cols[None] > rows[None]) | (cols[None] < doc_start[:, :, None])
            else:
                masked = np.broadcast_to(cols > rows, (b, S, S))
            attention_mask = np.ascontiguousarray(masked)[:, None, :, :]
            return {"tokens": tokens, "labels": labels, "attention_mask": attention_mask,
                    "loss_mask": loss_mask, "position_ids": position_ids}
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}

    def _cu_seqlens(self, lengths: list[int]) -> np.ndarray:
        """Megatron's cu_seqlens of one sample from its parts' lengths (unpadded)."""
        lengths = list(lengths)
        if self.add_extra_token and lengths:
            lengths[-1] -= 1  # the extra token belongs to the labels only
            if lengths[-1] == 0:
                lengths.pop()
        shortfall = self.sequence_length - sum(lengths)
        if shortfall > 0:  # a padded sample: the padding joins the last part
            if lengths:
                lengths[-1] += shortfall
            else:
                lengths.append(shortfall)
        return np.cumsum([0, *lengths]).astype(np.int32)


def _read(path: str) -> bytearray:
    """The whole file, in a writable buffer (so arrays over it are writable, as
    torch.from_numpy wants)."""
    try:
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(os.fstat(f.fileno()).st_size)
            view, done = memoryview(buf), 0
            while done < len(buf):
                n = f.readinto(view[done:])
                if not n:
                    raise LoaderError(f"{path}: ended after {done} of {len(buf)} bytes")
                done += n
            return buf
    except OSError as exc:
        raise LoaderError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def _copied_attributes(folder: str) -> dict[str, dict[str, str]] | None:
    path = os.path.join(folder, COPIED_ATTRIBUTES)
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LoaderError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(table, dict):
        raise LoaderError(f"{path}: not a mapping of file paths to their attributes; copy the folder again")
    return table
