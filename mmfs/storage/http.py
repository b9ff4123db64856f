"""The HTTP under the fetch path: one ranged GET is one libcurl transfer (pycurl),
signed by libcurl (CURLOPT_AWS_SIGV4), its answer checked against the range asked
for and written into the caller's buffer, ended at its deadline however the store
answers.

Why libcurl: a ranged GET through botocore costs about 1 ms of CPU, one through
libcurl well under a tenth of that (benchmarks/s3_clients.py, docs/benchmarks.md).
Nothing here retries: remote.py counts attempts, once.

- A deadline covers the whole answer (connect, first byte and body):
  CURLOPT_TIMEOUT_MS, so a store that never answers or trickles the body fails the
  attempt at the bound.
- Connections: one libcurl handle per thread (made in this process: a handle does
  not survive a fork), each keeping its connection to the store, so the
  connections open are at most the threads that fetch; one idle longer than
  IDLE_SECONDS is not reused (stores close idle connections).
"""

from __future__ import annotations

import os
import re
import threading

IDLE_SECONDS = 10
ERROR_BODY = 64 << 10  # bytes of an error answer kept (its S3 error code)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)$")


class BadAnswer(Exception):
    """An answer that cannot be this range's bytes (wrong range, wrong length, cut)."""


class Redirect(Exception):
    """A 3xx answer: the store sends the request elsewhere (`location`, "" if it names
    no place), which is not followed."""

    def __init__(self, status: int, location: str) -> None:
        super().__init__(f"HTTP {status} to {location or 'no Location'}")
        self.status, self.location = status, location


class OtherVersion(Exception):
    """A 206 of another version of the object than the one asked for by If-Match
    (`etag`: the answer's own), as a store that ignores If-Match answers."""

    def __init__(self, etag: str) -> None:
        super().__init__(f"an answer of the object with ETag {etag}")
        self.etag = etag


def _pycurl():
    try:
        import pycurl
    except ImportError:
        from mmfs.storage.base import StorageUnavailable
        raise StorageUnavailable("s3:// datasets need pycurl: pip install 'mmfs[s3]'") from None
    return pycurl


class _Answer:
    """One transfer's answer as it comes: header lines kept, a 206 body checked
    against the range asked for before its first byte is written to the buffer."""

    __slots__ = ("offset", "buffer", "n", "at", "lines", "status", "bad", "error", "if_match", "other",
                 "location")

    def __init__(self, offset: int, buffer: memoryview, if_match: str | None = None) -> None:
        self.offset, self.buffer, self.n, self.at = offset, buffer, len(buffer), 0
        self.lines: list[bytes] = []  # every header line (libcurl appends them, a call of C)
        self.status = 0
        self.bad = ""
        self.error = b""
        self.if_match = if_match
        self.other = ""  # the ETag of a 206 of another version than if_match's
        self.location = ""  # a 3xx answer's

    def head(self) -> None:
        """Status and checks from the header lines of the last answer (a 100 Continue's are skipped)."""
        starts = [i for i, line in enumerate(self.lines) if line.startswith(b"HTTP/")]
        if not starts:
            self.status, self.bad = -1, "an answer without a status line"
            return
        lines = self.lines[starts[-1]:]
        self.status = int(lines[0].split(None, 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().decode("latin-1")
        if 300 <= self.status < 400:
            self.location = fields.get(b"location", "")
        if self.status == 200:
            self.bad = f"the store answered the whole object, not bytes {self.offset}..{self.offset + self.n}"
        elif self.status == 206:
            etag = fields.get(b"etag")
            if self.if_match and etag is not None and _weakless(etag) != _weakless(self.if_match):
                self.other = etag
                return
            found, length = fields.get(b"content-range"), fields.get(b"content-length")
            matched = _CONTENT_RANGE.match(found or "")
            end = self.offset + self.n - 1
            if not matched or int(matched.group(1)) != self.offset or int(matched.group(2)) != end:
                shown = found if found is not None else "no Content-Range"
                self.bad = f"answered {shown!r}, not bytes {self.offset}-{end}"
            elif length is not None and int(length) != self.n:
                self.bad = f"a body of {length} bytes for a range of {self.n}"

    def write(self, data: bytes) -> int | None:
        if not self.status:
            self.head()
        if self.bad or self.other:
            return 0  # libcurl ends the transfer (CURLE_WRITE_ERROR)
        if self.status != 206:
            if len(self.error) < ERROR_BODY:
                self.error += data[:ERROR_BODY - len(self.error)]
            return None
        end = self.at + len(data)
        if end > self.n:
            self.bad = f"a body longer than the range's {self.n} bytes"
            return 0
        self.buffer[self.at:end] = data
        self.at = end
        return None


class Endpoint:
    """GETs to one scheme://host:port; `get_range` is one attempt."""

    def __init__(self, url: str) -> None:
        self.base = url.rstrip("/")
        self.opened = 0  # connections made (benchmarks count them)
        self._local = threading.local()

    def _handle(self):
        pycurl = _pycurl()
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # first use in this thread and process
            c = pycurl.Curl()
            c.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for timeouts
            c.setopt(pycurl.PROXY, "")  # the store itself, as botocore's HEAD reached it
            c.setopt(pycurl.MAXAGE_CONN, IDLE_SECONDS)
            c.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
            local.curl, local.pid = c, os.getpid()
        return local.curl

    def get_range(self, path: str, headers: list[str], offset: int, buffer: memoryview, timeout: float,
                  sign: tuple[str, str, str, str, str | None] | None, if_match: str | None = None) -> tuple[int, str]:
        """One GET of `path` for bytes [offset, offset + len(buffer)) (the Range
        header is added here, and If-Match when `if_match` is an ETag), finished
        within `timeout` seconds and signed with `sign` = (region, service, access
        key, secret key, session token), or not at all (None). Returns (status, S3
        error code or ""); a 206 answer's body is in `buffer`, checked against the
        range asked for. Raises BadAnswer for an answer that is not that range,
        OtherVersion for one of another ETag than `if_match`, Redirect for a 3xx,
        OSError for a failed connection or a deadline passed."""
        pycurl = _pycurl()
        c = self._handle()
        answer = _Answer(offset, buffer, if_match)
        headers = [*headers, f"Range: bytes={offset}-{offset + answer.n - 1}"]
        if if_match:
            headers.append(f"If-Match: {if_match}")
        if sign is not None:
            region, service, key, secret, token = sign
            c.setopt(pycurl.AWS_SIGV4, f"aws:amz:{region}:{service}")
            c.setopt(pycurl.USERPWD, f"{key}:{secret}")
            if token:
                headers.append(f"x-amz-security-token: {token}")
        else:
            c.unsetopt(pycurl.USERPWD)
            c.setopt(pycurl.AWS_SIGV4, None)
        c.setopt(pycurl.URL, self.base + path)
        c.setopt(pycurl.HTTPHEADER, headers)
        ms = max(1, int(timeout * 1000))
        c.setopt(pycurl.CONNECTTIMEOUT_MS, ms)
        c.setopt(pycurl.TIMEOUT_MS, ms)  # the whole transfer: connect, first byte and body
        c.setopt(pycurl.HEADERFUNCTION, answer.lines.append)
        c.setopt(pycurl.WRITEFUNCTION, answer.write)
        try:
            c.perform()
        except pycurl.error as exc:
            code, message = exc.args[0], " ".join(str(exc.args[-1]).split())
            if answer.other:
                raise OtherVersion(answer.other) from None
            if answer.bad:
                raise BadAnswer(answer.bad) from None
            if code == pycurl.E_OPERATION_TIMEDOUT:
                raise TimeoutError(f"no complete answer within {timeout:g} s") from None
            if code == pycurl.E_PARTIAL_FILE:
                raise BadAnswer(f"short body: {answer.at} bytes, then the connection ended") from None
            raise OSError(message or f"libcurl error {code}") from None
        finally:
            self.opened += c.getinfo(pycurl.NUM_CONNECTS)
            # from the transfer's start to the answer's first byte (on a kept connection:
            # the request sent, the store's answer): the store's latency
            self._local.first_byte = c.getinfo(pycurl.STARTTRANSFER_TIME)
        if not answer.status:
            answer.head()  # an answer without a body
        if answer.other:
            raise OtherVersion(answer.other)
        if answer.bad:
            raise BadAnswer(answer.bad)
        if 300 <= answer.status < 400:
            raise Redirect(answer.status, answer.location)
        if answer.status != 206:
            return answer.status, _error_code(answer.error) or str(answer.status)
        if answer.at != answer.n:
            raise BadAnswer(f"short body: {answer.at} of {answer.n} bytes")
        return 206, ""

    def first_byte(self) -> float:
        """Seconds from this thread's last transfer's start to its answer's first byte."""
        return getattr(self._local, "first_byte", 0.0)


def _weakless(etag: str) -> str:
    """An ETag without its weak marker (W/) and quotes (a store may quote it in one
    answer and not in another)."""
    return etag.removeprefix("W/").strip('"')


def _error_code(body: bytes) -> str:
    found = re.search(rb"<Code>([^<]{1,100})</Code>", body)
    return found.group(1).decode("ascii", "replace") if found else ""
