"""`mmfs preprocess`: JSONL to Megatron IndexedDatasets, as Megatron's
tools/preprocess_data.py writes them (same flags, same bytes), with every check that
can fail done in the parent before any worker starts."""

from __future__ import annotations

import argparse
import contextlib
import glob
import logging
import os
import signal
import sys
import time

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.formats.dtypes import optimal_dtype
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.processes import pid_alive
from mmfs.tools.preprocess import pipeline
from mmfs.tools.preprocess.source import open_input, read_chunks
from mmfs.tools.preprocess.tokenizer import (
    BYTE_LEVEL,
    GPT2_BPE,
    NULL,
    TIKTOKEN,
    TokenizerSpec,
)

log = logging.getLogger("mmfs")


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


def _absolute(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def tokenizer_spec(args: argparse.Namespace) -> TokenizerSpec:
    """The tokenizer Megatron's flags name, with each type's required flags checked."""
    kind = args.tokenizer_type
    needs = {GPT2_BPE: ("vocab_file", "merge_file"), NULL: ("vocab_size",), BYTE_LEVEL: ()}.get(
        kind, ("tokenizer_model",))
    for name in needs:
        if getattr(args, name) is None:
            raise PreprocessError(f"--tokenizer-type {kind} needs --{name.replace('_', '-')}")
    if args.tiktoken_pattern and kind != TIKTOKEN:
        raise PreprocessError(f"--tiktoken-pattern is for TikTokenizer, not {kind}")
    return TokenizerSpec(kind, _absolute(args.tokenizer_model), _absolute(args.vocab_file),
                         _absolute(args.merge_file), args.vocab_size, args.tiktoken_pattern)


def _check_flags(args: argparse.Namespace) -> None:
    """Megatron's flags mmfs cannot honour, each refused in one line."""
    if args.split_sentences:
        raise PreprocessError("--split-sentences: mmfs preprocess does not split sentences; run Megatron's "
                              "tools/preprocess_data.py for *_sentence outputs")
    if args.partitions < 1:
        raise PreprocessError(f"--partitions {args.partitions}: give 1 or more")
    if args.partitions > 1 and not args.keep_sequential_samples:
        raise PreprocessError(f"--partitions {args.partitions}: without --keep-sequential-samples Megatron "
                              "deals lines round-robin to partitions (a reordered output), which mmfs does not "
                              "reproduce; add --keep-sequential-samples (the same output as one partition)")
    if args.log_interval is not None and args.log_interval < 1:
        raise PreprocessError(f"--log-interval {args.log_interval}: give 1 or more")


def _check_output(prefix: str) -> None:
    folder = os.path.dirname(prefix) or "."
    if not os.path.isdir(folder):
        raise PreprocessError(f"{folder}: the output folder does not exist; create it (mkdir -p {folder}) "
                              "or fix --output-prefix")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PreprocessError(f"{folder}: the output folder is not writable; fix --output-prefix")
    if not os.path.basename(prefix):
        raise PreprocessError(f"{prefix}: --output-prefix needs a file name prefix after the folder")


def output_paths(prefix: str, key: str) -> tuple[str, str]:
    """Megatron's names: PREFIX_<key>_document.bin and .idx."""
    base = f"{prefix}_{key}_document"
    return base + ".bin", base + ".idx"


def _cap_workers(asked: int) -> int:
    """At most the CPUs this process may use: more processes only contend for them
    (10,000 forked workers drove the load average past 50)."""
    if asked < 1:
        raise PreprocessError(f"--workers {asked}: give 1 or more")
    cpus = len(os.sched_getaffinity(0))
    if asked > cpus:
        log.warning("--workers %d: using %d, the CPUs available to this process", asked, cpus)
    return min(asked, cpus)


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


def _raise_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the temporary outputs are removed


def preprocess_command(args: argparse.Namespace) -> int:
    args.workers = _cap_workers(args.workers)
    if args.max_line_bytes < 1:
        raise PreprocessError(f"--max-line-bytes {args.max_line_bytes}: give 1 or more")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    if len(set(args.json_keys)) != len(args.json_keys):
        raise PreprocessError(f"--json-keys {' '.join(args.json_keys)}: a key is given twice")
    _check_flags(args)
    _check_output(args.output_prefix)
    spec = tokenizer_spec(args)
    tokenizer = spec.load()
    if args.append_eod and tokenizer.eod is None:
        raise PreprocessError(f"{tokenizer.name}: the tokenizer has no eos (or sep) token for "
                              "--append-eod; set eos_token in tokenizer_config.json or drop --append-eod")
    dtype = optimal_dtype(tokenizer.vocab_size)
    if tokenizer.max_id > np.iinfo(dtype).max:
        raise PreprocessError(f"{tokenizer.name}: token id {tokenizer.max_id} does not fit {dtype.name}, "
                              f"the dtype Megatron picks for a vocabulary of {tokenizer.vocab_size}; "
                              "the tokenizer's ids have gaps, renumber them")
    stream = open_input(args.input)
    job = pipeline.Job(spec, tuple(args.json_keys), args.append_eod, dtype.name, args.skip_bad_lines,
                       args.input)
    finals = {key: output_paths(args.output_prefix, key) for key in args.json_keys}
    _check_not_input(finals, args.input)
    _remove_dead_runs_temporaries(finals)
    # Temporary names until the end: an interrupted run leaves nothing that looks finished.
    temps = {key: tuple(f"{p}.tmp-{os.getpid()}" for p in paths) for key, paths in finals.items()}
    writers: dict[str, IndexedDatasetWriter] = {}
    compressed = args.input.endswith((".gz", ".zst"))
    progress = Progress(enabled=sys.stderr.isatty() and log.isEnabledFor(logging.INFO),
                        total_bytes=None if compressed else os.path.getsize(args.input),
                        log_interval=args.log_interval or 0)
    try:
        for key, (bin_tmp, _) in temps.items():
            writers[key] = IndexedDatasetWriter(bin_tmp, dtype=dtype)
        with stream:
            pipeline.run(job, read_chunks(args.input, stream, args.max_line_bytes), writers, args.workers, progress)
        for key, (_, idx_tmp) in temps.items():
            writers[key].finalize(idx_tmp)
        # .bin first, .idx last: an .idx beside a .bin means the pair is complete.
        for kind in (0, 1):
            for key in finals:
                os.replace(temps[key][kind], finals[key][kind])
    except OSError as exc:
        raise PreprocessError(f"{exc.filename or args.output_prefix}: cannot write the output "
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
        log.warning("%s: skipped %d bad lines (--skip-bad-lines)", args.input, progress.skipped)
    log.info("%s (%s, vocabulary %d, %s)", progress.line(), tokenizer.name, tokenizer.vocab_size, dtype.name)
    for bin_path, idx_path in finals.values():
        log.info("wrote %s and %s", bin_path, idx_path)
    return 0
