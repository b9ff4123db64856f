"""Parquet input: the text columns of a Parquet file, one row group at a time (pyarrow
reads a row group whole, so memory is bounded by the file's largest row group), as
chunks of records for the tokenizing pipeline. Row numbers count from 1 and stand in
for JSONL line numbers in messages."""

from __future__ import annotations

from collections.abc import Iterator

from mmfs.errors import PreprocessError
from mmfs.text.source import CHUNK_BYTES, CHUNK_LINES, Chunk


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PreprocessError("reading .parquet needs the `pyarrow` package: pip install 'mmfs[parquet]'") from None
    return pq


def parquet_chunks(path: str, keys: tuple[str, ...]) -> Iterator[Chunk]:
    """Open `path` and check its columns now (one line naming the file otherwise);
    the chunks are read as the returned iterator is consumed."""
    pq = _pyarrow_parquet()
    try:
        file = pq.ParquetFile(path)
    except Exception as exc:  # OSError, or pyarrow's ArrowInvalid for a file that is not Parquet
        raise PreprocessError(f"{path}: cannot read the Parquet file ({str(exc).splitlines()[0]}); "
                              "check the path and that the file is whole") from None
    columns = file.schema_arrow.names
    for key in keys:
        if key not in columns:
            shown = ", ".join(map(repr, columns[:8])) + (", ..." if len(columns) > 8 else "")
            raise PreprocessError(f"{path}: no column {key!r} (columns: {shown}); check the key (--json-keys, "
                                  "or json_key in the config)")
    return _chunks(path, file, keys)


def _chunks(path: str, file, keys: tuple[str, ...]) -> Iterator[Chunk]:
    row = 1
    try:
        for group in range(file.num_row_groups):
            table = file.read_row_group(group, columns=list(keys))
            for batch in table.to_batches(max_chunksize=CHUNK_LINES):
                records = batch.to_pylist()
                nbytes = sum(len(r[k]) for r in records for k in keys if isinstance(r[k], str))
                # A huge batch of long texts is split further, as JSONL chunks are.
                step = max(1, int(len(records) * CHUNK_BYTES / max(nbytes, 1)))
                for start in range(0, len(records), step):
                    part = records[start:start + step]
                    yield Chunk(row + start, part, sum(len(r[k]) for r in part for k in keys
                                                       if isinstance(r[k], str)))
                row += len(records)
    except PreprocessError:
        raise
    except Exception as exc:  # pyarrow's errors for a corrupt or truncated file
        raise PreprocessError(f"{path}: cannot read the Parquet file after row {row - 1} "
                              f"({str(exc).splitlines()[0]}); is the file truncated or corrupt?") from None
