"""A plain folder copy of a mount's files (mmfs/adapters/megatron_copy.py) checked
before it is trained on: its manifest, `mmfs-copy.json`, written last, names every
file with its size and digest and every stream folder with its files and first and
last sample. A copy without it was cut short (a full disk, an interrupted copy) or is
no copy at all; a file missing, cut or altered is one line naming it.

What is checked when (docs/megatron.md, "A copy for a machine without FUSE"):
- opening: mmfs.json and mmfs-attributes.json against their sizes and digests (both
  are read anyway);
- listing a stream folder (the provider lists each loader's first folder when it
  is built): its names against the manifest (the first missing one is named), each
  file's size (one stat each, no read);
- reading a micro-batch file: its bytes against the digest (hashing what was read,
  nothing read twice). A job's start never reads the copy's data through.

The digest is SHA-256 (hashlib): the fastest of the standard library's digests on
CPUs with SHA instructions (x86 SHA-NI, ARMv8 crypto), which training nodes have:
419 MB/s against BLAKE2b's 239 MB/s on the 2-core build machine (docs/benchmarks.md)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from mmfs.loader.files import COPIED_ATTRIBUTES, LoaderError
from mmfs.mount import contract

COPY_MANIFEST = "mmfs-copy.json"
COPY_FORMAT = "mmfs-copy 1"
DIGEST = "sha256"
AGAIN = "copy the folder again (mmfs.adapters.megatron_copy.copy_job_files)"
MOUNT_FSTYPE = f"fuse.{contract.FS_SUBTYPE}"  # a mount's file system type, as the kernel lists it


def digest(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: str) -> tuple[int, str]:
    """(size, digest) of a file, read once in 1 MiB pieces."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def stream_numbers(folder: str, names: list[str]) -> list[str]:
    """The micro-batch file names of a stream folder in their order, refused where the
    numbering has a gap (a file missing: the stream would skip to the next's data)."""
    numbered = sorted((int(n[:-len(contract.FILE_SUFFIX)]), n) for n in names
                      if n.endswith(contract.FILE_SUFFIX) and n[:-len(contract.FILE_SUFFIX)].isdigit())
    for j, (i, name) in enumerate(numbered):
        if i != j:
            width = len(name) - len(contract.FILE_SUFFIX)
            raise LoaderError(f"{os.path.join(folder, contract.file_name(j, width))}: missing (the folder holds "
                              f"{name} after it): the stream has a gap; mount again or {AGAIN}")
    return [n for _, n in numbered]


def filesystem_type(path: str) -> str | None:
    """The type of the file system that holds `path` (/proc/self/mountinfo), None where
    it cannot be told."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    target, best, kind = os.path.realpath(path), "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040: a space
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, right.split()[0]
    return kind


class CopyManifest:
    """A copy's mmfs-copy.json: checks of its files as they are opened, listed and read."""

    def __init__(self, root: str, table: dict[str, Any]) -> None:
        self.root = root
        self.path = os.path.join(root, COPY_MANIFEST)
        if table.get("format") != COPY_FORMAT or table.get("digest") != DIGEST or \
                not isinstance(table.get("files"), dict) or not isinstance(table.get("streams"), dict):
            raise LoaderError(f"{self.path}: not a manifest of format {COPY_FORMAT!r} with {DIGEST} digests; {AGAIN}")
        self.files: dict[str, list] = table["files"]
        self.streams: dict[str, dict[str, Any]] = table["streams"]

    def _recorded(self, path: str) -> tuple[str, int, str]:
        rel = os.path.relpath(path, self.root)
        entry = self.files.get(rel)
        if entry is None:
            raise LoaderError(f"{path}: not in the copy's {COPY_MANIFEST} (a file added or renamed since the "
                              f"copy); {AGAIN}")
        return rel, int(entry[0]), str(entry[1])

    def check_bytes(self, path: str, data: bytes | bytearray) -> None:
        """A file read whole against its size and digest."""
        _rel, size, want = self._recorded(path)
        if len(data) != size:
            raise LoaderError(f"{path}: {len(data)} bytes, the copy recorded {size} (cut short or altered); {AGAIN}")
        if digest(data) != want:
            raise LoaderError(f"{path}: its bytes differ from the copy's ({DIGEST} {want[:16]}...): altered since "
                              f"the copy; {AGAIN}")

    def check_file(self, path: str) -> None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise LoaderError(f"{path}: cannot read it ({exc.strerror or exc}): the copy is incomplete; "
                              f"{AGAIN}") from None
        self.check_bytes(path, data)

    def check_stream(self, folder: str, names: list[str],
                     attributes: dict[str, dict[str, str]]) -> None:
        """A stream folder's files (stream_numbers' order) against the manifest: every
        file it recorded there, each of its size, its first and last sample."""
        rel = os.path.relpath(folder, self.root)
        entry = self.streams.get(rel)
        if entry is None:
            raise LoaderError(f"{folder}: not a stream folder of the copy ({COPY_MANIFEST} names none there); "
                              f"the job reads a stream the copy was not made for: {AGAIN} with this job's reads")
        count = int(entry["files"])
        if len(names) < count:
            width = len(names[0]) - len(contract.FILE_SUFFIX) if names else contract.MIN_NAME_WIDTH
            missing = os.path.join(folder, contract.file_name(len(names), width))
            raise LoaderError(f"{missing}: missing ({len(names)} of the {count} files the copy holds there): the "
                              f"copy is incomplete; {AGAIN}")
        if len(names) > count:
            raise LoaderError(f"{os.path.join(folder, names[count])}: not in the copy's {COPY_MANIFEST} (it "
                              f"recorded {count} files there); {AGAIN}")
        for name in names:
            path = os.path.join(folder, name)
            _r, size, _d = self._recorded(path)
            try:
                have = os.stat(path).st_size
            except OSError as exc:
                raise LoaderError(f"{path}: cannot stat it: {exc.strerror or exc}; {AGAIN}") from None
            if have != size:
                raise LoaderError(f"{path}: {have} bytes, the copy recorded {size} (cut short or altered); {AGAIN}")
        if names:
            ends = (_sample(attributes, rel, names[0], 0), _sample(attributes, rel, names[-1], -1))
            recorded = (entry.get("first_sample"), entry.get("last_sample"))
            if ends != recorded:
                raise LoaderError(f"{folder}: its stream runs from sample {ends[0]} to {ends[1]}, the copy recorded "
                                  f"{recorded[0]} to {recorded[1]} ({COPIED_ATTRIBUTES} altered); {AGAIN}")


def _sample(attributes: dict[str, dict[str, str]], rel_folder: str, name: str, which: int) -> int | None:
    ids = attributes.get(os.path.join(rel_folder, name), {}).get(contract.XATTR_SAMPLES, "").split()
    return int(ids[which]) if ids else None


def stream_ends(attributes: dict[str, dict[str, str]], rel_folder: str, names: list[str]) -> dict[str, Any]:
    """A stream folder's entry of the manifest (the copy writer's)."""
    if not names:
        return {"files": 0, "first_sample": None, "last_sample": None}
    return {"files": len(names), "first_sample": _sample(attributes, rel_folder, names[0], 0),
            "last_sample": _sample(attributes, rel_folder, names[-1], -1)}


def open_copy(root: str, manifest_bytes: bytes, copied: dict | None) -> CopyManifest | None:
    """The copy's manifest, mmfs.json and the attributes table checked against it; None
    for a mount. A folder with neither a mount nor a complete copy's manifest is refused."""
    path = os.path.join(root, COPY_MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except FileNotFoundError:
        if copied is not None:
            raise LoaderError(f"{path}: not found: the copy is incomplete (a copy writes it last; one cut short by "
                              f"a full disk or a stop has none) or made by an older mmfs; {AGAIN}") from None
        kind = filesystem_type(root)
        if kind is not None and kind != MOUNT_FSTYPE:
            raise LoaderError(f"{root}: not an mmfs mount ({kind} file system) and not a complete copy of one (no "
                              f"{COPY_MANIFEST} or {COPIED_ATTRIBUTES}): mount the config there, or {AGAIN}") from None
        return None
    except (OSError, ValueError) as exc:
        raise LoaderError(f"{path}: cannot read it: {exc}; {AGAIN}") from None
    if not isinstance(table, dict):
        raise LoaderError(f"{path}: not a mapping; {AGAIN}")
    manifest = CopyManifest(root, table)
    manifest.check_bytes(os.path.join(root, contract.MANIFEST), manifest_bytes)
    if copied is None:
        raise LoaderError(f"{os.path.join(root, COPIED_ATTRIBUTES)}: not found: the copy is incomplete; {AGAIN}")
    manifest.check_file(os.path.join(root, COPIED_ATTRIBUTES))
    return manifest
