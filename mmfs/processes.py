"""Other processes: as the caches see them (lock owners, per-process folders), and
the command line that starts an mmfs child."""

from __future__ import annotations

import os
import sys


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The folder holding this mmfs package: a child put it first on its path imports
# this mmfs, not an `mmfs/` folder in its current directory (a source checkout).
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN_CLI = "import sys; sys.path.insert(0, sys.argv.pop(1)); from mmfs.cli import main; sys.exit(main())"


def mmfs_command(*args: str) -> list[str]:
    """The command line that runs `mmfs ARGS` in a child process with this very mmfs,
    whatever folder the child starts in (`python -m mmfs.cli` would put that folder
    first on its path)."""
    return [sys.executable, "-c", _RUN_CLI, _PACKAGE_PARENT, *args]
