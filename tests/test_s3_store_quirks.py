"""Stores that do not behave as S3 does, through the fault proxy in front of the real
S3-protocol server (tests/s3_server.py): a store that redirects every request is
one line, exit 2, and no request goes where it points; a store that ignores
If-Match while the object is replaced serves no wrong file; a session token
renewed in the shared credentials file is taken without a remount."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from s3_server import CREDENTIALS, FaultProxy  # noqa: E402
from test_s3 import BUCKET, GOLDEN, local_mount, proxy, remote, server, write_configs  # noqa: E402, F401

from mount_fixtures import HANG_GUARD, mmfs, mounted, read_errno, samples  # noqa: E402

# -- redirects ---------------------------------------------------------------------


@pytest.fixture
def elsewhere(server):  # noqa: F811 - the fixture
    """A working store at another address, where the redirects point: it counts what reaches it."""
    other = FaultProxy(server.port)
    yield other
    other.close()


@pytest.mark.parametrize("status", ["301", "307"])
def test_a_store_that_redirects_every_request_is_one_line_and_no_request_follows(
        tmp_path, proxy, elsewhere, status, monkeypatch):  # noqa: F811 - the fixture
    proxy.location = elsewhere.url
    proxy.inject(status, count=1 << 30, every=True)  # HEADs and GETs alike
    _, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, retries=1, request_timeout=2)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # for `mmfs info`, which has no config
    (tmp_path / "m").mkdir()
    for command in (["build", s3], ["info", remote("data/u16_docs")], ["mount", s3, tmp_path / "m"]):
        done = mmfs(*command, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        for fragment in (f"the store at {proxy.url}", f"HTTP {status}", f"a redirect to {elsewhere.url}/golden/"):
            assert fragment in lines[0], lines[0]
        assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in done.stderr
    assert not os.path.ismount(tmp_path / "m")
    assert proxy.injected > 0
    assert elsewhere.requests == 0  # nothing (no credentials) sent where the store pointed


def test_a_store_that_starts_redirecting_under_a_mount_gives_eio_naming_the_target(
        tmp_path, proxy, elsewhere):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=0)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))
        assert (samples(b) / names[0]).read_bytes() == (samples(a) / names[0]).read_bytes()
        proxy.location = elsewhere.url
        proxy.inject("307", count=1 << 30)  # ranged GETs only
        assert read_errno(samples(b) / names[30]) == 5  # EIO (a redirect is not asked again)
        proxy.inject(None)
        assert (samples(b) / names[31]).read_bytes() == (samples(a) / names[31]).read_bytes()
    log = b.log.read_text()
    assert f"HTTP 307, a redirect to {elsewhere.url}/golden/data/u16_docs.bin" in log, log
    assert proxy.injected >= 1 and elsewhere.requests == 0


# -- a store that ignores If-Match ---------------------------------------------------


def test_a_store_that_ignores_if_match_serves_no_byte_of_a_replaced_object(tmp_path, server, proxy):  # noqa: F811
    """The proxy drops If-Match, so the store answers the new object's bytes (same size)
    with a 206 carrying the new ETag: each such read is EIO with the log's line for a
    changed object, and none of those bytes is cached (read again: EIO again)."""
    import yaml

    key = "ignored-if-match/u16_docs"
    for ext in (".bin", ".idx"):
        server.put(BUCKET, key + ext, (GOLDEN / "data" / f"u16_docs{ext}").read_bytes())
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    base = {"split": "969,30,1", "samples": {"train": 300, "valid": 10, "test": 2},
            "sequence_length": 64, "tokenizer": {"eod": 50256, "pad": None}}
    (tmp_path / "local.yaml").write_text(yaml.safe_dump({**base, "datasets": [{"path": "data/u16_docs"}],
                                                         "cache_dir": "c1"}))
    (tmp_path / "s3.yaml").write_text(yaml.safe_dump({
        **base, "datasets": [{"path": remote(key)}], "cache_dir": "c2",
        "storage": {"endpoint_url": proxy.url, "cache_dir": str(tmp_path / "storage"), "prefetch": 64 << 10}}))
    proxy.drop_if_match = True
    with mounted(tmp_path / "local.yaml", tmp_path / "l") as a, mounted(tmp_path / "s3.yaml", tmp_path / "r") as b:
        names = sorted(os.listdir(samples(a)))
        for name in names[:10]:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        data = (GOLDEN / "data/u16_docs.bin").read_bytes()
        server.put(BUCKET, key + ".bin", bytes(len(data)))  # same size, other bytes, a new ETag
        wrong, failed = 0, [set(), set()]
        for attempt in range(2):  # the second time: nothing of the new object was cached
            for name in names[100:200]:
                try:
                    got = (samples(b) / name).read_bytes()
                except OSError as exc:
                    assert exc.errno == 5
                    failed[attempt].add(name)
                    continue
                wrong += got != (samples(a) / name).read_bytes()
        assert wrong == 0  # cached ranges are the old object's own bytes; never the new one's
        assert failed[0] and failed[0] <= failed[1]
    log = b.log.read_text()
    assert "the object changed since it was opened" in log and "the store answered ETag" in log, log


# -- rotated credentials -------------------------------------------------------------


def credentials_file(path: Path, token: str) -> None:
    path.write_text(f"[default]\naws_access_key_id = {CREDENTIALS['AWS_ACCESS_KEY_ID']}\n"
                    f"aws_secret_access_key = {CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n"
                    f"aws_session_token = {token}\n")


@pytest.fixture
def rotated(tmp_path, monkeypatch):
    """Credentials from a shared credentials file only (with a session token), as a
    credential helper that renews the token writes them; `rotated(token)` renews."""
    path = tmp_path / "aws-credentials"
    credentials_file(path, "token-1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    return lambda token: credentials_file(path, token)


def wait_for(condition, what: str, guard: float = HANG_GUARD) -> None:
    deadline = time.monotonic() + guard  # a hang guard, not a speed check
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {guard:.0f} s (it hangs)"
        time.sleep(0.1)


def test_a_session_token_renewed_in_the_credentials_file_is_taken_without_a_remount(
        tmp_path, proxy, local_mount, rotated):  # noqa: F811 - the fixtures
    _, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=0)
    a = local_mount("p1_single_u16")
    with mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(b)))
        for name in names[:5]:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        rotated("token-2")
        proxy.expired_tokens = {"token-1"}  # the old token refused from now on (400 ExpiredToken)
        for name in names[5:35]:  # every read: no EIO, no remount
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        assert proxy.refused_tokens >= 1
        renewed = [line for line in b.log.read_text().splitlines() if "read them again" in line]
        assert len(renewed) == 1 and "new ones: reads go on" in renewed[0], renewed

        # The token expires before the file has a new one: reads fail, and the log says
        # what was done and what to do; once the file is renewed, reads go on.
        proxy.expired_tokens = {"token-1", "token-2"}
        assert read_errno(samples(b) / names[40]) == 5
        rotated("token-3")
        wait_for(lambda: read_errno(samples(b) / names[41]) == 0, "reads recover once the file is renewed")
        for name in names[41:60]:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
    log = b.log.read_text()
    assert "ExpiredToken (HTTP 400): the store refused the credentials as expired" in log, log
    assert "renew them (aws_session_token in the shared credentials file" in log
    assert "token-2" not in log and "token-3" not in log


def test_expired_credentials_are_read_again_at_most_once_an_interval(tmp_path, proxy, rotated, monkeypatch, caplog):  # noqa: F811
    """In this process: ten fetches refused as expired, with the file not renewed, read
    the credentials once within the interval (made an hour here), and on every
    refusal with an interval of 0."""
    from mmfs.storage import s3
    from mmfs.storage.remote import Permanent
    from mmfs.storage.settings import StorageSettings

    def refusals(renew_seconds: float, cache: str) -> int:
        monkeypatch.setattr(s3, "RENEW_SECONDS", renew_seconds)
        settings = StorageSettings(endpoint_url=proxy.url, retries=0, cache_dir=str(tmp_path / cache))
        obj = s3.S3Object(remote("data/u16_docs.bin"), settings)
        proxy.expired_tokens = {"token-1"}
        caplog.clear()
        for _ in range(10):
            with pytest.raises(Permanent, match="ExpiredToken"):
                obj._get_into(0, memoryview(bytearray(8)))
        proxy.expired_tokens = set()
        return len([r for r in caplog.records if "read them again" in r.getMessage()])

    with caplog.at_level(logging.WARNING, logger="mmfs.storage.s3"):
        assert refusals(3600.0, "a") == 1
        assert refusals(0.0, "b") == 10
    assert proxy.refused_tokens == 20  # one request a fetch: the same credentials are not sent twice
