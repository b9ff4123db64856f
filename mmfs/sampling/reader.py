"""Reading samples: top-level sample i -> (GPTDataset, unshuffled sample) -> tokens,
assembled by the C core (tail of one sequence, whole middle sequences, head of
the last, then padding), converted to the mount's dtype.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import NativeError
from ..formats.dtypes import native_code
from ..native import check, ffi, lib
from .builder import GptIndices, SplitIndices


class TokenSource:
    """The C view (mmfs_source) of one opened dataset; keeps its arrays alive.

    pread: read tokens with pread(2) instead of through the memory map, so that a
    long-running reader (the mount daemon) does not map every token page it reads.
    """

    def __init__(self, dataset, pread: bool = False) -> None:
        self.dataset = dataset
        self.fd = os.open(dataset.bin_path, os.O_RDONLY | os.O_CLOEXEC) if pread else -1
        self._keep = (dataset.data, dataset.sequence_lengths, dataset.sequence_pointers)
        c = ffi.new("mmfs_source *")
        data = dataset.data
        c.data = ffi.cast("const uint8_t *", data.ctypes.data) if data.size else ffi.NULL
        c.data_size = int(data.size)
        n = int(dataset.num_sequences)
        c.lengths = ffi.cast("const int32_t *", dataset.sequence_lengths.ctypes.data) if n else ffi.NULL
        c.pointers = ffi.cast("const int64_t *", dataset.sequence_pointers.ctypes.data) if n else ffi.NULL
        c.num_sequences = n
        c.dtype = native_code(dataset.dtype)
        c.use_fd = int(pread)
        c.fd = self.fd
        self.c = c

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)


class GptReader:
    """The C view (mmfs_gpt) of one GPTDataset's indices."""

    def __init__(self, gpt: GptIndices, source: TokenSource) -> None:
        self.gpt = gpt
        self.source = source
        self.name = gpt.spec.name
        self.shuffle_index = gpt.shuffle_index
        doc = np.ascontiguousarray(gpt.document_index, dtype=np.int32)
        sample = np.ascontiguousarray(gpt.sample_index)
        self._keep = (doc, sample)
        c = ffi.new("mmfs_gpt *")
        c.doc_index = ffi.cast("const int32_t *", doc.ctypes.data)
        c.num_doc_index = doc.shape[0]
        c.sample_index = ffi.cast("const void *", sample.ctypes.data)
        c.sample_index_wide = int(sample.dtype == np.int64)
        c.num_samples = sample.shape[0] - 1
        c.extra = gpt.params.extra
        self.c = c
        self.length = sample.shape[0] - 1


class SplitReader:
    """The samples of one split, in training order (shuffled, blended)."""

    def __init__(self, indices: SplitIndices, sources: dict, dtype: np.dtype,
                 sample_tokens: int, pad: int) -> None:
        self.name = indices.name
        self.indices = indices
        self.gpts = [GptReader(g, sources[g.spec.file]) for g in indices.gpts]
        blend = indices.blend
        self._dataset_index = None if blend is None else blend.dataset_index
        self._dataset_sample_index = None if blend is None else blend.dataset_sample_index
        self.dtype = np.dtype(dtype)
        self._out_code = native_code(self.dtype)
        self.sample_tokens = sample_tokens
        self.sample_bytes = sample_tokens * self.dtype.itemsize
        self.pad = pad
        self.length = len(indices)

    def __len__(self) -> int:
        return self.length

    def locate(self, i: int) -> tuple[GptReader, int]:
        """(GPTDataset, unshuffled sample id) of top-level sample i."""
        if not 0 <= i < self.length:
            raise IndexError(f"{self.name}: sample {i} out of range [0, {self.length})")
        if self._dataset_index is None:
            gpt, j = self.gpts[0], i
        else:
            gpt = self.gpts[int(self._dataset_index[i])]
            j = int(self._dataset_sample_index[i])
            if not 0 <= j < gpt.length:
                raise NativeError(
                    f"{self.name}: blend entry {i} asks for sample {j} of {gpt.name}, which has "
                    f"{gpt.length}; the blend cache is corrupt: delete it and remount"
                )
        return gpt, int(gpt.shuffle_index[j])

    def read_to_address(self, i: int, address) -> None:
        """Write sample i (sample_bytes bytes) at a C address (int or cdata pointer)."""
        gpt, k = self.locate(i)
        out = ffi.cast("void *", address)
        rc = lib.mmfs_read_sample(gpt.source.c, gpt.c, k, self.sample_tokens, self.pad,
                                  self._out_code, out)
        check(rc, f"{self.name}: sample {i} ({gpt.name}, unshuffled {k})")

    def read_into(self, i: int, buffer) -> None:
        """Write sample i into a writable buffer of at least sample_bytes bytes."""
        view = ffi.from_buffer(buffer, require_writable=True)
        if len(view) < self.sample_bytes:
            raise ValueError(f"buffer of {len(view)} bytes < {self.sample_bytes}")
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
        room = 16
        while True:
            pieces = ffi.new("int64_t[]", 3 * room)
            n = check(lib.mmfs_sample_pieces(gpt.source.c, gpt.c, k, pieces, room),
                      f"{self.name}: sample {i}")
            if n <= room:
                return gpt.name, [(pieces[3 * p], pieces[3 * p + 1], pieces[3 * p + 2])
                                  for p in range(n)]
            room = n
