"""MOUNT/report.html: the page `mmfs report` makes of the mounted config, made in
the background the first time the file is looked at, and kept.

A child process makes it (mmfs/tools/report/mount_page.py), from the mount's own
snapshot of the config (the Config the mount was opened with, handed over pickled:
a config file edited after mounting changes neither mmfs.json nor the page), so that
the figures and their memory never load into the daemon and no serving thread ever
waits for them. Until the page is made, the file is a short page that says so.

What a reader sees stays whole: the kernel asks a file's size before it reads it
(and caches that size), so the page replaces the note only when the size is asked
next. Once the page is made, the FUSE adapter is told (`on_made`) and has the kernel
forget the file's entry, so that the next open looks the file up, is given the page's
size and reads the page. A reader that was given the note's size reads the note."""

from __future__ import annotations

import html
import logging
import os
import pickle
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from mmfs.processes import module_command

log = logging.getLogger(__name__)
ERROR_PREFIX = "mmfs: error: "
PAGE_MAKER = "mmfs.tools.report.mount_page"  # run as a child: the mount layer imports no tool
TIMEOUT = 600.0  # seconds: a page of a blend of a thousand datasets takes some
BEING_MADE = ("<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>"
              "<meta name='mmfs-report' content='being made'><title>mmfs report: being made</title></head>"
              "<body><h1>mmfs report</h1><p>This mount's report is being made, from the config as it was "
              "mounted (some seconds; longer for a blend of many datasets or phases). This page reloads "
              "itself until the report is ready.</p></body></html>\n").encode("utf-8")


class ReportFile:
    """MOUNT/report.html: the note BEING_MADE, then the page (see the module's doc)."""

    def __init__(self, config: Any, mtime_ns: int) -> None:
        self.mtime_ns = mtime_ns
        self.on_made: Callable[[], None] | None = None  # set by the FUSE adapter
        self.made = threading.Event()  # set once the page (or a page saying why not) is made
        self._config = config  # the mount's own (a frozen Config), pickled for the child
        self._lock = threading.Lock()
        self._served = BEING_MADE  # what a read gets
        self._made: bytes | None = None  # the page, made while the note's size was out
        self._sized_note = False  # whether the note's size was handed out
        self._thread: threading.Thread | None = None
        self._child: subprocess.Popen | None = None
        self._folder: str | None = None  # the child's private folder (snapshot, page) while it runs
        self._closed = False

    @property
    def started(self) -> bool:
        return self._thread is not None

    def size(self) -> int:
        """The size of what a read gets now. The first call starts making the page; a page
        made since the note was sized is served from here on."""
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._make, name="report.html", daemon=True)
                self._thread.start()
            if self._made is not None:
                self._served, self._made = self._made, None
            self._sized_note |= self._served is BEING_MADE
            return len(self._served)

    def read(self, offset: int, size: int) -> bytes:
        return self._served[offset:offset + size]

    def close(self) -> None:
        """Stop a child still making the page and remove its folder (the mount is going
        away: the thread that made the folder is a daemon thread, ended with the process
        before its own clean-up could run)."""
        with self._lock:
            self._closed = True
            child, folder = self._child, self._folder
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def _make(self) -> None:
        data = self._run_child()
        if len(data) == len(BEING_MADE):  # a new size is what makes the kernel drop the note's cached bytes
            data += b"\n"
        with self._lock:
            if self._sized_note:
                self._made = data
            else:
                self._served = data
            told = self._sized_note
        self.made.set()
        if told and self.on_made is not None and not self._closed:
            self.on_made()

    def _run_child(self) -> bytes:
        """The child's page, or a page saying why there is none."""
        t0 = time.monotonic()
        with self._lock:
            if self._closed:
                return b""
            # 0700: the snapshot is this user's; close() removes it if the mount ends first
            folder = self._folder = tempfile.mkdtemp(prefix="mmfs-report-")
        snapshot, out = os.path.join(folder, "config.pickle"), os.path.join(folder, "report.html")
        try:
            with open(snapshot, "wb") as f:
                pickle.dump(self._config, f)
            with self._lock:
                if self._closed:
                    return b""
                self._child = subprocess.Popen(module_command(PAGE_MAKER, snapshot, out), stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                               errors="replace")
            log.info("report.html: being made by a child process (pid %d)", self._child.pid)
            _, stderr = self._child.communicate(timeout=TIMEOUT)
            code = self._child.returncode
            lines = [line[len(ERROR_PREFIX):] for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
            if code in (0, 2) and os.path.isfile(out):
                if code == 2:
                    log.error("report.html: %s", lines[-1] if lines else "not made")
                with open(out, "rb") as f:
                    data = f.read()
                log.info("report.html: made, %d bytes in %.1f s", len(data), time.monotonic() - t0)
                return data
            why = lines[-1] if lines else f"the page maker exited with code {code}: {stderr[-500:]}"
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
            why = f"the page maker took more than {TIMEOUT:.0f} s; run `mmfs report CONFIG -o report.html`"
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
            why = f"the page maker could not run: {exc}"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            with self._lock:
                self._folder = None
        if not self._closed:
            log.error("report.html: %s", why)
        return failed_page(why).encode("utf-8")


def failed_page(why: str) -> str:
    """What the mount serves when the page maker itself failed (it writes its own page otherwise)."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mmfs report</title></head><body>"
            f"<h1>mmfs report</h1><p>This mount's report could not be made: {html.escape(why)}</p></body></html>\n")
