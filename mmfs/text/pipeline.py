"""The streaming pipeline: chunks of JSONL lines go to a pool of worker processes,
which parse and tokenize them; the parent writes their results in input order.

At most 2 chunks per worker are in flight, so memory stays flat whatever the input
size; a worker that dies is an error, never a wait (see pool.py).

A document follows Megatron's tools/preprocess_data.py: for each JSON key, the text
(or each text of a list) is tokenized; texts with no tokens give no sequence; with
--append-eod the eod token ends the document's last sequence, unless the document
has no tokens at all, which leaves a document of no sequences.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.text.pool import OrderedPool
from mmfs.text.source import Chunk
from mmfs.text.tokenizer import Tokenizer, TokenizerSpec

IN_FLIGHT_PER_WORKER = 2


@dataclass(frozen=True)
class Job:
    """What every worker needs (sent once, at start)."""

    tokenizer: TokenizerSpec
    keys: tuple[str, ...]
    append_eod: bool
    dtype: str
    skip_bad_lines: bool
    input_name: str


@dataclass
class KeyResult:
    """One key's documents of a chunk, ready for IndexedDatasetWriter.add_documents."""

    tokens: bytes  # in the output dtype
    sequence_lengths: np.ndarray
    document_sizes: np.ndarray


@dataclass
class ChunkResult:
    documents: int
    skipped: int
    nbytes: int
    keys: dict[str, KeyResult] = field(default_factory=dict)


class BadLine(PreprocessError):
    """A line that is not a JSON object with the wanted keys holding text."""


def _parse(line: bytes, where: str) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadLine(f"{where}: not UTF-8 (byte {exc.start} of the line)") from None
    except json.JSONDecodeError as exc:
        raise BadLine(f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, deep nesting
        raise BadLine(f"{where}: malformed JSON ({type(exc).__name__}: {str(exc)[:80]})") from None


def _texts(line: bytes | dict, line_no: int, job: Job) -> list[list[str]]:
    """Each key's texts of one line, or of one Parquet record (a string is one text,
    a list several)."""
    where = f"{job.input_name}:{line_no}"
    data = line if isinstance(line, dict) else _parse(line, where)
    if not isinstance(data, dict):
        raise BadLine(f"{where}: not a JSON object")
    out = []
    for key in job.keys:
        if key not in data:
            raise BadLine(f"{where}: no key {key!r} (keys: {', '.join(map(repr, list(data)[:5]))}); "
                          "check the key (--json-keys, or json_key in the config)")
        text = data[key]
        texts = text if isinstance(text, list) else [text]
        if not all(isinstance(t, str) for t in texts):
            raise BadLine(f"{where}: key {key!r} is not a string or a list of strings")
        out.append(texts)
    return out


def _encode(tokenizer: Tokenizer, texts: list[str], line_of: list[int], job: Job) -> tuple[np.ndarray, np.ndarray]:
    try:
        return tokenizer.encode_batch(texts)
    except Exception:  # noqa: BLE001 - find the text that fails, to name its line
        for text, line_no in zip(texts, line_of):
            try:
                tokenizer.encode_batch([text])
            except Exception as exc:  # noqa: BLE001
                raise BadLine(f"{job.input_name}:{line_no}: the tokenizer cannot encode this text "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        raise


def _assemble(tokens: np.ndarray, lengths: np.ndarray, texts_per_doc: np.ndarray,
              eod: int | None, dtype: np.dtype) -> KeyResult:
    """Megatron's documents from the tokens of every text of a chunk's documents."""
    doc_of_text = np.repeat(np.arange(texts_per_doc.size), texts_per_doc)
    if eod is not None:
        # The eod goes after each document's last non-empty text.
        nonempty = np.flatnonzero(lengths > 0)
        last = np.full(texts_per_doc.size, -1, dtype=np.int64)
        last[doc_of_text[nonempty]] = nonempty  # later texts overwrite earlier ones
        last = last[last >= 0]
        ends = np.cumsum(lengths)[last]
        tokens = np.insert(tokens, ends, eod)
        lengths = lengths.copy()
        lengths[last] += 1
    keep = lengths > 0
    sizes = np.bincount(doc_of_text[keep], minlength=texts_per_doc.size)
    return KeyResult(tokens.astype(dtype).tobytes(), lengths[keep], sizes.astype(np.int64))


_worker: dict = {}


def _init_worker(job: Job, workers: int) -> None:
    if workers > 1:
        # Processes share the cores: the Rust tokenizer's own thread pool would only
        # oversubscribe them (this process's environment, read by `tokenizers` per call).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker["job"] = job
    _worker["tokenizer"] = job.tokenizer.load()


def encode_chunk(chunk: Chunk) -> ChunkResult:
    """Parse and tokenize one chunk (runs in a worker)."""
    job: Job = _worker["job"]
    tokenizer: Tokenizer = _worker["tokenizer"]
    per_key: list[list[str]] = [[] for _ in job.keys]
    per_key_counts: list[list[int]] = [[] for _ in job.keys]
    per_key_lines: list[list[int]] = [[] for _ in job.keys]
    skipped = 0
    for i, line in enumerate(chunk.lines):
        line_no = chunk.first_line + i
        try:
            texts = _texts(line, line_no, job)
        except BadLine:
            if not job.skip_bad_lines:
                raise
            skipped += 1
            continue
        for k, key_texts in enumerate(texts):
            per_key[k].extend(key_texts)
            per_key_counts[k].append(len(key_texts))
            per_key_lines[k].extend([line_no] * len(key_texts))
    result = ChunkResult(len(chunk.lines) - skipped, skipped, chunk.nbytes)
    eod = tokenizer.eod if job.append_eod else None
    for k, key in enumerate(job.keys):
        tokens, lengths = _encode(tokenizer, per_key[k], per_key_lines[k], job)
        counts = np.asarray(per_key_counts[k], dtype=np.int64)
        result.keys[key] = _assemble(tokens, lengths, counts, eod, np.dtype(job.dtype))
    return result


def run(job: Job, chunks: Iterator[Chunk], writers: dict[str, IndexedDatasetWriter], workers: int,
        on_progress: Callable[[ChunkResult], None]) -> None:
    """Tokenize every chunk with `workers` processes and write the results in order."""
    with OrderedPool(workers, encode_chunk, _init_worker, (job, workers), IN_FLIGHT_PER_WORKER) as pool:
        for result in pool.imap(chunks):
            _write(result, writers, on_progress)


def _write(result: ChunkResult, writers: dict[str, IndexedDatasetWriter],
           on_progress: Callable[[ChunkResult], None]) -> None:
    for key, part in result.keys.items():
        writer = writers[key]
        writer.add_documents(np.frombuffer(part.tokens, dtype=writer.dtype), part.sequence_lengths,
                             part.document_sizes)
    on_progress(result)
