"""One text file (JSONL, .jsonl.gz, .jsonl.zst or Parquet) to Megatron IndexedDatasets,
PREFIX_<key>_document.{bin,idx}, written under temporary names and renamed when whole.
`mmfs preprocess` and a config's text datasets both write through here."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.formats.dtypes import optimal_dtype
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.processes import pid_alive
from mmfs.text import pipeline
from mmfs.text.parquet import parquet_chunks
from mmfs.text.source import COMPRESSED_SUFFIXES, PARQUET_SUFFIX, Chunk, open_input, read_chunks
from mmfs.text.tokenizer import TokenizerSpec

log = logging.getLogger("mmfs")

DEFAULT_MAX_LINE_BYTES = 64 << 20


class Progress:
    """A progress bar (for an uncompressed input, whose size is known) with documents/s
    and MB/s on stderr, redrawn in place when stderr is a terminal."""

    def __init__(self, enabled: bool, total_bytes: int | None = None, log_interval: int = 0) -> None:
        self.enabled = enabled
        self.log_interval = log_interval  # documents between lines when not redrawing (0: none)
        self.total = total_bytes
        self.start = time.monotonic()
        self.shown = 0.0
        self.documents = self.skipped = self.nbytes = 0

    def line(self) -> str:
        secs = max(time.monotonic() - self.start, 1e-9)
        skipped = f", {self.skipped:,} bad lines skipped" if self.skipped else ""
        return (f"{self.documents:,} documents, {self.nbytes / 1e6:,.1f} MB in {secs:.1f} s "
                f"({self.documents / secs:,.0f} documents/s, {self.nbytes / 1e6 / secs:.2f} MB/s{skipped})")

    def __call__(self, result: pipeline.ChunkResult) -> None:
        before = self.documents
        self.documents += result.documents
        if not self.enabled and self.log_interval and \
                before // self.log_interval != self.documents // self.log_interval:
            log.info("%s", self.line())
        self.skipped += result.skipped
        self.nbytes += result.nbytes
        now = time.monotonic()
        if self.enabled and now - self.shown >= 0.2:
            self.shown = now
            bar = ""
            if self.total:
                done = min(self.nbytes / self.total, 1.0)
                bar = f"[{'#' * int(done * 20):20s}] {done:4.0%} "
            print(f"\rmmfs: {bar}{self.line()}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class TextJob:
    """What to tokenize and how: Megatron's preprocessing flags."""

    input: str
    tokenizer: TokenizerSpec
    keys: tuple[str, ...] = ("text",)
    append_eod: bool = False
    workers: int = 1
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    skip_bad_lines: bool = False
    log_interval: int = 0


def output_paths(prefix: str, key: str) -> tuple[str, str]:
    """Megatron's names: PREFIX_<key>_document.bin and .idx."""
    base = f"{prefix}_{key}_document"
    return base + ".bin", base + ".idx"


def _check_not_input(finals: dict[str, tuple[str, str]], input_path: str) -> None:
    for paths in finals.values():
        for path in paths:
            if os.path.exists(path) and os.path.samefile(path, input_path):
                raise PreprocessError(f"{path}: --output-prefix would overwrite the input; "
                                      "choose another output prefix")


def _remove_dead_runs_temporaries(finals: dict[str, tuple[str, str]]) -> None:
    """A run killed hard (SIGKILL, a crash) leaves PATH.tmp-PID behind: remove those
    whose process is gone, as the index cache does."""
    for paths in finals.values():
        for path in paths:
            for tmp in glob.glob(glob.escape(path) + ".tmp-*"):
                pid = tmp.rsplit(".tmp-", 1)[1]
                if pid.isdigit() and not pid_alive(int(pid)):
                    with contextlib.suppress(OSError):
                        os.remove(tmp)


def input_size(path: str) -> int | None:
    """The bytes progress counts up to: known for plain JSONL only."""
    return None if path.endswith((*COMPRESSED_SUFFIXES, PARQUET_SUFFIX)) else os.path.getsize(path)


@contextlib.contextmanager
def input_chunks(path: str, max_line: int, keys: tuple[str, ...]) -> Iterator[Iterator[Chunk]]:
    """The input's chunks, by its suffix: Parquet (the `keys` columns) or JSONL."""
    if path.endswith(PARQUET_SUFFIX):
        yield parquet_chunks(path, keys)
        return
    with open_input(path) as stream:
        yield read_chunks(path, stream, max_line)


def tokenize_file(job: TextJob, output_prefix: str, progress_bar: bool) -> Progress:
    """Write PREFIX_<key>_document.{bin,idx} for each key of `job`; returns the counts.
    Every check that can fail is done before any worker starts; an interrupted run
    leaves nothing that looks finished (.bin renamed first, .idx last)."""
    tokenizer = job.tokenizer.load()
    if job.append_eod and tokenizer.eod is None:
        raise PreprocessError(f"{tokenizer.name}: the tokenizer has no eos (or sep) token for "
                              "--append-eod; set eos_token in tokenizer_config.json or drop --append-eod")
    dtype = optimal_dtype(tokenizer.vocab_size)
    if tokenizer.max_id > np.iinfo(dtype).max:
        raise PreprocessError(f"{tokenizer.name}: token id {tokenizer.max_id} does not fit {dtype.name}, "
                              f"the dtype Megatron picks for a vocabulary of {tokenizer.vocab_size}; "
                              "the tokenizer's ids have gaps, renumber them")
    finals = {key: output_paths(output_prefix, key) for key in job.keys}
    _check_not_input(finals, job.input)
    _remove_dead_runs_temporaries(finals)
    work = pipeline.Job(job.tokenizer, job.keys, job.append_eod, dtype.name, job.skip_bad_lines, job.input)
    temps = {key: tuple(f"{p}.tmp-{os.getpid()}" for p in paths) for key, paths in finals.items()}
    writers: dict[str, IndexedDatasetWriter] = {}
    progress = Progress(enabled=progress_bar, log_interval=job.log_interval)
    try:
        with input_chunks(job.input, job.max_line_bytes, job.keys) as chunks:
            progress.total = input_size(job.input)
            for key, (bin_tmp, _) in temps.items():
                writers[key] = IndexedDatasetWriter(bin_tmp, dtype=dtype)
            pipeline.run(work, chunks, writers, job.workers, progress)
        for key, (_, idx_tmp) in temps.items():
            writers[key].finalize(idx_tmp)
        for kind in (0, 1):
            for key in finals:
                os.replace(temps[key][kind], finals[key][kind])
    except OSError as exc:
        raise PreprocessError(f"{exc.filename or output_prefix}: cannot write the output "
                              f"({exc.strerror or exc})") from None
    finally:
        progress.close()
        for writer in writers.values():
            writer.close()
        for paths in temps.values():
            for path in paths:
                if os.path.exists(path):
                    os.remove(path)
    if progress.skipped:
        log.warning("%s: skipped %d bad lines (--skip-bad-lines)", job.input, progress.skipped)
    log.info("%s (%s, vocabulary %d, %s)", progress.line(), tokenizer.name, tokenizer.vocab_size, dtype.name)
    return progress
