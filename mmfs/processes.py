"""Other processes, as the caches see them (lock owners, per-process folders)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
