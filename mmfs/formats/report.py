"""`mmfs info`: what a dataset holds, with length statistics, as text or JSON.

Statistics are exact and computed in bounded memory: lengths are tallied chunk by
chunk into a value -> count table (token lengths take few distinct values), and the
quantiles are read off that table.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from mmfs.errors import FormatError
from mmfs.formats import open_dataset
from mmfs.formats.chunks import iter_array, iter_document_lengths
from mmfs.formats.verify import check_document_indices
from mmfs.storage import open_source

_DENSE_LIMIT = 1 << 20  # values below this are tallied with bincount, above with unique


class ValueCounts:
    """Exact distribution of non-negative integers fed in chunks."""

    def __init__(self) -> None:
        self.dense = np.zeros(0, dtype=np.int64)  # dense[v] = count of v, v < _DENSE_LIMIT
        self.sparse: list[tuple[np.ndarray, np.ndarray]] = []
        self.count = 0
        self.total = 0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.int64)
        if not values.size:
            return
        self.count += values.size
        self.total += int(values.sum())
        small = values < _DENSE_LIMIT
        if not small.all():
            self.sparse.append(np.unique(values[~small], return_counts=True))
            if len(self.sparse) > 64:  # keep the list short
                self.sparse = [self._merged_sparse()]
            values = values[small]
        tally = np.bincount(values)
        if tally.size > self.dense.size:
            self.dense = np.concatenate((self.dense, np.zeros(tally.size - self.dense.size,
                                                              dtype=np.int64)))
        self.dense[: tally.size] += tally

    def _merged_sparse(self) -> tuple[np.ndarray, np.ndarray]:
        vals = np.concatenate([v for v, _ in self.sparse])
        cnts = np.concatenate([c for _, c in self.sparse])
        uniq, inverse = np.unique(vals, return_inverse=True)
        return uniq, np.bincount(inverse, weights=cnts).astype(np.int64)

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct values, their counts)."""
        vals = np.flatnonzero(self.dense)
        cnts = self.dense[vals]
        if self.sparse:
            v, c = self._merged_sparse()
            vals, cnts = np.concatenate((vals, v)), np.concatenate((cnts, c))
        return vals, cnts

    def stats(self) -> dict:
        """min, median, mean, p99, max (quantiles interpolated like numpy.percentile)."""
        if not self.count:
            return {"count": 0, "min": None, "median": None, "mean": None, "p99": None,
                    "max": None}
        vals, cnts = self.table()
        cum = np.cumsum(cnts)

        def kth(k: int) -> int:  # the k-th smallest value, 0-based
            return int(vals[np.searchsorted(cum, k, side="right")])

        def quantile(q: float) -> float:
            pos = q * (self.count - 1)
            lo = int(np.floor(pos))
            a, b = kth(lo), kth(min(lo + 1, self.count - 1))
            return float(a + (b - a) * (pos - lo))

        return {"count": self.count, "min": int(vals[0]), "median": quantile(0.5),
                "mean": self.total / self.count, "p99": quantile(0.99), "max": int(vals[-1])}


def describe(path: str) -> dict:
    """Everything `mmfs info` shows, as a JSON-ready dict."""
    ds = open_dataset(path)
    seq = ValueCounts()
    for start, lengths in iter_array(ds, "sequence_lengths"):
        if lengths.size and lengths.min() < 0:
            i = start + int(np.argmax(lengths < 0))
            raise FormatError(f"{ds.idx_path}: sequence_lengths[{i}] is negative; run "
                              f"`mmfs verify {ds.path_prefix}`")
        seq.add(lengths)
    one_per_doc = ds.documents_are_sequences or (
        check_document_indices(ds) and ds.num_documents == ds.num_sequences)
    if one_per_doc:
        doc = seq
    else:
        doc = ValueCounts()
        for lengths in iter_document_lengths(ds):
            doc.add(lengths)
    files = [ds.idx_path] if ds.idx_path == ds.bin_path else [ds.idx_path, ds.bin_path]
    return {
        "path": str(path),
        "format": ds.format_name,
        "dtype": ds.dtype.name,
        "dtype_code": int(ds.dtype_code),
        "num_sequences": ds.num_sequences,
        "num_documents": ds.num_documents,
        "num_tokens": seq.total,
        "multimodal": bool(ds.multimodal),
        "files": [{"path": f, "bytes": open_source(f).size} for f in files],
        "sequence_lengths": seq.stats(),
        "document_lengths": doc.stats(),
    }


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if not v.is_integer() else f"{int(v):,}"
    return f"{v:,}"


def format_text(info: dict) -> str:
    lines = [f"{'path':<12}{info['path']}", f"{'format':<12}{info['format']}"]
    for i, f in enumerate(info["files"]):
        lines.append(f"{'files' if i == 0 else '':<12}{f['path']}  {f['bytes']:,} bytes")
    lines += [
        f"{'dtype':<12}{info['dtype']} (code {info['dtype_code']})",
        f"{'sequences':<12}{info['num_sequences']:,}",
        f"{'documents':<12}{info['num_documents']:,}",
        f"{'tokens':<12}{info['num_tokens']:,}",
        f"{'multimodal':<12}{'yes' if info['multimodal'] else 'no'}",
        "",
    ]
    cols = ("min", "median", "mean", "p99", "max")
    rows = [["lengths (tokens)", *cols]]
    for name, key in (("sequences", "sequence_lengths"), ("documents", "document_lengths")):
        rows.append([name, *(_fmt(info[key][c]) for c in cols)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) + 1)]
    for r in rows:
        lines.append(r[0].ljust(widths[0]) + "".join(
            "  " + cell.rjust(w) for cell, w in zip(r[1:], widths[1:], strict=True)))
    return "\n".join(lines)


def info_command(args: argparse.Namespace) -> int:
    """`mmfs info PATH [--json]`."""
    info = describe(args.path)
    print(json.dumps(info, indent=2) if args.json else format_text(info))
    return 0
