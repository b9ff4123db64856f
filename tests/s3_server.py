"""A real S3-protocol server for the object-storage tests (moto's server mode, in
its own process on 127.0.0.1), and a proxy between mmfs and it that injects
faults: delays, 5xx answers, cut connections, truncated bodies, an endpoint
that is down. It also counts what it passes on (benchmarks/object_storage.py
measures with it)."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mmfs-test", "AWS_SECRET_ACCESS_KEY": "mmfs-test-secret",
               "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """moto's S3 server on 127.0.0.1 (objects in its memory)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300  # a hang guard: moto imports slowly on a loaded machine
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("moto's server did not start")
        import boto3

        self.client = boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_REGION"]).client("s3", endpoint_url=self.url)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        with contextlib.suppress(self.client.exceptions.BucketAlreadyOwnedByYou):
            self.client.create_bucket(Bucket=bucket)
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of `target`. Set a fault and how many
    requests it hits (GETs of object bytes only, unless `every` is set; with
    `period` n, the 1st, (n+1)-th, ... attempt at each object and Range: counted per
    range, so which attempts fail does not depend on how concurrent requests interleave):
    fault = "503" | "500" | "cut" | "truncate" | "deny" | "shift" (a 206 of the range
    two bytes on, of the same length, with its own honest Content-Range) | "hang"
    (the request is taken and never answered, until `release()`) | "trickle" (the
    headers, then the body at a byte a second) | "flip" (a byte of the body changed) |
    "301" | "307" (a redirect to `location` + the request's path, with no body) |
    None; with `match`, only requests whose path holds it; `down` refuses every
    connection; `delay` (seconds) before each request. `connections` counts the
    connections made to it; `in_flight` the ranged GETs taken and not yet answered
    (from their arrival to the first byte of their answer, so never more than a
    client has sent), `peak_in_flight` the most at once since `reset_peak()`.
    Quirks of some stores, on every request: `drop_if_match` passes requests on
    without their If-Match (a store that ignores it); `expired_tokens` answers a
    request signed with one of those session tokens as S3 does an expired one
    (400 ExpiredToken)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.fault: str | None = None
        self.remaining = 0
        self.every = False
        self.period = 1
        self._matching: dict[tuple[str, str], int] = {}  # attempts seen per (path, Range) since inject
        self.down = False
        self.delay = 0.0
        self.requests = 0
        self.ranged_gets = 0
        self.ranged_bytes = 0  # body bytes of the answers to ranged GETs
        self.gets = self.get_bytes = 0  # every GET (ranged or not) answered, and its body bytes
        self.ranges: list[tuple[str, str]] | None = None  # (path, Range) of each ranged GET, when a list
        self.seen: list[tuple[str, str, str]] | None = None  # (method, path, Range) of every request, when a list
        self.injected = 0
        self.connections = 0
        self.in_flight = self.peak_in_flight = 0
        self.match: str | None = None
        self.location = ""
        self.drop_if_match = False
        self.expired_tokens: set[str] = set()
        self.refused_tokens = 0  # requests answered ExpiredToken
        self._released = threading.Event()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args) -> None:
                pass

            def handle(self) -> None:
                if proxy.down:
                    self.connection.close()
                    return
                with proxy._lock:
                    proxy.connections += 1
                super().handle()

            def _any(self) -> None:
                proxy._serve(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # a burst of new connections is not dropped (a SYN resent after 1 s)

            def handle_error(self, request, client_address) -> None:
                pass  # a client that hung up (a daemon unmounted mid-request)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def inject(self, fault: str | None, count: int = 1, every: bool = False, period: int = 1) -> None:
        if fault in ("hang", "trickle"):
            self._released.clear()
        with self._lock:
            self.fault, self.remaining, self.every, self.period = fault, count, every, period
            self._matching = {}

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_in_flight = self.in_flight

    def _arrived(self) -> list:
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        return [True]

    def _answering(self, ticket: list) -> None:
        """A ranged GET is about to be answered (or dropped): no longer in flight (once)."""
        if ticket and ticket.pop():
            with self._lock:
                self.in_flight -= 1

    def release(self) -> None:
        """End the fault, and let every hung request go (each connection is closed)."""
        self.inject(None)
        self._released.set()

    def _take_fault(self, h: BaseHTTPRequestHandler, ranged: bool) -> str | None:
        with self._lock:
            if self.seen is not None:
                self.seen.append((h.command, h.path, h.headers.get("Range", "")))
            self.requests += 1
            self.ranged_gets += ranged
            hit = self.match is None or self.match in h.path
            if self.fault and self.remaining > 0 and (ranged or self.every) and hit:
                attempt = (h.path, h.headers.get("Range", ""))
                self._matching[attempt] = seen = self._matching.get(attempt, 0) + 1
                if (seen - 1) % self.period:
                    return None
                self.remaining -= 1
                self.injected += 1
                return self.fault
            return None

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        ticket = self._arrived() if h.command == "GET" and "Range" in h.headers else []
        try:
            self._answer(h, ticket)
        finally:
            self._answering(ticket)

    def _answer(self, h: BaseHTTPRequestHandler, ticket: list) -> None:
        if self.delay:
            time.sleep(self.delay)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        fault = self._take_fault(h, h.command == "GET" and "Range" in h.headers)
        if h.headers.get("x-amz-security-token") in self.expired_tokens:
            with self._lock:
                self.refused_tokens += 1
            fault = "expired"
        if fault in ("301", "307"):
            self._answering(ticket)
            h.send_response(int(fault))
            h.send_header("Location", self.location + h.path)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if fault == "hang":
            self._released.wait(600)
            h.close_connection = True
            return
        if fault == "shift":
            first, _, last = h.headers["Range"].removeprefix("bytes=").partition("-")
            del h.headers["Range"]
            h.headers["Range"] = f"bytes={int(first) + 2}-{int(last) + 2}"
        if fault == "cut" or self.down:
            self._answering(ticket)
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault in ("503", "500", "deny", "expired"):
            status, code = {"503": (503, "SlowDown"), "500": (500, "InternalError"),
                            "deny": (403, "AccessDenied"), "expired": (400, "ExpiredToken")}[fault]
            payload = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                       f"<Message>injected</Message></Error>").encode()
            self._answering(ticket)
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(payload)
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.target_port, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if not (self.drop_if_match and k.lower() == "if-match")}
            conn.request(h.command, h.path, body=body, headers=headers)
            answer = conn.getresponse()
            length = answer.getheader("Content-Length")
            # a long body (rclone's open-ended ranges) is passed on as it comes, not held whole
            stream = fault is None and h.command == "GET" and length is not None and int(length) > STREAM_FROM
            data = b"" if stream else answer.read()
        except OSError:
            conn.close()
            h.close_connection = True
            return
        if not stream:
            conn.close()
        self._answering(ticket)
        h.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                h.send_header(k, v)
        # a HEAD answer's length is the object's, with no body
        h.send_header("Content-Length", (length or "0") if h.command == "HEAD" or stream else str(len(data)))
        h.end_headers()
        sent = self._stream(h, answer, conn) if stream else len(data)
        if h.command == "HEAD":
            return
        if fault == "truncate" and len(data) > 1:
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "flip" and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        if fault == "trickle":
            for i in range(len(data)):
                if self._released.wait(1.0):
                    break
                try:
                    h.wfile.write(data[i:i + 1])
                    h.wfile.flush()
                except OSError:
                    break
            h.close_connection = True
            return
        if stream:  # (counted once passed on: only then is its length known)
            self._count_answer(h, sent)
        else:  # counted before the client can have it: a test that read it finds it counted
            self._count_answer(h, len(data))
            h.wfile.write(data)

    def _count_answer(self, h: BaseHTTPRequestHandler, sent: int) -> None:
        if h.command == "GET":
            with self._lock:
                self.gets += 1
                self.get_bytes += sent
        if h.command == "GET" and "Range" in h.headers:
            with self._lock:
                self.ranged_bytes += sent
                if self.ranges is not None:
                    self.ranges.append((h.path, h.headers["Range"]))

    def _stream(self, h: BaseHTTPRequestHandler, answer: http.client.HTTPResponse,
                conn: http.client.HTTPConnection) -> int:
        """Pass a long body on in pieces; the bytes sent."""
        sent = 0
        try:
            while chunk := answer.read(1 << 16):
                h.wfile.write(chunk)
                sent += len(chunk)
        except OSError:  # the client hung up (rclone closes a stream it no longer wants)
            h.close_connection = True
        finally:
            conn.close()
        return sent

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


STREAM_FROM = 1 << 20  # bytes of a body the proxy holds whole before passing it on


def use_test_credentials(monkeypatch) -> None:
    """This process talks to the test server only: its credentials, no profile,
    endpoint, session token, MSC config or AWS config files of the machine's."""
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "MSC_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


def environment(extra: dict | None = None) -> dict:
    """The environment of an mmfs process talking to the test server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDENTIALS)
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    env.update(extra or {})
    return env
