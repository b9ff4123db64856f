"""`mmfs verify`: every check opening skips because it costs O(N), in bounded memory.

Rules (each failure is a FormatError naming the file, the array entry and, for a
.idx, its byte offset):
  - sequence_lengths[i] >= 0
  - data start <= sequence_pointers[i] and pointer + length * itemsize <= data end
  - .idx only: sequences lie back to back from byte 0, as Megatron writes them
    (pointers[i+1] == pointers[i] + lengths[i] * itemsize)
  - document_indices[0] == 0, non-decreasing, last == number of sequences
Sequence modes (multimodal only) are int8 and any value is legal: Megatron's writer
and reader accept negative modes too.
Bytes of the .bin no sequence covers, and .pbin documents that overlap or leave
gaps (legal there), are reported as warnings.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field

import numpy as np

from mmfs.errors import FormatError
from mmfs.formats import open_dataset
from mmfs.formats.chunks import CHUNK, Progress, element_offset, iter_array

log = logging.getLogger(__name__)


@dataclass
class VerifyReport:
    path: str
    format_name: str
    dtype: str
    num_sequences: int
    num_documents: int
    num_tokens: int
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"OK: {self.path} ({self.format_name}, {self.dtype}): "
                f"{self.num_sequences:,} sequences, {self.num_documents:,} documents, "
                f"{self.num_tokens:,} tokens; lengths, pointers and document indices are "
                "consistent")


def verify(path: str, chunk: int = CHUNK) -> VerifyReport:
    """Check a dataset completely; raise FormatError at the first inconsistency."""
    ds = open_dataset(path)
    report = VerifyReport(path=str(path), format_name=ds.format_name, dtype=ds.dtype.name,
                          num_sequences=ds.num_sequences, num_documents=ds.num_documents,
                          num_tokens=0)
    report.num_tokens = _check_sequences(ds, report, chunk)
    check_document_indices(ds, chunk)
    return report


def _fail(ds, name: str, i: int, what: str) -> FormatError:
    fix = ("the file is corrupt; rebuild it" if ds.format_name == "modalities-packed"
           else "the index is corrupt or does not belong to this .bin; rebuild the dataset")
    return FormatError(f"{ds.idx_path}: {element_offset(ds, name, i)} {what}; {fix}")


def _check_sequences(ds, report: VerifyReport, chunk: int) -> int:
    """Lengths and pointers, chunk by chunk; returns the token count."""
    lo, hi = ds.data_section
    item = ds.dtype.itemsize
    back_to_back = ds.format_name != "modalities-packed"
    expected = lo  # where the next sequence starts if sequences are back to back
    out_of_order = 0
    tokens = 0
    covered_end = lo
    progress = Progress("verify: sequences", ds.num_sequences)
    chunks = zip(iter_array(ds, "sequence_lengths", chunk),
                 iter_array(ds, "sequence_pointers", chunk), strict=True)
    for (start, lengths), (_, pointers) in chunks:
        lengths = lengths.astype(np.int64)
        pointers = pointers.astype(np.int64, copy=False)
        # clip so a wild pointer cannot overflow; the unclipped value is reported
        ends = np.clip(pointers, lo, hi) + np.maximum(lengths, 0) * item
        starts = np.empty_like(pointers)  # where each would start if back to back
        starts[0] = expected
        starts[1:] = ends[:-1]
        gaps = pointers != starts
        i, rule = _first_failure(lengths < 0, (pointers < lo) | (pointers > hi), ends > hi,
                                 gaps if back_to_back else gaps[:0])
        if rule == 0:
            raise _fail(ds, "sequence_lengths", start + i, f"is {int(lengths[i])}, negative")
        if rule == 1:
            raise _fail(ds, "sequence_pointers", start + i,
                        f"is {int(pointers[i])}, outside the token data "
                        f"(bytes {lo}..{hi} of {ds.bin_path})")
        if rule == 2:
            raise _fail(ds, "sequence_pointers", start + i,
                        f"with length {int(lengths[i])} ends at byte {int(ends[i])}, past the "
                        f"end of the token data (byte {hi} of {ds.bin_path})")
        if rule == 3:
            raise _fail(ds, "sequence_pointers", start + i,
                        f"is {int(pointers[i])} but the previous sequence ends at byte "
                        f"{int(starts[i])} (Megatron writes sequences back to back)")
        if not back_to_back:
            out_of_order += int(gaps.sum())
        expected = int(ends[-1])
        covered_end = max(covered_end, int(ends.max()))
        tokens += int(lengths.sum())
        progress.update(start + len(lengths))
    if out_of_order:
        report.warnings.append(f"{out_of_order:,} documents do not start where the previous "
                               "one ends (gaps or overlaps in the data section)")
    if back_to_back and expected < hi:
        report.warnings.append(f"{ds.bin_path}: the last {hi - expected:,} bytes (from byte "
                               f"{expected}) belong to no sequence")
    elif not back_to_back and covered_end < hi:
        report.warnings.append(f"{ds.bin_path}: data-section bytes {covered_end}..{hi} belong to "
                               "no document")
    return tokens


def check_document_indices(ds, chunk: int = CHUNK) -> bool:
    """Raise unless document_indices starts at 0, never decreases and ends at N.
    Returns whether it is strictly increasing (then it is 0..N, one sequence a document,
    when there are N + 1 entries)."""
    n = ds.num_sequences
    prev = None
    strict = True
    count = ds.num_documents + 1
    progress = Progress("verify: document indices", count)
    for start, docs in iter_array(ds, "document_indices", chunk):
        if start == 0 and docs[0] != 0:
            raise _fail(ds, "document_indices", 0, f"is {int(docs[0])}, expected 0")
        steps = np.diff(docs, prepend=docs[0] if prev is None else prev)
        i, rule = _first_failure(steps < 0, docs > n)
        if rule == 0:
            raise _fail(ds, "document_indices", start + i,
                        f"is {int(docs[i])}, less than the entry before it "
                        f"({int(docs[i] - steps[i])}); document indices must not decrease")
        if rule == 1:
            raise _fail(ds, "document_indices", start + i,
                        f"is {int(docs[i])}, past the sequence count {n}")
        strict = strict and bool((steps[0 if prev is not None else 1:] > 0).all())
        prev = int(docs[-1])
        progress.update(start + len(docs))
    if prev != n:
        raise _fail(ds, "document_indices", count - 1, f"is {prev}, expected the sequence "
                    f"count {n}")
    return strict


def _first_failure(*masks: np.ndarray) -> tuple[int, int | None]:
    """(entry, rule) of the earliest entry any mask flags (the first rule wins a tie),
    or (0, None) when every entry passes."""
    best, rule = 0, None
    for r, mask in enumerate(masks):
        if mask.any():
            i = int(np.argmax(mask))
            if rule is None or i < best:
                best, rule = i, r
    return best, rule


def verify_command(args: argparse.Namespace) -> int:
    """`mmfs verify PATH`: print "OK: ..." and warnings, or raise FormatError."""
    report = verify(args.path)
    for warning in report.warnings:
        log.warning("warning: %s", warning)
    print(report.summary())
    return 0
