"""The text input, read as chunks in bounded memory: JSONL as raw lines (plain, .gz or
.zst), Parquet as records of the wanted columns (see parquet.py).

Lines are split as Megatron's tool sees them: it iterates a text-mode file, so
"\\n", "\\r\\n" and a lone "\\r" each end a line.
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mmfs.errors import PreprocessError

# Input bytes per chunk a worker gets: small keeps workers' memory low, big keeps
# the hand-offs few.
CHUNK_BYTES = 1 << 17
CHUNK_LINES = 4096


PARQUET_SUFFIX = ".parquet"
COMPRESSED_SUFFIXES = (".gz", ".zst")
# What a text dataset path of a config ends with (anything else is an IndexedDataset).
TEXT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", PARQUET_SUFFIX)


def is_text_input(path: str) -> bool:
    return path.endswith(TEXT_SUFFIXES)


@dataclass
class Chunk:
    """Consecutive documents, first_line being the 1-based line (or row) number of the
    first: JSONL lines as read, or (Parquet) records already holding the keys."""

    first_line: int
    lines: list[bytes] | list[dict[str, Any]]
    nbytes: int


def _open_zstd(path: str) -> io.BufferedIOBase:
    try:
        from compression import zstd  # Python >= 3.14
        return zstd.open(path, "rb")
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        raise PreprocessError(f"{path}: reading .zst needs the `zstandard` package "
                              "(pip install zstandard) or Python >= 3.14") from None
    return io.BufferedReader(_ZstdFrames(path, zstandard.ZstdDecompressor()))


class _ZstdFrames(io.RawIOBase):
    """Every frame of a .zst file (parallel or appended writes make several), and an
    EOFError when the file ends inside a frame: zstandard's stream reader returns what
    it decompressed so far, so a truncated file read as fewer documents."""

    def __init__(self, path: str, decompressor) -> None:
        self._raw = open(path, "rb")  # noqa: SIM115 - closed with this reader
        self._zstd = decompressor
        self._frame = decompressor.decompressobj()
        self._out = memoryview(b"")  # decompressed, not yet read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._out:
            data = self._raw.read(1 << 20)
            if not data:
                if not self._frame.eof and self._started:
                    raise EOFError("the file ends inside a zstd frame")
                return 0
            self._started = True
            out = []
            while data:
                out.append(self._frame.decompress(data))
                data = b""
                if self._frame.eof:  # the next frame starts in what is left over
                    data, self._frame = self._frame.unused_data, self._zstd.decompressobj()
                    self._started = bool(data)
            self._out = memoryview(b"".join(out))
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    _started = False

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_input(path: str) -> io.BufferedIOBase:
    """Open the input for binary reading, decompressing by extension; one-line errors."""
    if os.path.isdir(path):
        raise PreprocessError(f"{path}: is a directory; --input takes a .jsonl (.gz, .zst) or .parquet file")
    try:
        if path.endswith(COMPRESSED_SUFFIXES):
            f = gzip.open(path, "rb") if path.endswith(".gz") else _open_zstd(path)
            f.peek(1)  # a file that does not decompress fails here, with its name
            return f
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except PreprocessError:
        raise
    except Exception as exc:  # OSError, EOFError, or a decompressor's own error class
        raise PreprocessError(f"{path}: cannot read the input ({getattr(exc, 'strerror', None) or exc}); "
                              "check the path, its permissions and that the file is whole") from None


def _split_cr(line: bytes) -> list[bytes]:
    """A binary line holding "\\r" as a text-mode reader splits it."""
    parts = line.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def read_chunks(path: str, stream: io.BufferedIOBase, max_line: int) -> Iterator[Chunk]:
    """Yield the input's lines in chunks of about CHUNK_BYTES; a line longer than
    `max_line` bytes is refused before it is read whole."""
    line_no = 1
    lines: list[bytes] = []
    nbytes = 0
    try:
        while raw := stream.readline(max_line + 1):
            if len(raw) > max_line and not raw.endswith(b"\n"):
                raise PreprocessError(
                    f"{path}:{line_no + len(lines)}: a line longer than {max_line:,} bytes; raise "
                    "--max-line-bytes if the document is real (it is held in memory whole)")
            for line in _split_cr(raw) if b"\r" in raw else (raw,):
                lines.append(line)
                nbytes += len(line)
                if nbytes >= CHUNK_BYTES or len(lines) >= CHUNK_LINES:
                    yield Chunk(line_no, lines, nbytes)
                    line_no += len(lines)
                    lines, nbytes = [], 0
    except PreprocessError:
        raise
    except Exception as exc:  # OSError, EOFError, or a decompressor's own error class
        raise PreprocessError(f"{path}: cannot read the input after line {line_no + len(lines) - 1} "
                              f"({exc}); is the file truncated or corrupt?") from None
    if lines:
        yield Chunk(line_no, lines, nbytes)
