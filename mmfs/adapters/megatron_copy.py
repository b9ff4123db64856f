"""The files a Megatron-LM job reads from a mount, copied into a plain folder, for a
machine where FUSE cannot run (a container without /dev/fuse): copy on a machine that
has the data, bring the folder, and point the provider at it. The provider reads the
copy the same way (mmfs.loader.Mount takes a folder of a mount's files).

    copy_job_files("/mnt/data", "run-files", data_parallel_size=8,
                   reads={"train": (4, 0, 1000), "valid": (4, 0, 40)})   # split: (mbs, from, micro-batches)
    copy_job_files("run.yaml", "run-files", ...)   # from the config itself, served in this process, no mount

The files are read through the Mount's file interface (mmfs/loader/files.py): the
kernel's for a mount point, the C core's in this process for a config, so a copy made
from a config holds the same bytes, attributes and manifest as one made from a mount of it.

The copy holds mmfs.json, each rank's micro-batch files of the streams the job reads
(`<split>/streams/dp=D,mbs=M,from=C/RRR/NNNNNNN.bin`, as many as it reads; a restart
phase's own valid or test with a fourth entry, its phase: `<split>/phases/<PPP>/streams/`),
and mmfs-attributes.json, the extended attributes the loader reads that a copy may
lose (`user.mmfs.samples` of each micro-batch file, `user.mmfs.pieces` of each of their
samples), and, written last, mmfs-copy.json, the copy's manifest (every file's size
and SHA-256, every stream folder's files and first and last sample: what
mmfs/loader/copy_check.py checks before a job trains on it). Copying again into the
same folder adds to it (one call per launch of a job relaunched at its phase
transitions). A job that reads further than the copy is refused before it starts.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable

from mmfs.adapters.megatron import rank_stream_files
from mmfs.loader import COPIED_ATTRIBUTES, Mount
from mmfs.loader.copy_check import COPY_FORMAT, COPY_MANIFEST, DIGEST, digest, file_digest, stream_ends, stream_numbers
from mmfs.loader.files import copied_attributes, read_file
from mmfs.mount import contract


def copy_job_files(mount_path: str | os.PathLike, dest: str | os.PathLike, data_parallel_size: int,
                   reads: dict[str, tuple[int, int, int]]) -> dict[str, int]:
    """Copy what every data-parallel rank reads of each split (of a mount point, or of a
    config served in this process): reads[split] =
    (micro_batch_size, consumed_samples it starts at, micro-batches per rank[, the
    restart phase whose own valid or test it reads]). Returns the files and bytes copied."""
    mount = Mount(mount_path)
    paths: list[str] = []
    for split, (mbs, consumed, count, *phase) in reads.items():
        for rank in range(data_parallel_size):
            files = rank_stream_files(mount, split, rank, data_parallel_size, mbs, consumed, *phase)
            paths.extend(itertools.islice(files, count))
            # the folder even where nothing of it is read: the provider lists each loader's
            # first folder when it is built (a launch builds a test loader it never reads)
            folder = mount.stream_dir(split, rank, data_parallel_size, mbs, consumed, phase=(phase or [None])[0])
            os.makedirs(os.path.join(dest, os.path.relpath(folder, mount.path)), exist_ok=True)
    return copy_files(mount, dest, paths)


def copy_files(mount: Mount, dest: str | os.PathLike, paths: Iterable[str]) -> dict[str, int]:
    """Copy micro-batch files of `mount` (with mmfs.json) to `dest`, keeping their
    paths, and write their attributes and their samples' pieces beside them, then,
    last, the copy's manifest (mmfs-copy.json: every file's size and digest, every
    stream folder's files and first and last sample). Until it is written the folder
    reads as an incomplete copy; adding to a copy removes it first."""
    dest = os.fspath(dest)
    os.makedirs(dest, exist_ok=True)
    before = _previous(dest)
    attributes = (copied_attributes(dest) or {}) if before else {}  # a complete copy made before, added to
    files: dict[str, list] = dict(before.get("files", {})) if before else {}
    folders = {os.path.join(dest, rel) for rel in (before or {}).get("streams", {})}
    folders.update(os.path.join(root, d) for root, dirs, _ in os.walk(dest) for d in dirs
                   if os.path.basename(root) != contract.PHASES and d.isdigit())  # rank folders (made by the caller)
    files[contract.MANIFEST] = list(_copy(mount, os.path.join(mount.path, contract.MANIFEST),
                                          os.path.join(dest, contract.MANIFEST)))
    copied = size = 0
    for path in paths:
        rel = os.path.relpath(path, mount.path)
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        files[rel] = list(_copy(mount, path, target))
        folders.add(os.path.dirname(target))
        copied += 1
        size += files[rel][0]
        samples = mount.attribute(path, contract.XATTR_SAMPLES)
        attributes[rel] = {contract.XATTR_SAMPLES: samples}
        split, phase = mount.folder_of(path)  # (a restart phase's own valid or test: its own samples)
        for i in samples.split():
            sample = mount.sample_path(split, int(i), phase)
            key = os.path.relpath(sample, mount.path)
            if key not in attributes:
                attributes[key] = {contract.XATTR_PIECES: mount.attribute(sample, contract.XATTR_PIECES)}
    _write(os.path.join(dest, COPIED_ATTRIBUTES), json.dumps(attributes, sort_keys=True).encode("utf-8"))
    files[COPIED_ATTRIBUTES] = list(file_digest(os.path.join(dest, COPIED_ATTRIBUTES)))
    streams = {}
    for folder in sorted(folders):
        rel = os.path.relpath(folder, dest)
        streams[rel] = stream_ends(attributes, rel, stream_numbers(folder, _leftovers_removed(folder, rel, files)))
    os.sync()  # the files on disk before the manifest that vouches for them
    table = {"format": COPY_FORMAT, "digest": DIGEST, "files": files, "streams": streams}
    _write(os.path.join(dest, COPY_MANIFEST), json.dumps(table, sort_keys=True).encode("utf-8"))
    return {"files": copied, "bytes": size}


def _previous(dest: str) -> dict | None:
    """The manifest of a complete copy in dest (removed: the folder is a copy in the
    making until the new one is written), or None."""
    path = os.path.join(dest, COPY_MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        return None
    os.unlink(path)
    return table if isinstance(table, dict) else None


def _leftovers_removed(folder: str, rel: str, files: dict[str, list]) -> list[str]:
    """A stream folder's micro-batch files, less those no manifest records: left by a copy
    that was cut short (cut files among them), removed so that no stream reads them."""
    names = []
    for name in os.listdir(folder):
        if not name.endswith(contract.FILE_SUFFIX):
            continue
        if os.path.join(rel, name) in files:
            names.append(name)
        else:
            os.unlink(os.path.join(folder, name))
    return names


def _copy(mount: Mount, source: str, target: str) -> tuple[int, str]:
    """Copy one file of the mount (read whole through its file interface: micro-batch
    files are small; a failed read is the loader's one line), (its size, digest)."""
    data = read_file(mount.files, source)
    _write(target, data)
    return len(data), digest(data)


def _write(path: str, data: bytes | bytearray) -> None:
    """Write a file whole under a temporary name, then rename it into place (a copy cut
    short leaves no file of the wrong size under a real name)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
