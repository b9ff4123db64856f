"""MOUNT/report.html: the page `mmfs report` makes of the mounted config, made on
first use and kept. A child process makes it (mmfs/tools/report/mount_page.py), so
that the plotting libraries (and the JavaScript runtime that bundles the page's
scripts) never load into the daemon; when the page cannot be made, the child's page
says why and what to do."""

from __future__ import annotations

import html
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable

from mmfs.processes import module_command

log = logging.getLogger(__name__)
ERROR_PREFIX = "mmfs: error: "
PAGE_MAKER = "mmfs.tools.report.mount_page"  # run as a child: the mount layer imports no tool
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
    cmd = module_command(PAGE_MAKER, config_path, out)
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, errors="replace", timeout=TIMEOUT)
        lines = [line[len(ERROR_PREFIX):] for line in done.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
        if done.returncode in (0, 2) and os.path.isfile(out):
            if done.returncode == 2:
                log.error("report.html: %s", lines[-1] if lines else "not made")
            with open(out, "rb") as f:
                return f.read()
        why = lines[-1] if lines else f"the page maker exited with code {done.returncode}: {done.stderr[-500:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"the page maker could not run: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    log.error("report.html: %s", why)
    return failed_page(why).encode("utf-8")


def failed_page(why: str) -> str:
    """What the mount serves when the page maker itself failed (it writes its own page otherwise)."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mmfs report</title></head><body>"
            f"<h1>mmfs report</h1><p>This mount's report could not be made: {html.escape(why)}</p></body></html>\n")
