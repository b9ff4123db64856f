"""Keep CPUs out of deep idle while requests flow (a PM QoS request).

Reading a file nobody has read costs two FUSE round trips (LOOKUP, READ), each a
hand-off between the reader and the daemon. When the CPU the other side waits on
has halted, waking it dominates the cost: on a 2-vCPU VM with guest halt polling
off, cold reads ran at ~4,000 files/s with halted CPUs and ~24,000 with this
request held. Writing 0 to /dev/cpu_dma_latency asks the kernel to keep idle CPUs
in a polling state; the request lasts while the file stays open, so the daemon
holds it only while requests arrive and drops it after a second without any.
Needs write access to /dev/cpu_dma_latency (root); silently off otherwise.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time

log = logging.getLogger(__name__)

QOS_DEVICE = "/dev/cpu_dma_latency"


class LatencyGuard:
    """`touch()` on every request; the guard holds the PM QoS request while
    touches keep coming and releases it `idle` seconds after the last."""

    def __init__(self, enabled: bool = True, idle: float = 1.0, device: str = QOS_DEVICE) -> None:
        self.device = device
        self.idle = idle
        self.enabled = enabled and os.access(device, os.W_OK)
        self._fd: int | None = None
        self._last = 0.0
        self._held = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._release_when_idle, daemon=True,
                                            name="mmfs-latency")
            self._thread.start()

    def touch(self) -> None:
        """Called on each request: cheap unless the request must be taken."""
        self._last = time.monotonic()
        if self._fd is None and self.enabled:
            self._acquire()

    def _acquire(self) -> None:
        try:
            fd = os.open(self.device, os.O_WRONLY | os.O_CLOEXEC)
            os.write(fd, struct.pack("i", 0))
        except OSError as exc:
            log.debug("no PM QoS request (%s): %s", self.device, exc)
            self.enabled = False
            return
        self._fd = fd
        self._held.set()

    def _release_when_idle(self) -> None:
        while not self._stop:
            self._held.wait()
            while not self._stop and time.monotonic() - self._last < self.idle:
                time.sleep(self.idle / 4)
            fd, self._fd = self._fd, None
            self._held.clear()
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        self._stop = True
        self._held.set()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
