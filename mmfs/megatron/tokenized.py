"""Text datasets of a config, tokenized into the cache folder on first use by the
code of `mmfs preprocess`, once per text, tokenizer and key: later builds and
mounts open the pair written then. Processes sharing the cache folder take a build
lock, as index builders do; the .idx is renamed into place last, so a pair with its
.idx is whole."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import subprocess
import sys

from mmfs.errors import CacheError, MmfsError, PreprocessError
from mmfs.megatron.cache.locks import try_lock, wait_unlocked
from mmfs.processes import mmfs_command, pid_alive
from mmfs.storage import open_source, scheme_of
from mmfs.text.dataset import TextDataset
from mmfs.text.tokenize import output_paths

log = logging.getLogger("mmfs")

PROGRESS_EVERY = 100_000  # documents between progress lines
ERROR_PREFIX = "mmfs: error: "  # how the CLI prints a user's mistake
STAGED = ".staged-"  # PREFIX.staged-PID_<key>_document.{bin,idx}: written, not yet checked


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


def preprocess_args(text: TextDataset, input_path: str, output_prefix: str | None = None) -> list[str]:
    """The `mmfs preprocess` command line that writes `text`'s pair (at `output_prefix`
    instead of its own, when given)."""
    spec = text.tokenizer
    flags = {"--input": input_path, "--output-prefix": output_prefix or text.output_prefix,
             "--json-keys": text.json_key, "--tokenizer-type": spec.kind, "--tokenizer-model": spec.path,
             "--vocab-file": spec.vocab_file, "--merge-file": spec.merge_file, "--vocab-size": spec.vocab_size,
             "--tiktoken-pattern": spec.tiktoken_pattern, "--workers": len(os.sched_getaffinity(0)),
             "--log-interval": PROGRESS_EVERY}
    # FLAG=VALUE: a key or a path may begin with "-"
    return ["preprocess", *(f"{k}={v}" for k, v in flags.items() if v is not None)] + \
        (["--append-eod"] if text.append_eod else []) + ([] if log.isEnabledFor(logging.INFO) else ["-q"])


def _identity_now(source: str) -> tuple | None:
    """A local text's identity as it is now (None: it is gone)."""
    try:
        return open_source(source).identity
    except MmfsError:
        return None


def _remove_stale_staged(text: TextDataset) -> None:
    """Staged pairs of tokenizing runs whose process is gone (killed before publishing)."""
    for path in glob.glob(glob.escape(text.output_prefix) + STAGED + "*"):
        pid = re.match(r"\d+", path[len(text.output_prefix) + len(STAGED):])
        if pid and not pid_alive(int(pid.group())):
            with contextlib.suppress(OSError):
                os.remove(path)


def _tokenize(text: TextDataset) -> None:
    """Run `mmfs preprocess` in a child process: its worker processes, and the
    machinery multiprocessing starts for them, end with it, and never live on in a
    mount daemon forked from this process (holding the caller's stderr open).

    The child writes a staged pair; it is renamed to the text's name only when the
    text still is the file that name was made from: a file rewritten meanwhile would
    give a mix of old and new text kept under the old file's name."""
    remote = scheme_of(text.source) is not None
    # A text in a bucket is copied whole into the cache (gzip, zstd and Parquet
    # readers want a file), and the copy is dropped once tokenized.
    copy = open_source(text.source, whole=True) if remote else None
    local = copy.path if remote else text.source
    staged = f"{text.output_prefix}{STAGED}{os.getpid()}"
    _remove_stale_staged(text)
    log.info("tokenizing %s (key %r, %s) into %s", text.source, text.json_key, text.tokenizer.kind, text.prefix)
    try:
        child = subprocess.Popen(mmfs_command(*preprocess_args(text, local, staged)),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, errors="replace")
        error = None
        for line in child.stderr:  # progress passes through; the error line is ours to raise
            line = line.replace(staged, text.output_prefix)  # named as the user will find it
            if line.startswith(ERROR_PREFIX):
                error = line[len(ERROR_PREFIX):].strip()
            else:
                sys.stderr.write(line)
        if child.wait() != 0:
            raise PreprocessError(error or f"{text.source}: tokenizing failed (exit code {child.returncode}); "
                                           f"run mmfs {' '.join(preprocess_args(text, local))} to see why")
        if (copy.identity if remote else _identity_now(text.source)) != text.identity:
            raise PreprocessError(f"{text.source}: the file changed while it was tokenized (nothing kept); "
                                  "run again once it is no longer being written")
        try:
            for kind in (0, 1):  # .idx last: a pair with its .idx is whole
                os.replace(output_paths(staged, text.json_key)[kind],
                           output_paths(text.output_prefix, text.json_key)[kind])
        except OSError as exc:
            raise CacheError(f"{exc.filename or text.output_prefix}: cannot keep the tokenized {text.source} "
                             f"({exc.strerror or exc}); set cache_dir to a writable folder") from None
    finally:
        for path in output_paths(staged, text.json_key):
            with contextlib.suppress(OSError):
                os.remove(path)
        if remote:
            with contextlib.suppress(OSError):
                os.remove(local)
