"""Access to the compiled C core (`mmfs._native`, built by pip from native/)."""

import numpy as np

from .errors import MmfsError, NativeError

try:
    from . import _native
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
    lib.MMFS_E_IO: "reading the token file failed",
}


def check(rc: int, what: str) -> int:
    """Raise NativeError for a negative return code of the C core."""
    if rc < 0:
        raise NativeError(f"{what}: {_MESSAGES.get(rc, f'error {rc}')}")
    return rc


def pointer(array: np.ndarray, ctype: str):
    """A C pointer to a C-contiguous numpy array (read-only arrays allowed)."""
    if not array.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    if array.size == 0:
        return ffi.NULL
    return ffi.cast(ctype, array.ctypes.data)
