"""CPU per ranged GET of the S3 clients the fetch path could use, against a real
S3-protocol server on 127.0.0.1 (its CPU is its own process's and not counted).

    PYTHONPATH=. python benchmarks/s3_clients.py [-n 2000] [--threads 1,8] [--size 16384]
        [--server localbucket|moto]

The server is localbucket (PyPI; it keeps connections open as a cloud store does)
or moto's, as the tests start it (it closes every connection after one answer,
so every GET pays a connect).

Each candidate sends `-n` GETs of `--size` bytes at random offsets of a 4 MiB
object, each with Range and If-Match (as mmfs sends them), from each number of
`--threads` at once, and prints this process's CPU seconds (user + system, every
thread) per GET. Candidates whose library is missing are skipped:

- boto3: client.get_object, as megatron-core and mmfs until now fetch.
- mmfs: the fetch path in mmfs/storage/http.py (libcurl through pycurl, signed by
  libcurl, each answer checked against its range into the caller's buffer).
- pycurl: libcurl with its built-in AWS SigV4 signing, an easy handle per thread.
- obstore: the Rust object_store client (get with range and if_match).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from s3_bench_common import localbucket  # noqa: E402
from s3_server import CREDENTIALS, MotoServer  # noqa: E402

BUCKET, KEY, SIZE = "clients", "object.bin", 4 << 20


def boto3_get(url: str, etag: str):
    import boto3

    client = boto3.session.Session().client("s3", endpoint_url=url, config=__import__("botocore.config").config.Config(
        max_pool_connections=64, s3={"addressing_style": "path"}))

    def get(offset: int, n: int) -> bytes:
        answer = client.get_object(Bucket=BUCKET, Key=KEY, Range=f"bytes={offset}-{offset + n - 1}", IfMatch=etag)
        return answer["Body"].read()
    return get


def mmfs_get(url: str, etag: str):
    from mmfs.storage.http import Endpoint

    endpoint = Endpoint(url)
    path = f"/{BUCKET}/{KEY}"
    sign = (CREDENTIALS["AWS_REGION"], "s3", CREDENTIALS["AWS_ACCESS_KEY_ID"],
            CREDENTIALS["AWS_SECRET_ACCESS_KEY"], None)

    def get(offset: int, n: int) -> bytes:
        buf = bytearray(n)
        status, _ = endpoint.get_range(path, [], offset, memoryview(buf), 30.0, sign, if_match=etag)
        assert status == 206, status
        return bytes(buf)
    return get


def pycurl_get(url: str, etag: str):
    import io

    import pycurl

    local = threading.local()

    def handle():
        c = getattr(local, "curl", None)
        if c is None:
            c = local.curl = pycurl.Curl()
            c.setopt(pycurl.AWS_SIGV4, f"aws:amz:{CREDENTIALS['AWS_REGION']}:s3")
            c.setopt(pycurl.USERPWD, f"{CREDENTIALS['AWS_ACCESS_KEY_ID']}:{CREDENTIALS['AWS_SECRET_ACCESS_KEY']}")
            c.setopt(pycurl.URL, f"{url}/{BUCKET}/{KEY}")
        return c

    def get(offset: int, n: int) -> bytes:
        c = handle()
        out = io.BytesIO()
        c.setopt(pycurl.HTTPHEADER, [f"Range: bytes={offset}-{offset + n - 1}", f"If-Match: {etag}"])
        c.setopt(pycurl.WRITEDATA, out)
        c.perform()
        assert c.getinfo(pycurl.RESPONSE_CODE) == 206
        return out.getvalue()
    return get


def obstore_get(url: str, etag: str):
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=url, region=CREDENTIALS["AWS_REGION"], client_options={"allow_http": True},
                    access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                    secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def get(offset: int, n: int) -> bytes:
        return bytes(obstore.get(store, KEY, options={"range": (offset, offset + n), "if_match": etag}).bytes())
    return get


CANDIDATES = {"boto3": boto3_get, "mmfs": mmfs_get, "pycurl": pycurl_get,
              "obstore": obstore_get}


def measure(get, data: bytes, n: int, size: int, threads: int) -> float:
    rng = random.Random(7)
    offsets = [rng.randrange(0, SIZE - size) for _ in range(n)]
    for o in offsets[:20]:  # warm: connections, imports
        assert get(o, size) == data[o:o + size]
    cpu = time.process_time()
    if threads == 1:
        for o in offsets:
            get(o, size)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda o: get(o, size), offsets))
    return (time.process_time() - cpu) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--threads", default="1,8")
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--only", default=",".join(CANDIDATES))
    ap.add_argument("--server", choices=("localbucket", "moto"), default="localbucket")
    args = ap.parse_args()
    os.environ.update(CREDENTIALS)
    data = random.Random(1).randbytes(SIZE)
    with contextlib.ExitStack() as stack:
        if args.server == "moto":
            server = MotoServer()
            stack.callback(server.stop)
            server.put(BUCKET, KEY, data)
            url = server.url
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmfs-s3-clients-")))
            (root / BUCKET).mkdir()
            (root / BUCKET / KEY).write_bytes(data)
            url = f"http://127.0.0.1:{stack.enter_context(localbucket(root))}"
        import boto3

        etag = boto3.session.Session().client("s3", endpoint_url=url).head_object(Bucket=BUCKET, Key=KEY)["ETag"]
        print(f"{args.n} ranged GETs of {args.size} bytes each; ms of this process's CPU per GET")
        print(f"{'client':10}" + "".join(f"{t:>4} thr" for t in map(int, args.threads.split(","))))
        for name in args.only.split(","):
            try:
                get = CANDIDATES[name](url, etag)
            except ImportError as exc:
                print(f"{name:10} skipped ({exc})")
                continue
            row = [measure(get, data, args.n, args.size, int(t)) for t in args.threads.split(",")]
            print(f"{name:10}" + "".join(f"{c * 1000:8.3f}" for c in row), flush=True)


if __name__ == "__main__":
    main()
