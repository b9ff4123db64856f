"""Reading samples: training-order sample i -> (GPTDataset, unshuffled sample) ->
tokens. The C core does every step (blend lookup, shuffle, the tail of one
sequence, whole middle sequences, the head of the last, padding, dtype
conversion); this module describes the arrays to it and keeps them alive.
"""

from __future__ import annotations

import itertools

import numpy as np

from mmfs.errors import NativeError
from mmfs.formats.dtypes import native_code
from mmfs.megatron.arrays import ArrayPlacer
from mmfs.megatron.build.builder import GptIndices, SplitIndices
from mmfs.megatron.phases.sampling import beyond_runs
from mmfs.native import check, ffi, lib


class TokenSource:
    """The C view (mmfs_source) of one opened dataset."""

    def __init__(self, dataset, placer: ArrayPlacer) -> None:
        self.dataset = dataset
        self._placer = placer  # owns the file descriptors pread uses
        c = ffi.new("mmfs_source *")
        c.dtype = native_code(dataset.dtype)
        self._keep = (
            self._place(c.bytes, "tokens"),
            self._place(c.lengths, "sequence_lengths"),
            self._place(c.pointers, "sequence_pointers"),
        )
        self.c = c
        # Its documents: sequence ranges, or (a .pbin) one sequence each.
        docs = ffi.new("mmfs_documents *")
        docs.source = c
        if "document_indices" in dataset.arrays:  # else every document is one sequence
            self._bounds = self._place(docs.bounds, "document_indices")
        self.documents_c = docs

    def _place(self, c, name: str):
        """A dataset's array placed as its source holds it: where it lies in a file,
        unmapped (the placer maps, copies or preads it), in memory, or fetched on demand."""
        spec = self.dataset.arrays[name]
        return self._placer.place_source(c, spec.source, spec.offset, spec.dtype, spec.count)


def place_indices(placer: ArrayPlacer, structs: tuple, indices, names: tuple[str, ...]) -> tuple:
    """Index arrays placed as their indices hold them (the arrays the structs point
    into, to keep); those a record gives (still in their cache files,
    cache/resolved.py) are placed from the record's facts, no object each."""
    facts = indices.recorded(names)
    if facts is None:
        return tuple(placer.place(c, indices.raw(name)) for c, name in zip(structs, names))
    return tuple(placer.place_file(c, *fact) for c, fact in zip(structs, facts))


GPT_NAMES = ("document_index", "sample_index", "shuffle_index")
BLEND_NAMES = ("dataset_index", "dataset_sample_index")


_serials = itertools.count(1)  # one per mmfs_gpt struct: see its `serial`


class GptReader:
    """One GPTDataset of a split: its indices described in `c` (an mmfs_gpt)."""

    def __init__(self, gpt: GptIndices, source: TokenSource, c, placer: ArrayPlacer) -> None:
        self.gpt = gpt
        self.source = source
        self.name = gpt.spec.name
        self.length = len(gpt)
        c.source = source.c
        c.extra = gpt.params.extra
        c.serial = next(_serials)
        self._keep = place_indices(placer, (c.doc_index, c.sample_index, c.shuffle_index), gpt, GPT_NAMES)
        self.c = c

    def pieces(self, k: int) -> list[tuple[int, int, int]]:
        """(sequence id, token offset, length) of each piece of unshuffled sample k."""
        room = 16
        while True:
            out = ffi.new("int64_t[]", 3 * room)
            n = check(lib.mmfs_sample_pieces(self.c, k, out, room), f"{self.name}: sample {k}")
            if n <= room:
                return [(out[3 * p], out[3 * p + 1], out[3 * p + 2]) for p in range(n)]
            room = n


class SplitReader:
    """The samples of one split, in training order (shuffled, blended)."""

    def __init__(self, indices: SplitIndices, sources: dict, dtype: np.dtype,
                 sample_tokens: int, pad: int, placer: ArrayPlacer) -> None:
        self.name = indices.name
        self.indices = indices
        self.dtype = np.dtype(dtype)
        self.sample_tokens = sample_tokens
        self.sample_bytes = sample_tokens * self.dtype.itemsize
        self.pad = pad
        self.length = len(indices)
        self._placer = placer  # owns the file descriptors pread uses
        gpts_c = ffi.new("mmfs_gpt[]", len(indices.gpts))
        self.gpts = [GptReader(g, sources[g.spec.file], ffi.addressof(gpts_c, d), placer)
                     for d, g in enumerate(indices.gpts)]
        c = ffi.new("mmfs_split *")
        c.gpts = gpts_c
        c.num_gpts = len(self.gpts)
        c.num_samples = self.length
        c.sample_tokens = sample_tokens
        c.pad = pad
        c.out_dtype = native_code(self.dtype)
        blend = indices.blend
        self._keep = (gpts_c,) if blend is None else (
            gpts_c, place_indices(placer, (c.dataset_index, c.dataset_sample_index), blend, BLEND_NAMES))
        # A restart phase's dataset past its samples (phases/sampling.py): ids from self.length on.
        runs = beyond_runs(indices)
        self.beyond = sum(count for _, count, _, _ in runs)
        if runs:
            runs_c = ffi.new("mmfs_sample_run[]", len(runs))
            for r, (first, count, gpt, sample) in zip(runs_c, runs):
                r.first, r.count, r.gpt, r.sample = first, count, gpt, sample
            c.beyond, c.num_beyond, c.beyond_samples = runs_c, len(runs), self.beyond
            self._keep += (runs_c,)
        self.c = c

    def __len__(self) -> int:
        return self.length

    def locate(self, i: int) -> tuple[GptReader, int]:
        """(GPTDataset, unshuffled sample id) of training-order sample i (or of one past
        the split's own samples: the beyond view's, below length + beyond)."""
        if not 0 <= i < self.length + self.beyond:
            raise IndexError(f"{self.name}: sample {i} out of range [0, {self.length + self.beyond})")
        d, k = ffi.new("int32_t *"), ffi.new("int64_t *")
        rc = lib.mmfs_locate(self.c, i, d, k)
        if rc == lib.MMFS_E_INDEX_RANGE:
            raise NativeError(
                f"{self.name}: sample {i}: its blend or shuffle index entry is out of range; "
                "the index cache is corrupt: delete it and remount"
            )
        check(rc, f"{self.name}: sample {i}")
        return self.gpts[d[0]], k[0]

    def read_to_address(self, i: int, address) -> None:
        """Write sample i (sample_bytes bytes) at a C address (int or cdata pointer)."""
        rc = lib.mmfs_read_split_sample(self.c, i, ffi.cast("void *", address))
        if rc < 0:
            gpt, k = self.locate(i)  # raises the clearer message when the blend is at fault
            check(rc, f"{self.name}: sample {i} ({gpt.name}, unshuffled {k})")

    def read_into(self, i: int, buffer) -> None:
        """Write sample i into a writable buffer of at least sample_bytes bytes."""
        view = ffi.from_buffer(buffer, require_writable=True)
        if len(view) < self.sample_bytes:
            raise ValueError(f"buffer of {len(view)} bytes < {self.sample_bytes}")
        if not 0 <= i < self.length + self.beyond:
            raise IndexError(f"{self.name}: sample {i} out of range [0, {self.length + self.beyond})")
        self.read_to_address(i, view)

    def read(self, i: int) -> bytes:
        buf = bytearray(self.sample_bytes)
        self.read_into(i, buf)
        return bytes(buf)

    def tokens(self, i: int) -> np.ndarray:
        buf = bytearray(self.sample_bytes)
        self.read_into(i, buf)
        return np.frombuffer(buf, dtype=self.dtype)

    def provenance(self, i: int) -> tuple[str, list[tuple[int, int, int]]]:
        """(dataset name, [(sequence id, token offset, length), ...]) of sample i."""
        gpt, k = self.locate(i)
        return gpt.name, gpt.pieces(k)
