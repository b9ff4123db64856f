"""Text datasets of a config, tokenized into the cache folder on first use by the
code of `mmfs preprocess`, once per text, tokenizer and key: later builds and
mounts open the pair written then. Processes sharing the cache folder take a build
lock, as index builders do; the .idx is renamed into place last, so a pair with its
.idx is whole."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from mmfs.errors import CacheError
from mmfs.megatron.cachelock import try_lock, wait_unlocked
from mmfs.storage import open_source, scheme_of
from mmfs.text.dataset import TextDataset
from mmfs.text.tokenize import TextJob, tokenize_file

log = logging.getLogger("mmfs")


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


def _tokenize(text: TextDataset) -> None:
    remote = scheme_of(text.source) is not None
    # A text in a bucket is copied whole into the cache (gzip, zstd and Parquet
    # readers want a file), and the copy is dropped once tokenized.
    local = open_source(text.source, whole=True).path if remote else text.source
    log.info("tokenizing %s (key %r, %s) into %s", text.source, text.json_key, text.tokenizer.kind, text.prefix)
    job = TextJob(local, text.tokenizer, (text.json_key,), text.append_eod,
                  workers=len(os.sched_getaffinity(0)))
    try:
        tokenize_file(job, text.output_prefix, progress_bar=sys.stderr.isatty() and log.isEnabledFor(logging.INFO))
    finally:
        if remote:
            with contextlib.suppress(OSError):
                os.remove(local)
