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
    """Chunks of about CHUNK_BYTES of text (characters, as counted here) or
    CHUNK_LINES rows, as JSONL is cut."""
    row = 1
    records: list[dict] = []
    size = 0
    try:
        # a row group read at a time, turned into Python objects a batch at a time
        batches = (batch for group in range(file.num_row_groups)
                   for batch in file.read_row_group(group, columns=list(keys)).to_batches(CHUNK_LINES))
        for batch in batches:
            for record in batch.to_pylist():
                records.append(record)
                size += sum(len(v) for v in record.values() if isinstance(v, str))
                if size >= CHUNK_BYTES or len(records) >= CHUNK_LINES:
                    yield Chunk(row, records, size)
                    row += len(records)
                    records, size = [], 0
    except PreprocessError:
        raise
    except Exception as exc:  # pyarrow's errors for a corrupt or truncated file
        raise PreprocessError(f"{path}: cannot read the Parquet file after row {row + len(records) - 1} "
                              f"({str(exc).splitlines()[0]}); is the file truncated or corrupt?") from None
    if records:
        yield Chunk(row, records, size)
