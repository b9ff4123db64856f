"""`mmfs preprocess`: JSONL or Parquet to Megatron IndexedDatasets, as Megatron's
tools/preprocess_data.py writes them (same flags, same bytes), with every check that
can fail done in the parent before any worker starts."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from mmfs.errors import PreprocessError
from mmfs.text.tokenize import TextJob, output_paths, tokenize_file
from mmfs.text.tokenizer import TIKTOKEN, TokenizerSpec

log = logging.getLogger("mmfs")


def _absolute(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def tokenizer_spec(args: argparse.Namespace) -> TokenizerSpec:
    """The tokenizer Megatron's flags name, with each type's required flags checked."""
    kind = args.tokenizer_type
    if args.tiktoken_pattern and kind != TIKTOKEN:
        raise PreprocessError(f"--tiktoken-pattern is for TikTokenizer, not {kind}")
    spec = TokenizerSpec(kind, _absolute(args.tokenizer_model), _absolute(args.vocab_file),
                         _absolute(args.merge_file), args.vocab_size, args.tiktoken_pattern)
    for name in spec.missing():
        flag = "tokenizer-model" if name == "path" else name.replace("_", "-")
        raise PreprocessError(f"--tokenizer-type {kind} needs --{flag}")
    return spec


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


def _cap_workers(asked: int) -> int:
    """At most the CPUs this process may use: more processes only contend for them
    (10,000 forked workers drove the load average past 50)."""
    if asked < 1:
        raise PreprocessError(f"--workers {asked}: give 1 or more")
    cpus = len(os.sched_getaffinity(0))
    if asked > cpus:
        log.warning("--workers %d: using %d, the CPUs available to this process", asked, cpus)
    return min(asked, cpus)


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
    job = TextJob(args.input, tokenizer_spec(args), tuple(args.json_keys), args.append_eod, args.workers,
                  args.max_line_bytes, args.skip_bad_lines, args.log_interval or 0)
    tokenize_file(job, args.output_prefix, progress_bar=sys.stderr.isatty() and log.isEnabledFor(logging.INFO))
    for key in job.keys:
        log.info("wrote %s and %s", *output_paths(args.output_prefix, key))
    return 0
