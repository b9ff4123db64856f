"""A config's mount served in the calling process, without FUSE: the loader's file
system (mmfs/loader/files.py) for `mmfs.loader.Mount(CONFIG)`, where no mount can be
made (a container without /dev/fuse or CAP_SYS_ADMIN, an unprivileged Kubernetes pod).

Nothing here knows a view. The config is opened as `mmfs mount` opens it
(lifecycle.open_tree: the same corpus, indices, cache and Tree, then the index copies
the daemon takes before it serves), and a path is answered as the daemon answers it:
Tree.lookup (the C core's mmfs_view_find for the views, the tree's own directories,
mmfs.json, the stream layouts made on lookup), a view's file read by mmfs_view_read,
the C function the FUSE read handler calls, and the extended attributes the daemon's
getxattr returns. So the bytes are the mount's, and errors are the kernel's: ENOENT,
ENOTDIR, EISDIR, ENODATA, and EIO carrying the C core's account of a read that failed.

Paths are CONFIG/<path in the mount> (CONFIG as the loader was given it). One Tree per
config file in a process, shared by the Mounts that read it while any holds it.
"""

from __future__ import annotations

import errno
import os
import threading
import weakref
from typing import Any

from mmfs.errors import MmfsError, MountError
from mmfs.mount.contract import STREAMS
from mmfs.mount.lifecycle import open_tree
from mmfs.mount.options import parse_mount_options
from mmfs.mount.tree import Dir, Generated, Link, Tree

IN_PROCESS_OPTIONS = ("map_limit_mb", "open_files")  # the rest are the daemon's or libfuse's
MAX_LINKS = 40  # symbolic links followed in one path (the kernel's limit)

_trees: weakref.WeakValueDictionary[tuple, Tree] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def in_process_files(config: str, options: str = "") -> InProcessFiles:
    """The files of `config`'s mount, served in this process (its Tree opened once
    while in use; a config file changed since is opened anew). options: `mmfs mount -o`'s
    that apply without FUSE (IN_PROCESS_OPTIONS)."""
    for option in filter(None, (o.strip() for o in options.split(","))):
        name = option.split("=", 1)[0]
        if name not in IN_PROCESS_OPTIONS:
            raise MountError(f"-o {name}: not an option of a config read in this process (only "
                             f"{', '.join(IN_PROCESS_OPTIONS)}); it is one of `mmfs mount`'s")
    parsed = parse_mount_options(options)
    st = os.stat(config)
    key = (os.path.realpath(config), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, parsed.map_limit_mb,
           parsed.open_files)
    with _lock:  # one opening at a time: a second Mount of the config waits, then shares it
        tree = _trees.get(key)
        if tree is None:
            tree = open_tree(config, parsed)
            placer = getattr(tree.corpus, "placer", None)
            if placer is not None:
                placer.load()  # as the daemon does before it serves: copies of the small index arrays
            _trees[key] = tree
    return InProcessFiles(config, tree)


def _error(code: int, path: str, why: str | None = None) -> OSError:
    return OSError(code, why or os.strerror(code), path)


class InProcessFiles:
    """The loader's file system over a Tree (see the module's doc)."""

    def __init__(self, root: str, tree: Tree) -> None:
        self.root = root
        self.tree = tree

    def _node(self, path: str) -> Any:
        """The node at a path under root, its symbolic links followed; OSError as the kernel's."""
        rel = os.path.normpath(os.path.relpath(path, self.root))
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            raise _error(errno.ENOENT, path, f"not a file of the mount of {self.root}")
        where = "/" if rel == os.curdir else "/" + rel
        node = self._lookup(where, path)
        if node is None or isinstance(node, Link):  # a link on the way (MOUNT/samples/...) or at the end
            node = self._walk(where, path)
        return node

    def _lookup(self, where: str, path: str) -> Any:
        try:
            return self.tree.lookup(where)
        except MmfsError as exc:
            raise _error(errno.EIO, path, str(exc)) from None

    def _walk(self, where: str, path: str) -> Any:
        """The node at `where`, each of its components looked up, links followed (the
        mount's are relative, within it)."""
        parts, at, links = where.split("/"), "", 0
        while parts:
            part = parts.pop(0)
            if part in ("", os.curdir):
                continue
            if part == os.pardir:
                at = at.rpartition("/")[0]
                continue
            node = self._lookup(f"{at}/{part}", path)
            if node is None:
                raise _error(errno.ENOENT, path, self._refusal(at, part))
            if isinstance(node, Link):
                links += 1
                if links > MAX_LINKS:
                    raise _error(errno.ELOOP, path)
                parts = node.target.split("/") + parts
                continue
            at = f"{at}/{part}"
        return self._lookup(at or "/", path)

    def _refusal(self, folder: str, name: str) -> str | None:
        """Why a stream layout folder is not there (what the daemon logs): "no such
        stream: ...", or None."""
        parent, found, split = folder.rpartition(f"/{STREAMS}")
        why = self.tree.streams.refusal(parent.lstrip("/"), name) if found and not split else None
        return None if why is None else f"no such stream: {why}"

    def read(self, path: str) -> bytearray:
        node = self._node(path)
        if isinstance(node, Dir):
            raise _error(errno.EISDIR, path)
        try:
            size = self.tree.attr(node).size
            buf = bytearray(size)
            if isinstance(node, Generated):  # a view's file: the C core reads it into buf
                n = (node.registry or self.tree.registry).read_into(node.view, node.index, 0, buf)
            else:
                data = self.tree.read(node, 0, size)
                n = len(data)
                buf[:n] = data
        except MmfsError as exc:  # the C core's account: the file, the byte, the reason
            raise _error(errno.EIO, path, str(exc)) from None
        if n != size:
            raise _error(errno.EIO, path, f"ended after {n} of {size} bytes")
        return buf

    def listdir(self, path: str) -> list[str]:
        node = self._node(path)
        if not isinstance(node, Dir):
            raise _error(errno.ENOTDIR, path)
        return [name for name, _mode in self.tree.entries(node)]

    def getxattr(self, path: str, name: str) -> str:
        node = self._node(path)
        try:
            value = self.tree.xattr(node, name)
        except MmfsError as exc:
            raise _error(errno.EIO, path, str(exc)) from None
        if value is None:
            raise _error(errno.ENODATA, path)
        return value.decode()
