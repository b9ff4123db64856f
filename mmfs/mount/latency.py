"""Keep CPUs out of deep idle while requests flow (a PM QoS request).

Reading a file nobody has read costs two FUSE round trips (LOOKUP, READ), each a
hand-off between the reader and the daemon. When the CPU the other side waits on
has halted, waking it dominates the cost: on a 2-vCPU VM with guest halt polling
off, cold reads ran about 4x faster with this request held (see README.md).
Writing 0 to /dev/cpu_dma_latency asks the kernel to keep idle CPUs in a polling
state; the request lasts while the file stays open, so the daemon holds it only
while requests arrive and drops it after a second without any. It changes the
whole machine's power management (while a training job reads, every CPU stays
out of deep idle), so the daemon takes it only when asked: `-o low_latency`.
Needs write access to /dev/cpu_dma_latency (root); the log says when it cannot.

The C core does the work (native/mmfs_latency.c), because most requests are
answered in C and never reach Python.
"""

from __future__ import annotations

import logging
import os

from mmfs.native import ffi, lib

log = logging.getLogger(__name__)

QOS_DEVICE = "/dev/cpu_dma_latency"


class LatencyGuard:
    """`touch()` on every request; the guard holds the PM QoS request while
    touches keep coming and releases it `idle` seconds after the last.
    One per process (the C side is process-wide)."""

    def __init__(self, enabled: bool = False, idle: float = 1.0, device: str = QOS_DEVICE) -> None:
        self.device = device
        self.enabled = enabled and os.access(device, os.W_OK)
        if enabled and not self.enabled:
            log.warning("-o low_latency: cannot write %s (not root?); no PM QoS request", device)
        if self.enabled:
            rc = lib.mmfs_latency_start(ffi.new("char[]", os.fsencode(device)), max(1, int(idle * 1000)))
            if rc < 0:
                log.warning("-o low_latency: no PM QoS request (%s): %s", device, os.strerror(-rc))
                self.enabled = False
            else:
                log.info("-o low_latency: holding a PM QoS request (%s = 0) while requests flow, "
                         "dropped after %.1f s without any", device, idle)

    def touch(self) -> None:
        """Called on each request handled in Python: cheap unless the request must be taken."""
        if self.enabled:
            lib.mmfs_latency_touch()

    @property
    def held(self) -> bool:
        return bool(lib.mmfs_latency_held())

    def set_clock(self, seconds: float | None) -> int:
        """Run the guard on a clock set by hand (tests: its time is only what they set,
        whatever the machine's speed), at `seconds`; None: the real clock again. The
        releaser looks at the new time at once; returns the count of its looks before
        (`checks` passes it once it has looked)."""
        return lib.mmfs_latency_set_clock(-1 if seconds is None else int(round(seconds * 1000)))

    @property
    def checks(self) -> int:
        """How many times the releaser has looked at how long the guard was idle."""
        return lib.mmfs_latency_checks()

    def close(self) -> None:
        if self.enabled:
            lib.mmfs_latency_stop()
            self.enabled = False
