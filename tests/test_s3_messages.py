"""Object storage messages name the real cause and never a secret: credentials in an
endpoint URL (config or AWS_ENDPOINT_URL) are refused without being echoed, a
storage library's message has its secret-looking fields masked, a malformed
endpoint is one line, a missing bucket names the endpoint asked, expired
credentials are not "the network", the cache folder's problems name the folder,
and object keys of any valid length have a local copy. Against the real
S3-protocol server on 127.0.0.1 (tests/s3_server.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("boto3")
pytest.importorskip("moto")

from s3_server import CREDENTIALS, FaultProxy, MotoServer, use_test_credentials  # noqa: E402

from golden_cases import GOLDEN  # noqa: E402
from mount_fixtures import mmfs  # noqa: E402

BUCKET = "golden"
SECRET = "Pw-9f3c1e-never-shown"  # a password in a URL, a secret_key in a profile
LONG_KEY = "data/" + "k" * 276 + ".idx"  # 285 bytes: S3 keys go to 1,024


class Proxy(FaultProxy):
    """The fault proxy, and when `expired` is set the answer S3 gives a request signed
    with an expired session token (400 ExpiredToken; a HEAD's answer has no body)."""

    expired = False

    def _serve(self, h) -> None:
        if not self.expired:
            return super()._serve(h)
        length = int(h.headers.get("Content-Length") or 0)
        if length:
            h.rfile.read(length)
        payload = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ExpiredToken</Code>"
                   b"<Message>The provided token has expired.</Message></Error>")
        h.send_response(400)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(payload)


@pytest.fixture(scope="module")
def server():
    moto = MotoServer()
    for ext in (".bin", ".idx"):
        data = (GOLDEN / "data" / f"u16_docs{ext}").read_bytes()
        moto.put(BUCKET, f"data/u16_docs{ext}", data)
        moto.put(BUCKET, LONG_KEY[:-4] + ext, data)
    yield moto
    moto.stop()


@pytest.fixture
def proxy(server, monkeypatch):
    use_test_credentials(monkeypatch)
    p = Proxy(server.port)
    yield p
    p.close()


def config(tmp_path: Path, path: str, endpoint: str | None, **storage) -> Path:
    block = {"cache_dir": str(tmp_path / "storage"), "retries": 1, "request_timeout": 2, **storage}
    if endpoint is not None:
        block["endpoint_url"] = endpoint
    out = tmp_path / "c.yaml"
    out.write_text(yaml.safe_dump({"datasets": [{"path": path}], "sequence_length": 64,
                                   "tokenizer": {"eod": 50256}, "cache_dir": str(tmp_path / "index"),
                                   "storage": block}))
    return out


def one_line(proc: subprocess.CompletedProcess, *fragments: str, absent: tuple[str, ...] = ()) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    for a in (*absent, SECRET, CREDENTIALS["AWS_SECRET_ACCESS_KEY"]):
        assert a not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return lines[0]


def commands(tmp_path: Path, cfg: Path, url: str) -> list[list]:
    (tmp_path / "m").mkdir(exist_ok=True)
    return [["build", cfg], ["info", url], ["mount", cfg, tmp_path / "m"]]


def test_credentials_in_an_endpoint_url_are_refused_and_never_written(tmp_path, proxy, monkeypatch):
    url = f"s3://{BUCKET}/data/u16_docs"
    with_password = proxy.url.replace("http://", f"http://admin:{SECRET}@")
    cfg = config(tmp_path, url, with_password)
    one_line(mmfs("build", cfg), "storage.endpoint_url: ", "holds credentials", "http://***@127.0.0.1")
    (tmp_path / "m").mkdir()
    one_line(mmfs("mount", cfg, tmp_path / "m"), "storage.endpoint_url: ", "holds credentials")
    assert not os.path.ismount(tmp_path / "m") and not (tmp_path / "m" / "mmfs.json").exists()
    for variable in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):  # the environment's endpoint, config without one
        monkeypatch.setenv(variable, with_password)
        cfg = config(tmp_path, url, None)
        for command in commands(tmp_path, cfg, url):
            one_line(mmfs(*command), f"{variable}: ", "holds credentials")
        monkeypatch.delenv(variable)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not [p for p in written if SECRET in p.read_text(errors="replace")]


@pytest.mark.parametrize("endpoint", [
    f"http://admin:{SECRET}#x@127.0.0.1:9000",  # a password with # ? / or @ puts its @ past the netloc:
    f"http://admin:{SECRET}?x@127.0.0.1:9000",  # echoed whole, and the URL parser's port error quoted it
    f"http://admin:{SECRET}/x@127.0.0.1:9000",
    f"http://admin:p@ss{SECRET}@127.0.0.1:9000",
    f"http://127.0.0.1:9000/{SECRET}@x",  # accepted, and written to mmfs.json
])
def test_credentials_the_url_parser_misses_are_refused_and_never_echoed(tmp_path, monkeypatch, endpoint):
    url = f"s3://{BUCKET}/data/u16_docs"
    one_line(mmfs("build", config(tmp_path, url, endpoint)), "storage.endpoint_url: ", "holds credentials")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    one_line(mmfs("info", url), "AWS_ENDPOINT_URL: ", "holds credentials")


@pytest.mark.parametrize("endpoint", ["http://[", "http://[::1", "http://%zz", "http://h\u00f6st:9000",
                                      "http://" + "h" * 10_000, "http://host:99999", "ftp://host",
                                      "http://[zz::1]:80", "http://a..b"])
def test_a_malformed_endpoint_is_one_line(tmp_path, proxy, monkeypatch, endpoint):
    url = f"s3://{BUCKET}/data/u16_docs"
    line = one_line(mmfs("build", config(tmp_path, url, endpoint)), "storage.endpoint_url: ")
    assert len(line) < 400, line  # the 10,000-character host is not echoed whole
    for variable, command in (("AWS_ENDPOINT_URL", "info"), ("AWS_ENDPOINT_URL_S3", "build")):
        monkeypatch.setenv(variable, endpoint)
        argv = [url] if command == "info" else [config(tmp_path, url, None)]
        assert len(one_line(mmfs(command, *argv), f"{variable}: ")) < 400
        monkeypatch.delenv(variable)


def test_a_storage_librarys_message_has_its_secrets_masked(tmp_path, proxy, monkeypatch):
    """multi-storage-client's validation message prints the whole profile."""
    pytest.importorskip("multistorageclient")
    msc = tmp_path / "msc.yaml"
    msc.write_text(yaml.safe_dump({"profiles": {BUCKET: {
        "provider_bundle": {"type": "x"},  # and storage_provider: valid under both, MSC says, profile and all
        "storage_provider": {"type": "s3", "options": {"base_path": BUCKET, "endpoint_url": proxy.url.replace(
            "http://", f"http://admin:{SECRET}x@")}},
        "credentials_provider": {"type": "S3Credentials", "options": {
            "access_key": "mmfs-key-id", "secret_key": f"{SECRET}y", "session_token": f"{SECRET}/+=z"}}}}}))
    monkeypatch.setenv("MSC_CONFIG", str(msc))
    url = f"msc://{BUCKET}/data/u16_docs"
    for command in commands(tmp_path, config(tmp_path, url, proxy.url), url):
        line = one_line(mmfs(*command), "multi-storage-client", absent=("mmfs-key-id",))
        assert "secret_key" in line and "***" in line, line


def test_a_missing_bucket_names_the_endpoint_asked(tmp_path, proxy, monkeypatch):
    url = "s3://no-such-bucket/data/u16_docs"
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    for command in commands(tmp_path, config(tmp_path, url, None), url):
        one_line(mmfs(*command), f"no bucket no-such-bucket at {proxy.url}", absent=("AWS S3",))


def test_expired_credentials_are_named_not_the_network(tmp_path, proxy, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", "an-expired-session-token")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # for `mmfs info`, which has no config
    proxy.expired = True
    url = f"s3://{BUCKET}/data/u16_docs"
    for command in commands(tmp_path, config(tmp_path, url, proxy.url), url):
        one_line(mmfs(*command), "ExpiredToken", "credentials", "renew",
                 absent=("network", "cannot reach", "an-expired-session-token"))


def test_an_object_key_of_285_bytes_has_a_local_copy(tmp_path, proxy):
    url = f"s3://{BUCKET}/{LONG_KEY[:-4]}"
    proc = mmfs("build", config(tmp_path, url, proxy.url), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert all(len(p.name.encode()) <= 255 for p in (tmp_path / "storage").rglob("*"))


@pytest.mark.parametrize("problem", ["a file", "read-only"])
def test_a_cache_folder_that_cannot_be_written_is_named(tmp_path, proxy, problem):
    folder = tmp_path / "storage"
    if problem == "a file":
        folder.write_text("not a folder")
        words = "Not a directory"
    else:
        folder.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], check=True)
        words = "Read-only file system"
    try:
        url = f"s3://{BUCKET}/data/u16_docs"
        for command in commands(tmp_path, config(tmp_path, url, proxy.url), url)[:1]:
            one_line(mmfs(*command), str(folder), words, "storage.cache_dir", absent=("no dataset",))
    finally:
        if problem == "read-only":
            subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("storage,key,words,absent", [
    ({"cache_limit": "100MiB"}, "storage.cache_limit",
     "less than twice the default storage.prefetch (64 MiB): give at least 128 MiB, or set storage.prefetch",
     "storage.prefetch: "),
    ({"cache_limit": "9" * 309}, "storage.cache_limit", "must be at most", ""),
    ({"cache_limit": "1" * 400 + ".5 GB"}, "storage.cache_limit", "must be at most", ""),
    ({"prefetch": "9" * 320}, "storage.prefetch", "must be at most", ""),
])
def test_a_storage_size_names_the_key_written(tmp_path, storage, key, words, absent):
    cfg = tmp_path / "c.yaml"
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    cfg.write_text(yaml.safe_dump({"datasets": [{"path": "data/u16_docs"}], "sequence_length": 64,
                                   "tokenizer": {"eod": 50256}, "storage": storage}))
    line = one_line(mmfs("build", cfg), f"{cfg}: {key}: ", words)
    assert not absent or absent not in line
