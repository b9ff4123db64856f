"""Telling the kernel to forget what it cached of a file that changed: libfuse's
fuse_lowlevel_notify_inval_entry (mfusepy declares none of these calls), which libfuse 2
takes on the session's channel and libfuse 3 on the session itself. The one file of a
mount that changes is report.html (a note while the page is made, then the page:
mmfs/mount/report_file.py); the kernel holds every size for a day otherwise."""

from __future__ import annotations

import ctypes
import errno
import logging
import os

from mmfs.mount.libfuse import binding, library

log = logging.getLogger(__name__)
ROOT_NODE = 1  # FUSE_ROOT_ID: the node id of the mount's root

_libfuse = binding()._libfuse
_V3 = library().major == 3
try:  # (libfuse >= 2.8)
    _libfuse.fuse_get_session.restype = ctypes.c_void_p
    _libfuse.fuse_get_session.argtypes = [ctypes.c_void_p]
    if not _V3:
        _libfuse.fuse_session_next_chan.restype = ctypes.c_void_p
        _libfuse.fuse_session_next_chan.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    _libfuse.fuse_lowlevel_notify_inval_entry.restype = ctypes.c_int
    _libfuse.fuse_lowlevel_notify_inval_entry.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p,
                                                          ctypes.c_size_t]
    NOTIFIES = True
except AttributeError:
    NOTIFIES = False


class KernelCache:
    """The kernel's cache of one mount, as libfuse's channel (2) or session (3) reaches it."""

    def __init__(self) -> None:
        self._channel: int | None = None

    def learn_channel(self) -> None:
        """Take the channel from the context of the request being served (call it from a
        handler; the kernel's first request, the root's getattr, is one)."""
        if self._channel is None and NOTIFIES:
            context = _libfuse.fuse_get_context()
            fuse = context.contents.fuse if context else None
            session = _libfuse.fuse_get_session(fuse) if fuse else None
            if _V3 or not session:
                self._channel = session
            else:
                self._channel = _libfuse.fuse_session_next_chan(session, None)

    def forget_root_entry(self, name: str) -> None:
        """Have the kernel drop its entry of the root's file `name`, and with it the size it
        holds (from any thread): the next open looks the file up again."""
        encoded = name.encode()
        rc = -errno.ENOTCONN if self._channel is None else _libfuse.fuse_lowlevel_notify_inval_entry(
            self._channel, ROOT_NODE, encoded, len(encoded))
        if rc not in (0, -errno.ENOENT):  # ENOENT: the kernel held no entry
            log.warning("%s: the kernel could not be told it changed (%s); it shows what it has for a day "
                        "(attr_timeout) or until the next mount", name, os.strerror(-rc))
