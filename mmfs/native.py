"""Access to the compiled C core (`mmfs._native`, built by pip from native/)."""

import errno
import os
import resource
import threading

import numpy as np

from mmfs.errors import MmfsError, NativeError

try:
    from mmfs import _native
except ImportError as exc:  # pragma: no cover - depends on the install
    raise MmfsError(
        "mmfs's C core (mmfs._native) is not built: run `pip install .` (or `make install`) "
        f"in the mmfs source tree ({exc})"
    ) from None

ffi = _native.ffi
lib = _native.lib

_MESSAGES = {
    lib.MMFS_E_ARG: "an argument is out of range",
    lib.MMFS_E_DOC_RANGE: "a document index entry names a sequence that does not exist",
    lib.MMFS_E_NEG_LENGTH: "a sequence length is negative",
    lib.MMFS_E_OUT_SIZE: "an output array has the wrong size",
    lib.MMFS_E_BIN_RANGE: "a sequence lies outside the token file",
    lib.MMFS_E_INDEX_RANGE: "a sample index entry is out of range",
    lib.MMFS_E_OVERFLOW: "a value does not fit the index dtype",
    lib.MMFS_E_IO: "a file ended early or could not be read",
    lib.MMFS_E_NOMEM: "out of memory",
    lib.MMFS_E_CHANGED: "a file changed since the mount",
}


def file_path(file: int) -> str | None:
    """The path of a local file the C core reads (its id in the open-files table,
    native/mmfs_files.h), or None for an id it does not know."""
    out = ffi.new("char[]", 4096)
    return None if lib.mmfs_file_path(file, out, 4096) < 0 else os.fsdecode(ffi.string(out))


def _file_of(file: int) -> str:
    path = file_path(file)
    return os.path.realpath(path) if path else f"file {file}"


_FETCH_FAILURES: dict[int, tuple[int, str]] = {}  # thread -> (byte, why) of its last failed fetch


def note_fetch_failure(byte: int, why: str) -> None:
    """Why this thread's fetch of a source's bytes at `byte` failed, for the C core's
    error that follows (error_detail puts it in the read's one line)."""
    _FETCH_FAILURES[threading.get_ident()] = (byte, why)


def error_detail(rc: int) -> str:
    """What the C core's last failure on this thread was, in words: the file,
    the byte offset and the sequence it names, and what to do."""
    e = ffi.new("mmfs_error *")
    lib.mmfs_last_error(e)
    what = _MESSAGES.get(rc, f"error {rc}")
    if e.code != rc:
        return what
    if rc == lib.MMFS_E_IO and e.file <= 0:  # a fetched source: why, as its fetch noted it
        byte, why = _FETCH_FAILURES.pop(threading.get_ident(), (-1, ""))
        return why if byte == e.byte and why else f"bytes at {e.byte} of a fetched source could not be read"
    if rc == lib.MMFS_E_IO and e.value in (errno.EMFILE, errno.ENFILE):
        return (f"opening {_file_of(e.file)} failed: {os.strerror(e.value)} (the open-file limit, "
                f"`ulimit -n`, is {open_file_limit()}); raise it, e.g. `ulimit -n {2 * open_file_limit()}`, "
                "and mount again")
    if rc == lib.MMFS_E_IO:
        why = os.strerror(e.value) if e.value else "it ends before that byte"
        return (f"reading {_file_of(e.file)} at byte {e.byte} failed ({why}); the file changed "
                "since the mount? re-run `mmfs mount` (the data must not change while mounted)")
    if rc == lib.MMFS_E_CHANGED:
        return (f"{_file_of(e.file)} changed since the mount (its size, modification time, inode or change "
                "time is not what the indices were made from: replaced or rewritten); re-run `mmfs mount` (the data "
                "must not change while mounted)")
    if rc == lib.MMFS_E_BIN_RANGE:
        return (f"sequence {e.seq} ({e.value} tokens) points to byte {e.byte}, beyond the end "
                "of its token file; the .idx does not match the .bin: run `mmfs verify`")
    if rc == lib.MMFS_E_NEG_LENGTH:
        return f"sequence {e.seq} has negative length {e.value}; run `mmfs verify` on its dataset"
    if rc == lib.MMFS_E_DOC_RANGE:
        return f"{what} (sequence {e.seq}); run `mmfs verify` on its dataset"
    if rc == lib.MMFS_E_INDEX_RANGE:
        detail = f" (sequence {e.seq})" if e.seq >= 0 else f" (entry {e.value})"
        return f"{what}{detail}; the index cache or the .idx is corrupt: delete the cache and remount"
    return what


def open_file_limit() -> int:
    """This process's soft limit on open files (`ulimit -n`)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def check(rc: int, what: str) -> int:
    """Raise NativeError for a negative return code of the C core."""
    if rc == lib.MMFS_E_NOMEM:
        raise NativeError(f"{what}: out of memory; free memory or ask for fewer samples")
    if rc < 0:
        raise NativeError(f"{what}: {error_detail(rc)}")
    return rc


def pointer(array: np.ndarray, ctype: str):
    """A C pointer to a C-contiguous numpy array (read-only arrays allowed)."""
    if not array.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    if array.size == 0:
        return ffi.NULL
    return ffi.cast(ctype, array.ctypes.data)
