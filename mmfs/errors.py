"""Errors a user can cause. Each message names the file (and the key, field or
byte offset) and says what to do; the CLI prints it on one line and exits 2."""

import errno
import resource


class MmfsError(Exception):
    """Base of every error caused by input rather than by a bug in mmfs."""


class FormatError(MmfsError):
    """A dataset file (.bin/.idx/.pbin) is missing, corrupt or inconsistent."""


class ConfigError(MmfsError):
    """The YAML config is malformed or asks for something impossible."""


class CacheError(MmfsError):
    """An index cache file cannot be written or read."""


class MountError(MmfsError):
    """The mount point or the FUSE daemon is not usable."""


class NativeError(MmfsError):
    """The C core rejected its input (an index that does not fit the data)."""


class PreprocessError(MmfsError):
    """`mmfs preprocess` cannot read its input, load its tokenizer or write its output."""


def causes(exc: BaseException | None) -> list[BaseException]:
    """An error and those it was raised while handling (`raise ... from None` included)."""
    found: list[BaseException] = []
    while exc is not None and len(found) < 16:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


def out_of_descriptors(exc: BaseException) -> str | None:
    """descriptors_exhausted of the first error in exc's chain that ran out of
    file descriptors (whatever words an error put it in), or None."""
    return next(filter(None, map(descriptors_exhausted, causes(exc))), None)


def descriptors_exhausted(exc: BaseException) -> str | None:
    """The one line for an OSError that ran out of file descriptors (a limit the
    user sets), naming `ulimit -n` and what to set it to; None for any other error.
    Standard library only: it runs where no file may be left to import from."""
    if not isinstance(exc, OSError) or exc.errno not in (errno.EMFILE, errno.ENFILE):
        return None
    what = exc.filename or "a file"
    if exc.errno == errno.ENFILE:
        return (f"{what}: the system's table of open files is full ({exc.strerror}); close other "
                "programs' files or raise fs.file-max, and run again")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * soft if hard == resource.RLIM_INFINITY else min(hard, 4 * soft)
    if wanted <= soft:
        return (f"{what}: too many open files: `ulimit -n` is {soft}, the hard limit; raise the hard "
                "limit (limits.conf, or the service's LimitNOFILE) and run again")
    return (f"{what}: too many open files (`ulimit -n` is {soft}); raise it, e.g. `ulimit -n {wanted}`, "
            "and run again")


SHOWN = 5  # items a message or log line lists before it summarises the rest


def first_few(items: list[str], sep: str = ", ", shown: int = SHOWN) -> str:
    """`items` joined, or, past `shown`, the first few and a count: one line stays short
    at ten thousand datasets."""
    if len(items) <= shown:
        return sep.join(items)
    return f"{sep.join(items[:shown])}{sep}... ({len(items):,} in all)"
