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


# The folder holding this mmfs package. The child drops the current folder from its
# path (where `python -c` and `-m` look first: a source checkout's mmfs/ would be
# found there) and puts this folder first only when it is not on the path already
# (a site-packages stays behind the standard library).
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN_MODULE = ("import sys, importlib; home, module = sys.argv.pop(1), sys.argv.pop(1); "
               "sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
               "home in sys.path or sys.path.insert(0, home); "
               "sys.exit(importlib.import_module(module).main(sys.argv[1:]))")


def mmfs_command(*args: str) -> list[str]:
    """The command line that runs `mmfs ARGS` in a child process with this very mmfs,
    whatever folder the child starts in (`python -m mmfs.cli` would import an `mmfs/`
    of that folder)."""
    return module_command("mmfs.cli", *args)


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs `module.main([ARGS])` of this very mmfs in a child
    process (its return value is the exit code), as mmfs_command does the CLI."""
    return [sys.executable, "-c", _RUN_MODULE, _PACKAGE_PARENT, module, *args]
