"""An ordered process pool that never hangs: `imap`-like over worker processes.

Neither multiprocessing.Pool (waits forever for the task of a killed worker) nor,
before Python 3.12, ProcessPoolExecutor (its shutdown can block on a queue that a
killed worker left full) survives a dead worker. Here each worker has its own pipe
and one parent thread that sends it a task and waits for the answer: a dead worker
is an EOF on that pipe, reported to the caller as an error.

Tasks go to the workers in turn and results come back in task order; at most
`in_flight` tasks per worker are given out at once, so memory stays bounded.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import get_context
from multiprocessing.connection import Connection

from mmfs.errors import MmfsError, PreprocessError

_PR_SET_PDEATHSIG = 1
_STOP = None


class WorkerDied(PreprocessError):
    """A worker process ended without answering (killed, out of memory)."""


def _die_with_parent(parent: int) -> None:
    """Linux: a worker whose parent is killed (SIGKILL, OOM) ends too, instead of lingering."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def _worker_main(conn: Connection, parent: int, initializer: Callable, initargs: tuple,
                 func: Callable) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and cleans up
    _die_with_parent(parent)
    initializer(*initargs)
    while True:
        task = conn.recv()
        if task is _STOP:
            return
        try:
            answer = ("ok", func(task))
        except MmfsError as exc:
            answer = ("error", exc)
        except Exception:  # noqa: BLE001 - a bug: carry its traceback to the parent
            answer = ("bug", traceback.format_exc())
        conn.send(answer)


def _feed(conn: Connection, tasks: queue.SimpleQueue, answers: queue.SimpleQueue) -> None:
    """Parent thread of one worker: send each task, pass its answer on."""
    while True:
        task = tasks.get()
        try:
            conn.send(task)
            if task is _STOP:
                return
            answers.put(conn.recv())
        except (EOFError, OSError):
            answers.put(("died", None))
            return


class OrderedPool:
    """`workers` processes running `func(task)` after `initializer(*initargs)`."""

    def __init__(self, workers: int, func: Callable, initializer: Callable, initargs: tuple,
                 in_flight: int = 2) -> None:
        ctx = get_context("spawn")
        self.in_flight = workers * in_flight
        self.processes = []
        self.tasks: list[queue.SimpleQueue] = []
        self.answers: list[queue.SimpleQueue] = []
        for _ in range(workers):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, daemon=True,
                               args=(child_end, os.getpid(), initializer, initargs, func))
            proc.start()
            child_end.close()
            tasks, answers = queue.SimpleQueue(), queue.SimpleQueue()
            threading.Thread(target=_feed, args=(parent_end, tasks, answers), daemon=True).start()
            self.processes.append(proc)
            self.tasks.append(tasks)
            self.answers.append(answers)

    def imap(self, tasks: Iterable) -> Iterator:
        """Results of `func` for each task, in order; a worker's MmfsError is raised here."""
        order: deque[int] = deque()
        for i, task in enumerate(tasks):
            worker = i % len(self.processes)
            self.tasks[worker].put(task)
            order.append(worker)
            if len(order) >= self.in_flight:
                yield self._answer(order.popleft())
        while order:
            yield self._answer(order.popleft())

    def _answer(self, worker: int):
        kind, value = self.answers[worker].get()
        if kind == "ok":
            return value
        if kind == "error":
            raise value
        if kind == "bug":
            raise RuntimeError(f"a worker failed:\n{value}")
        code = self.processes[worker].exitcode
        raise WorkerDied(f"a worker process died (exit code {code}: killed or out of memory?); "
                         "nothing was written, run again (with fewer --workers?)")

    def close(self, wait: bool = True) -> None:
        """Stop the workers: let them finish (wait) or kill them."""
        for tasks in self.tasks:
            tasks.put(_STOP)
        for proc in self.processes:
            if wait:
                proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def __enter__(self) -> OrderedPool:  # noqa: PYI034
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(wait=exc_type is None)
