"""Errors a user can cause. Each message names the file (and the key, field or
byte offset) and says what to do; the CLI prints it on one line and exits 2."""


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
