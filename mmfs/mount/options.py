"""`mmfs mount -o ...`, parsed and checked once: mmfs's own options, typed, and
the rest, which go to libfuse as given (libfuse names what it refuses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmfs.errors import MountError
from mmfs.mount.repeats import FOLD_SECONDS
from mmfs.storage.localfiles import DEFAULT_OPEN_FILES

# Index and token files the daemon keeps in memory, at most (the smallest
# first); it reads the rest with pread, so its resident memory stays flat
# whatever the config's size.
DEFAULT_MAP_LIMIT_MB = 64

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class MountOptions:
    """threads:      libfuse's multithreaded loop instead of the single thread
                     (slower for local data, see docs/benchmarks.md; None: only
                     when a dataset is in object storage, where reads wait on the
                     network and must not wait on each other)
    low_latency:     keep idle CPUs polling while requests flow (latency.py)
    map_limit_mb:    MB of index and token files the daemon keeps in memory
    open_files:      dataset and index files the daemon keeps open at most (the
                     others are opened when read, the least recently used closed)
    nonempty:        mount over a non-empty folder (also passed to libfuse)
    log_fold:        seconds: reads that fail the same way are one log line, then
                     one line with their count per this (0: a line per failed read)
    fuse:            every other option, for libfuse: {name: value, or True}"""

    threads: bool | None = None
    low_latency: bool = False
    map_limit_mb: int = DEFAULT_MAP_LIMIT_MB
    open_files: int = DEFAULT_OPEN_FILES
    nonempty: bool = False
    log_fold: float = FOLD_SECONDS
    fuse: dict[str, Any] = field(default_factory=dict)


# What `mmfs mount --help` says of each option mmfs reads itself, and of the libfuse
# options a user most often needs (any other goes to libfuse as given).
OPTION_HELP = {
    "threads[=0|1]": "serve with several threads (default: only when a dataset is in object storage)",
    "low_latency": "keep idle CPUs polling while requests flow (off by default)",
    "map_limit_mb=N": f"MB of index and token files the daemon keeps in memory (default {DEFAULT_MAP_LIMIT_MB}; "
                      "it reads the rest with pread)",
    "open_files=N": f"dataset and index files the daemon keeps open at most (default {DEFAULT_OPEN_FILES}; "
                    "it opens the others when read)",
    "nonempty": "mount over a folder that is not empty",
    "log_fold=SECONDS": f"reads that fail the same way: one log line, then one with their count per SECONDS "
                        f"(default {FOLD_SECONDS:g}; 0: a line per failed read)",
    "allow_other": "let other users read the mount (libfuse; as a user, needs user_allow_other in /etc/fuse.conf)",
}


def options_help() -> str:
    """The options of OPTION_HELP as one line of `--help`."""
    return "; ".join(f"{name}: {text}" for name, text in OPTION_HELP.items())


# mmfs's own flags; `nothreads` and `foreground` are accepted (and dropped) for
# the command lines of fusepy's (and mfusepy's) own examples.
_FLAGS = ("threads", "low_latency", "nothreads", "foreground")
# mmfs's own numbers: the least each takes, and what it counts.
_COUNTS = {"map_limit_mb": (0, "megabytes"), "open_files": (8, "files")}


def _flag(key: str, value: str | bool) -> bool:
    if value is True or str(value).lower() in _TRUE:
        return True
    if str(value).lower() in _FALSE:
        return False
    raise MountError(f"-o {key}={value}: give {key} alone, or {key}=1 / {key}=0")


def parse_mount_options(text: str | None) -> MountOptions:
    """`-o a=b,c` -> MountOptions; a bad option is one line naming it."""
    own: dict[str, Any] = {}
    fuse: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        key, sep, value = item.partition("=")
        value = value if sep else True
        if not key:
            raise MountError(f"-o {item}: an option needs a name before '='")
        if key in _FLAGS:
            own[key] = _flag(key, value)
        elif key in _COUNTS:
            least, unit = _COUNTS[key]
            try:
                own[key] = int(value) if value is not True else -1
            except ValueError:
                own[key] = -1
            if own[key] < least:
                raise MountError(f"-o {key}={'' if value is True else value}: give a whole number "
                                 f"of {unit} ({least} or more)")
        elif key == "log_fold":
            own[key] = _seconds(key, value)
        elif key == "rw":
            raise MountError("mmfs mounts are read-only; drop `-o rw`")
        else:
            fuse[key] = value
    threads = False if own.get("nothreads") else own.get("threads")
    return MountOptions(threads=threads, low_latency=own.get("low_latency", False),
                        map_limit_mb=own.get("map_limit_mb", DEFAULT_MAP_LIMIT_MB),
                        open_files=own.get("open_files", DEFAULT_OPEN_FILES),
                        nonempty=fuse.get("nonempty") is True, log_fold=own.get("log_fold", FOLD_SECONDS),
                        fuse=fuse)


def _seconds(key: str, value: str | bool) -> float:
    try:
        seconds = float(value) if value is not True else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise MountError(f"-o {key}={'' if value is True else value}: give a number of seconds (0 or more)")
    return seconds
