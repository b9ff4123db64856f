"""The HTTP under the fetch path: ranged GETs on connections of our own, each
answer checked against the range asked for and read straight into the caller's
buffer, each attempt ended at its deadline however the store answers.

Why not a general client: a ranged GET through botocore costs about 3 ms of CPU
(benchmarks/s3_clients.py); this path costs a tenth of that. Nothing here retries:
remote.py counts attempts, once.

- A deadline covers the whole answer (connect, first byte and body): one thread
  per process (`Deadlines`) shuts the socket of a request past its deadline, so a
  store that never answers or trickles the body fails the attempt at the bound.
- Connections are kept per endpoint, as many idle as can be in flight (`pool`);
  one idle longer than IDLE_SECONDS is closed rather than reused (stores close
  idle connections, and a request sent on a closed one would be a lost attempt).
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import os
import re
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

IDLE_SECONDS = 10.0
ERROR_BODY = 64 << 10  # bytes of an error answer read (its S3 error code)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)$")


class BadAnswer(Exception):
    """An answer that cannot be this range's bytes (wrong range, wrong length, cut)."""


class Deadlines:
    """One thread that shuts the socket of every request past its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pid = -1
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, socket.socket] = {}
        self._seq = itertools.count()

    def watch(self, sock: socket.socket, deadline: float) -> int:
        with self._cond:
            if self._pid != os.getpid():  # first use in this process (a fork has no thread)
                self._pid, self._heap, self._live = os.getpid(), [], {}
                threading.Thread(target=self._run, name="mmfs-deadlines", daemon=True).start()
            seq = next(self._seq)
            self._live[seq] = sock
            heapq.heappush(self._heap, (deadline, seq))
            if self._heap[0][1] == seq:
                self._cond.notify()
            return seq

    def done(self, seq: int) -> bool:
        """Stop watching; False when the deadline came first (the socket was shut)."""
        with self._cond:
            return self._live.pop(seq, None) is not None

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)  # finished in time
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, seq = self._heap[0]
                now = time.monotonic()
                if deadline > now:
                    self._cond.wait(deadline - now)
                    continue
                heapq.heappop(self._heap)
                sock = self._live.pop(seq)
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # a blocked read or write returns at once
                except OSError:
                    pass


class Endpoint:
    """Connections to one scheme://host:port, reused; `get_range` is one attempt."""

    def __init__(self, url: str, pool: int, deadlines: Deadlines) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.hostname = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.host = parts.netloc.rpartition("@")[2]  # the Host header (and what SigV4 signs)
        self.pool = pool
        self.deadlines = deadlines
        self._context = ssl.create_default_context() if self.https else None
        self._idle: list[tuple[float, http.client.HTTPConnection]] = []
        self._lock = threading.Lock()
        self.opened = 0  # connections made (tests and benchmarks count them)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                since, conn = self._idle.pop()
                if now - since < IDLE_SECONDS:
                    return conn
                conn.close()
            self.opened += 1
        if self.https:
            return http.client.HTTPSConnection(self.hostname, self.port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(self.hostname, self.port, timeout=timeout)

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.pool:
                self._idle.append((time.monotonic(), conn))
                return
        conn.close()

    def get_range(self, path: str, headers: dict[str, str], offset: int, buffer: memoryview,
                  timeout: float) -> tuple[int, str, http.client.HTTPMessage | None]:
        """One GET of `path` for bytes [offset, offset + len(buffer)) (the Range
        header is added here), finished within `timeout` seconds. Returns
        (status, S3 error code or "", headers); a 206 answer's body is in `buffer`,
        checked against the range asked for. Raises BadAnswer for an answer that is
        not that range, OSError for a failed connection or a deadline passed."""
        n = len(buffer)
        headers = {**headers, "Range": f"bytes={offset}-{offset + n - 1}"}
        deadline = time.monotonic() + timeout
        conn = self._connection(timeout)
        ok = False
        watch = None
        try:
            if conn.sock is None:
                conn.connect()  # bounded by the socket timeout
            watch = self.deadlines.watch(conn.sock, deadline)
            conn.request("GET", path, headers=headers)
            answer = conn.getresponse()
            if answer.status != 206:
                body = answer.read(ERROR_BODY) if answer.status >= 300 else b""
                code = _error_code(body) or str(answer.status)
                if answer.status == 200:
                    raise BadAnswer(f"the store answered the whole object, not bytes {offset}..{offset + n}")
                ok = answer.isclosed() and not answer.will_close  # an error answer read whole
                return answer.status, code, answer.msg
            _check_range(answer, offset, n)
            got = answer.readinto(buffer)
            if got != n:
                raise BadAnswer(f"short body: {got} of {n} bytes")
            ok = not answer.will_close
            return 206, "", answer.msg
        except (http.client.HTTPException, ValueError) as exc:
            raise BadAnswer(_describe(exc)) from None
        finally:
            cut = watch is not None and not self.deadlines.done(watch)
            if cut:
                ok = False
            if ok:
                self._release(conn)
            else:
                conn.close()
            if cut:  # whatever the read raised, the reason is the deadline
                raise TimeoutError(f"no complete answer within {timeout:g} s")


def _check_range(answer: http.client.HTTPResponse, offset: int, n: int) -> None:
    """A 206 answer's Content-Range and Content-Length are the range asked for."""
    found = _CONTENT_RANGE.match(answer.getheader("Content-Range", "").strip())
    if not found or int(found.group(1)) != offset or int(found.group(2)) != offset + n - 1:
        raise BadAnswer(f"answered {answer.getheader('Content-Range', 'no Content-Range')!r}, "
                        f"not bytes {offset}-{offset + n - 1}")
    length = answer.getheader("Content-Length")
    if length is not None and int(length) != n:
        raise BadAnswer(f"a body of {length} bytes for a range of {n}")


def _error_code(body: bytes) -> str:
    found = re.search(rb"<Code>([^<]{1,100})</Code>", body)
    return found.group(1).decode("ascii", "replace") if found else ""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, http.client.IncompleteRead):
        return f"short body: {len(exc.partial)} bytes, then the connection ended"
    return " ".join(str(exc).split()) or type(exc).__name__
