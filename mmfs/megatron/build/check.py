"""Before one GPTDataset is built: are its sequences sound, and do its indices
fit in memory (and on disk)? Each refusal is one line naming the key to change."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time

import numpy as np

from mmfs.errors import ConfigError, FormatError
from mmfs.formats.chunks import element_offset, iter_array
from mmfs.megatron.cache.write import not_a_folder, told_once
from mmfs.megatron.indices.gpt import INT32_MAX, GptParams, gib, plan_epochs, predict_gpt_size

log = logging.getLogger(__name__)

CHECK_CHUNK = 1 << 20  # sequences checked per numpy pass (bounded temporary memory)


def check_sequences(dataset, beg: int, end: int) -> int:
    """The tokens in sequences [beg, end); raise FormatError naming the file, the
    sequence and the byte offset unless every one has a length >= 0 and its tokens
    inside the token data. O(1) per sequence, vectorised; the C reader would
    otherwise fail (EIO) on the first sample that reaches a bad sequence."""
    lo, hi = dataset.data_section
    item = dataset.dtype.itemsize
    verify = f"run `mmfs verify {dataset.path_prefix}`"
    # read with plain file reads, not through the maps: a long-lived process that
    # built the indices (the mount) keeps no pointer pages resident for it
    chunks = zip(iter_array(dataset, "sequence_lengths", CHECK_CHUNK, beg, end),
                 iter_array(dataset, "sequence_pointers", CHECK_CHUNK, beg, end))
    tokens = 0
    for (start, lengths), (_, pointers) in chunks:
        if not lengths.size:
            continue
        # the common, sound case in a few reductions (pointers <= hi cannot overflow)
        if int(lengths.min()) >= 0 and int(pointers.min()) >= lo and int(pointers.max()) <= hi:
            ends = np.multiply(lengths, item, dtype=np.int64)
            ends += pointers
            if int(ends.max()) <= hi:
                tokens += int(lengths.sum(dtype=np.int64))
                continue
        lengths = lengths.astype(np.int64)
        pointers = pointers.astype(np.int64, copy=False)
        # clip so that a wild pointer cannot overflow; the real value is reported
        ends = np.clip(pointers, lo, hi) + np.maximum(lengths, 0) * item
        bad = (lengths < 0) | (pointers < lo) | (pointers > hi) | (ends > hi)
        i = int(np.argmax(bad))
        seq, length, ptr = start + i, int(lengths[i]), int(pointers[i])
        if length < 0:
            raise FormatError(
                f"{dataset.idx_path}: sequence {seq}: {element_offset(dataset, 'sequence_lengths', seq)}"
                f" is {length}, negative; the index is corrupt ({verify})")
        raise FormatError(
            f"{dataset.bin_path}: sequence {seq} spans bytes {ptr}..{ptr + length * item} "
            f"({element_offset(dataset, 'sequence_pointers', seq)} of {dataset.idx_path} is "
            f"{ptr}, length {length}), outside the token data (bytes {lo}..{hi}); the index is "
            f"corrupt or does not belong to this data file ({verify})")
    return tokens


def _reused_briefly(fn):
    """fn's answer for the same arguments, reused for half a second: a blend of
    thousands of datasets asks for every index it builds."""
    answers: dict = {}

    @functools.wraps(fn)
    def wrapper(*args):
        now = time.monotonic()
        hit = answers.get(args)
        if hit is None or now - hit[0] > 0.5:
            hit = answers[args] = (now, fn(*args))
        return hit[1]

    return wrapper


@_reused_briefly
def available_memory() -> tuple[int, str]:
    """(bytes a build may take, where that figure comes from): MemAvailable, or the
    physical memory, capped by the cgroup's memory limit."""
    avail, source = None, "available memory"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        avail, source = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "memory"
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f, open(usage_file) as g:
                room = int(f.read().strip()) - int(g.read().strip())
        except (OSError, ValueError):
            continue
        if room < avail:
            avail, source = max(room, 0), "room under the cgroup memory limit"
        break
    return avail, source


@_reused_briefly
def free_disk(folder: str) -> int | None:
    """Free bytes on the file system that holds (or will hold) `folder`."""
    path = os.path.abspath(folder)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def uncreatable(folder: str) -> str | None:
    """Why `folder` cannot be made and what to do (a file in its path: that file named;
    no permission, a file system that makes no folders), or None where it is there or
    was made now: the build makes it anyway, and only making it tells (free space below
    an uncreatable folder is the free space of some other file system)."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        why = not_a_folder(folder)
        return why or f"{exc.strerror or exc}; set cache_dir to a folder this user can create"
    return None if os.path.isdir(folder) else not_a_folder(folder)


def check_gpt_build(dataset, p: GptParams, cache_folder: str | None, config_path: str,
                    samples_key: str) -> int:
    """Before one GPTDataset is built: its sequences are sound (check_sequences) and
    its indices fit in memory, else one line naming the key (`samples_key`, what the
    split's sample count comes from, or the dataset for a one-epoch split) and the
    sizes; a cache folder without room for them is a warning (they are built in
    memory). Returns the split's tokens."""
    tokens = check_sequences(dataset, p.beg, p.end)
    if tokens <= 0:
        return tokens  # the builder names an empty split
    size = predict_gpt_size(p, plan_epochs(p, tokens))
    if p.num_samples is not None:
        key = samples_key
        what = (f"{p.num_samples:,} {p.split} samples from {p.dataset_path} "
                f"({size.epochs:,} epochs of {p.end - p.beg:,} sequences) need")
    else:
        key = p.dataset_path
        what = f"one epoch of its {p.split} split ({size.samples:,} samples) needs"
    # one epoch is the least Megatron builds, whatever the sample count
    fix = (f"lower {key}" if size.epochs > 1 else
           f"give the {p.split} split a smaller share of `split`, or check the dataset "
           f"(`mmfs verify {dataset.path_prefix}`)")
    prefix = f"{config_path}: {key}: {what}"
    memory, source = available_memory()
    if size.peak > memory:
        raise ConfigError(
            f"{prefix} {gib(size.peak)} of memory to build their indices (document index "
            f"{gib(size.document_index)}, sample index {gib(size.sample_index)}, shuffle index "
            f"{gib(size.shuffle_index)}), more than the {gib(memory)} of {source}; {fix}")
    if size.epochs > INT32_MAX:
        raise ConfigError(f"{prefix} more than 2**31 - 1 epochs, beyond Megatron's int32 "
                          f"epoch count; {fix}")
    if cache_folder is not None and (why := uncreatable(cache_folder)) is not None:
        if told_once(cache_folder):  # once per folder, not once per dataset
            log.warning("%s: cache_dir %s cannot be created, so the indices are built in memory and not "
                        "cached: %s", config_path, cache_folder, why)
        return tokens
    free = None if cache_folder is None else free_disk(cache_folder)
    if free is not None and size.total > free:
        # It fits in memory (checked above): build there, and say why nothing is cached.
        log.warning("%s %s of index cache, more than the %s free in %s; they are built in memory "
                    "and not cached: free some space, or set cache_dir to a folder with room",
                    prefix, gib(size.total), gib(free), cache_folder)
    return tokens
