"""MOUNT/report.html: the page `mmfs report` makes of the mounted config, made on
first use and kept. An `mmfs report` child process makes it, so that the plotting
libraries (and the JavaScript runtime that bundles the page's scripts) never load
into the daemon. When it cannot be made (the `mmfs[report]` extra is missing, say)
the file is a short page that says why and what to do, as the child said it."""

from __future__ import annotations

import html
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable

from mmfs.processes import mmfs_command

log = logging.getLogger(__name__)
ERROR_PREFIX = "mmfs: error: "
TIMEOUT = 600.0  # seconds: a page of a blend of a thousand datasets takes some


class MadeFile:
    """A file whose bytes are made on first use (its size is asked first) and kept."""

    def __init__(self, make: Callable[[], bytes], mtime_ns: int) -> None:
        self._make = make
        self._data: bytes | None = None
        self._lock = threading.Lock()
        self.mtime_ns = mtime_ns

    @property
    def data(self) -> bytes:
        with self._lock:
            if self._data is None:
                self._data = self._make()
            return self._data


def report_page(config_path: str) -> bytes:
    """The page of `mmfs report CONFIG`, or a page saying why there is none."""
    folder = tempfile.mkdtemp(prefix="mmfs-report-")
    out = os.path.join(folder, "report.html")
    cmd = mmfs_command("-q", "report", config_path, "-o", out)
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, errors="replace", timeout=TIMEOUT)
        if done.returncode == 0:
            with open(out, "rb") as f:
                return f.read()
        lines = [line[len(ERROR_PREFIX):] for line in done.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
        why = lines[-1] if lines else f"mmfs report exited with code {done.returncode}: {done.stderr[-500:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"mmfs report could not run: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    log.error("report.html: %s", why)
    return not_made_page(why).encode("utf-8")


def not_made_page(why: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mmfs report</title></head><body>"
            f"<h1>mmfs report</h1><p>This mount's report could not be made: {html.escape(why)}</p>"
            "<p>Once that is fixed, mount again, or run <code>mmfs report CONFIG -o report.html</code>.</p>"
            "</body></html>\n")
