"""Text datasets of a config, tokenized into the cache folder on first use by the
code of `mmfs preprocess`, once per text, tokenizer and key: later builds and
mounts open the pair written then. Processes sharing the cache folder take a build
lock, as index builders do; the .idx is renamed into place last, so a pair with its
.idx is whole."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

from mmfs.errors import CacheError, PreprocessError
from mmfs.megatron.cachelock import try_lock, wait_unlocked
from mmfs.processes import mmfs_command
from mmfs.storage import open_source, scheme_of
from mmfs.text.dataset import TextDataset

log = logging.getLogger("mmfs")

PROGRESS_EVERY = 100_000  # documents between progress lines
ERROR_PREFIX = "mmfs: error: "  # how the CLI prints a user's mistake


def _done(text: TextDataset) -> bool:
    return os.path.exists(text.prefix + ".idx")


def ensure_tokenized(text: TextDataset) -> str:
    """The prefix of `text`'s IndexedDataset, tokenizing it now if no process has."""
    if _done(text):
        return text.prefix
    folder = os.path.dirname(text.output_prefix)
    lock_path = text.output_prefix + ".lock"
    try:
        os.makedirs(folder, exist_ok=True)
        while (lock := try_lock(lock_path)) is None:
            wait_unlocked(lock_path)
            if _done(text):
                return text.prefix
    except OSError as exc:
        raise CacheError(f"{folder}: cannot keep the tokenized {text.source} there ({exc.strerror or exc}); "
                         "set cache_dir to a writable folder") from None
    try:
        if not _done(text):
            _tokenize(text)
    finally:
        lock.release()
    return text.prefix


def preprocess_args(text: TextDataset, input_path: str) -> list[str]:
    """The `mmfs preprocess` command line that writes `text`'s pair."""
    spec = text.tokenizer
    flags = {"--input": input_path, "--output-prefix": text.output_prefix, "--json-keys": text.json_key,
             "--tokenizer-type": spec.kind, "--tokenizer-model": spec.path, "--vocab-file": spec.vocab_file,
             "--merge-file": spec.merge_file, "--vocab-size": spec.vocab_size,
             "--tiktoken-pattern": spec.tiktoken_pattern, "--workers": len(os.sched_getaffinity(0)),
             "--log-interval": PROGRESS_EVERY}
    # FLAG=VALUE: a key or a path may begin with "-"
    return ["preprocess", *(f"{k}={v}" for k, v in flags.items() if v is not None)] + \
        (["--append-eod"] if text.append_eod else []) + ([] if log.isEnabledFor(logging.INFO) else ["-q"])


def _tokenize(text: TextDataset) -> None:
    """Run `mmfs preprocess` in a child process: its worker processes, and the
    machinery multiprocessing starts for them, end with it, and never live on in a
    mount daemon forked from this process (holding the caller's stderr open)."""
    remote = scheme_of(text.source) is not None
    # A text in a bucket is copied whole into the cache (gzip, zstd and Parquet
    # readers want a file), and the copy is dropped once tokenized.
    local = open_source(text.source, whole=True).path if remote else text.source
    log.info("tokenizing %s (key %r, %s) into %s", text.source, text.json_key, text.tokenizer.kind, text.prefix)
    try:
        child = subprocess.Popen(mmfs_command(*preprocess_args(text, local)),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, errors="replace")
        error = None
        for line in child.stderr:  # progress passes through; the error line is ours to raise
            if line.startswith(ERROR_PREFIX):
                error = line[len(ERROR_PREFIX):].strip()
            else:
                sys.stderr.write(line)
        if child.wait() != 0:
            raise PreprocessError(error or f"{text.source}: tokenizing failed (exit code {child.returncode}); "
                                           f"run mmfs {' '.join(preprocess_args(text, local))} to see why")
    finally:
        if remote:
            with contextlib.suppress(OSError):
                os.remove(local)
