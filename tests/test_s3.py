"""Datasets in object storage: the golden cases mounted from a real S3-protocol
server (moto, on 127.0.0.1) are the local mount's bytes, through a proxy that
injects faults; the index cache keeps Megatron's names for the s3:// prefix;
a bad URL, bucket or credential is one line; the range cache stays under its
limit."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("boto3")
pytest.importorskip("moto")

from s3_server import CREDENTIALS, FaultProxy, MotoServer, use_test_credentials  # noqa: E402

from golden_cases import GOLDEN, PUBLIC, case_config, case_names, load_case  # noqa: E402
from mount_fixtures import HANG_GUARD, mmfs, mounted, wait_for  # noqa: E402

BUCKET = "golden"
DATA = sorted({p.with_suffix("").name for p in (GOLDEN / "data").glob("*.idx")})


@pytest.fixture(scope="module")
def server():
    moto = MotoServer()
    for name in DATA:
        for ext in (".bin", ".idx"):
            moto.put(BUCKET, f"data/{name}{ext}", (GOLDEN / "data" / f"{name}{ext}").read_bytes())
    yield moto
    moto.stop()


@pytest.fixture
def proxy(server, monkeypatch):
    use_test_credentials(monkeypatch)
    p = FaultProxy(server.port)
    yield p
    p.close()


@pytest.fixture(scope="module")
def local_mount(tmp_path_factory):
    """`local_mount(case)`: the local mount of a golden case as write_configs writes it,
    made once for the module (the tests only read it, against their bucket mounts)."""
    with contextlib.ExitStack() as stack:
        made = {}

        def get(case: str):
            if case not in made:
                folder = tmp_path_factory.mktemp(f"local-{case}")
                local, _ = write_configs(case, folder, "http://127.0.0.1:1")  # (the bucket config is not used)
                made[case] = stack.enter_context(mounted(local, folder / "local"))
            return made[case]

        yield get


class RecordingProxy(FaultProxy):
    """The proxy, also noting each ranged GET as it arrives (`asked`: path, Range), and
    holding those `hold(path, Range)` is true for until `let_go()`: a fetch stays in
    flight for as long as a test needs, whatever the machine's speed."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.asked: list[tuple[str, str]] = []
        self.hold = None
        self._go = threading.Event()

    def let_go(self) -> None:
        self.hold = None
        self._go.set()

    def _serve(self, h) -> None:
        if h.command == "GET" and "Range" in h.headers:
            with self._lock:
                self.asked.append((h.path, h.headers["Range"]))
            hold = self.hold
            if hold is not None and hold(h.path, h.headers["Range"]):
                self._go.wait(HANG_GUARD)  # bounded: a failed test never leaves it hanging
        super()._serve(h)


@pytest.fixture
def recording(proxy, server):
    """A RecordingProxy (with the environment `proxy` sets)."""
    p = RecordingProxy(server.port)
    yield p
    p.let_go()
    p.close()


def remote(prefix: str, scheme: str = "s3") -> str:
    """The URL of an object: s3://golden/..., or msc://golden/... through the MSC
    profile `golden` (the same bucket)."""
    return f"{scheme}://{BUCKET}/{prefix}"


@pytest.fixture
def msc_profile(proxy, tmp_path, monkeypatch):
    """An MSC configuration whose profile `golden` is the test bucket, through the proxy."""
    pytest.importorskip("multistorageclient")
    config = tmp_path / "msc.yaml"
    config.write_text(yaml.safe_dump({"profiles": {BUCKET: {"storage_provider": {"type": "s3", "options": {
        "base_path": BUCKET, "endpoint_url": proxy.url, "region_name": CREDENTIALS["AWS_REGION"]}}}}}))
    monkeypatch.setenv("MSC_CONFIG", str(config))
    return config


def write_configs(case: str, folder: Path, endpoint: str, scheme: str = "s3", **storage) -> tuple[Path, Path]:
    """(local config, the same with every dataset in the bucket)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    local = case_config(load_case(case))
    local["training"] = {"data_parallel_size": 3, "micro_batch_size": 2}
    (folder / "local.yaml").write_text(yaml.safe_dump(local, sort_keys=False))
    text = yaml.safe_dump(local, sort_keys=False)
    text = re.sub(r"path: (data/\w+)", lambda m: f"path: {remote(m.group(1), scheme)}", text)
    cfg = yaml.safe_load(text)
    cfg["cache_dir"] = "remote-cache"
    cfg["storage"] = {"endpoint_url": endpoint, "cache_dir": str(folder / "storage"), **storage}
    (folder / "s3.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder / "local.yaml", folder / "s3.yaml"


def files_of(root: Path, stride: int, start: int = 0) -> list[str]:
    """Every stride-th file of every view folder (from file `start`), and every other file."""
    out = []
    for folder, _, names in sorted(os.walk(root)):
        names = sorted(names)
        step, first = (stride, start) if len(names) > 3 * stride else (1, 0)
        out += [os.path.relpath(os.path.join(folder, n), root) for n in names[first::step]]
    return out


def xattrs(path: Path) -> dict:
    return {n: os.getxattr(path, n) for n in sorted(os.listxattr(path))}


def assert_same_mount(local: Path, bucket: Path, stride: int = 7, start: int = 0) -> int:
    names = files_of(local, stride, start)
    assert names == [n for n in files_of(bucket, stride, start)]
    for name in names:
        if name in ("mmfs.json", "report.html"):  # they name the config and the datasets' paths
            continue
        a, b = local / name, bucket / name
        assert a.read_bytes() == b.read_bytes(), name
        if not a.is_symlink():
            assert xattrs(a) == xattrs(b), name
    return len(names)


def manifest_without_paths(path: Path) -> dict:
    text = path.read_text()
    text = re.sub(r"(s3|msc)://golden/(data/\w+)", r"\2", text)
    data = json.loads(text)
    data.pop("config", None)
    data.pop("config_path", None)
    for split in data.get("splits", {}).values():
        for g in split.get("gpt_datasets", []):
            g.pop("cache", None)
        split.get("blend", {}).pop("cache", None)
    return data


def check_golden_case(case: str, tmp_path: Path, proxy: FaultProxy, scheme: str, a) -> None:
    # No window: reading every 7th file, it would fetch two files a read that nobody reads
    # (what a window fetched is compared with the local bytes in the prefetch test).
    _, s3 = write_configs(case, tmp_path, proxy.url, scheme, prefetch=0)
    with mounted(s3, tmp_path / "s3") as b:
        assert assert_same_mount(a.path, b.path) > 50
        assert manifest_without_paths(a.path / "mmfs.json") == manifest_without_paths(b.path / "mmfs.json")
        for written in (b.path / "mmfs.json", b.log):  # credentials never leave the environment
            assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in written.read_text()
            assert CREDENTIALS["AWS_ACCESS_KEY_ID"] not in written.read_text()
    assert proxy.ranged_gets > 0
    # Megatron's cache names for the prefix as written: its description with that path, hashed
    for described in (PUBLIC / case / "cache").glob("*-description.txt"):
        text = re.sub(r'"dataset_path": "(data/\w+)"',
                      lambda m: f'"dataset_path": "{remote(m.group(1), scheme)}"', described.read_text())
        kind = described.name.split("-", 1)[1]
        name = f"{hashlib.md5(text.encode()).hexdigest()}-{kind}"
        assert (tmp_path / "remote-cache" / name).read_text() == text


@pytest.mark.parametrize("case", case_names())
def test_the_golden_cases_from_a_bucket_are_the_local_mount(tmp_path, proxy, local_mount, case):
    check_golden_case(case, tmp_path, proxy, "s3", local_mount(case))


def test_a_golden_case_through_a_multi_storage_client_profile(tmp_path, proxy, msc_profile, local_mount):
    check_golden_case("p2_blend2_u16", tmp_path, proxy, "msc", local_mount("p2_blend2_u16"))


def test_two_mounts_share_one_cache_folder(tmp_path, proxy, local_mount):
    _, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=0)  # (every 9th file: no window)
    a = local_mount("p1_single_u16")
    with mounted(s3, tmp_path / "one") as b, mounted(s3, tmp_path / "two") as c:
        names = sorted(os.listdir(a.path / "train/samples"))[::9]
        for name in names:
            want = (a.path / "train/samples" / name).read_bytes()
            assert (b.path / "train/samples" / name).read_bytes() == want
            assert (c.path / "train/samples" / name).read_bytes() == want
        ranges = tmp_path / "storage" / "ranges"
        assert sorted(os.listdir(ranges)) == sorted([str(b.pid), str(c.pid)])  # a range folder each
        assert len(list((tmp_path / "storage" / "objects").glob("*-u16_docs.idx"))) == 1  # one copy
    assert not (ranges / str(b.pid)).exists()  # gone with its daemon


def test_a_blend_of_local_and_remote_datasets(tmp_path, proxy, local_mount):
    _, s3 = write_configs("p2_blend2_u16", tmp_path, proxy.url)
    cfg = yaml.safe_load(s3.read_text())
    cfg["datasets"][0]["path"] = "data/" + cfg["datasets"][0]["path"].rsplit("/", 1)[1]  # local again
    s3.write_text(yaml.safe_dump(cfg))
    a = local_mount("p2_blend2_u16")
    with mounted(s3, tmp_path / "mixed") as b:
        assert assert_same_mount(a.path / "train", b.path / "train", stride=3) > 50


def test_faults_are_retried_and_the_bytes_stay_exact(tmp_path, proxy, local_mount):
    _, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=0)
    a = local_mount("p1_single_u16")
    with mounted(s3, tmp_path / "s3") as b:
        # each fault on files not read before (a cached range asks the store nothing)
        for start, fault in enumerate(["503", "500", "cut", "truncate"]):
            injected = proxy.injected
            proxy.inject(fault, count=6, period=2)  # several ranges, each failing once or more
            assert assert_same_mount(a.path / "train", b.path / "train", stride=23, start=start) > 30, fault
            assert proxy.injected - injected == 6, fault
        assert "ERROR" not in b.log.read_text()


def test_an_endpoint_that_goes_away_gives_eio_and_comes_back(tmp_path, proxy, local_mount):
    _, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=0, retries=1,
                              request_timeout=2)
    a = local_mount("p1_single_u16")
    with mounted(s3, tmp_path / "s3") as b:
        first = sorted(os.listdir(b.path / "train" / "samples"))
        proxy.down = True
        with pytest.raises(OSError) as err:
            (b.path / "train" / "samples" / first[5]).read_bytes()
        assert err.value.errno == 5  # EIO
        assert "s3://golden/data/u16_docs.bin: bytes" in b.log.read_text()
        proxy.down = False
        wait_for(lambda: "the store answers again" in b.log.read_text(), "the probe finding the store again")
        for name in first[:20]:  # the daemon lived, and reads again
            assert (b.path / "train/samples" / name).read_bytes() == (a.path / "train/samples" / name).read_bytes()


@pytest.mark.parametrize("scheme", ["s3", "msc"])
def test_an_object_replaced_under_the_mount_gives_eio_never_mixed_bytes(tmp_path, server, proxy, scheme, request):
    if scheme == "msc":
        request.getfixturevalue("msc_profile")
    key = "replaced/u16_docs"
    for ext in (".bin", ".idx"):
        server.put(BUCKET, key + ext, (GOLDEN / "data" / f"u16_docs{ext}").read_bytes())
    folder = tmp_path
    (folder / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    base = {"split": "969,30,1", "samples": {"train": 300, "valid": 10, "test": 2},
            "sequence_length": 64, "tokenizer": {"eod": 50256, "pad": None}}
    (folder / "local.yaml").write_text(yaml.safe_dump({**base, "datasets": [{"path": "data/u16_docs"}],
                                                       "cache_dir": "c1"}))
    (folder / "s3.yaml").write_text(yaml.safe_dump({
        **base, "datasets": [{"path": remote(key, scheme)}], "cache_dir": "c2",
        "storage": {"endpoint_url": proxy.url, "cache_dir": str(folder / "storage"), "prefetch": 0}}))
    with mounted(folder / "local.yaml", folder / "l") as a, mounted(folder / "s3.yaml", folder / "r") as b:
        names = sorted(os.listdir(a.path / "train/samples"))
        for name in names[:10]:
            assert (b.path / "train/samples" / name).read_bytes() == (a.path / "train/samples" / name).read_bytes()
        data = bytearray((GOLDEN / "data/u16_docs.bin").read_bytes())
        data[:] = bytes(len(data))  # same size, other bytes
        server.put(BUCKET, key + ".bin", bytes(data))
        wrong = 0
        for name in names[10:60]:
            try:
                got = (b.path / "train/samples" / name).read_bytes()
            except OSError as exc:
                assert exc.errno == 5
                continue
            wrong += got != (a.path / "train/samples" / name).read_bytes()
        assert wrong == 0  # cached ranges are the old object's own bytes; never a mix
        assert "the object changed since it was opened" in b.log.read_text()


def one_line_error(proc, *fragments: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in proc.stderr
    return lines[0]


def _config(tmp_path, path: str, endpoint: str) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": path}], "sequence_length": 64, "tokenizer": {"eod": 50256},
        "storage": {"endpoint_url": endpoint, "cache_dir": str(tmp_path / "storage"), "retries": 1,
                    "request_timeout": 2}}))
    return config


def test_a_missing_object_bucket_or_access_is_one_line_and_no_mount(tmp_path, proxy, monkeypatch):
    cases = [
        (remote("data/nothing"), "s3://golden/data/nothing", "no dataset"),
        ("s3://no-such-bucket/data/u16_docs", "no bucket no-such-bucket", "endpoint"),
    ]
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # for `mmfs info`, which has no config
    (tmp_path / "m").mkdir()
    for path, *fragments in cases:
        config = _config(tmp_path, path, proxy.url)
        for command in (["build", config], ["info", path], ["mount", config, tmp_path / "m"]):
            named = ["datasets[0].path: "] if command[0] != "info" else []
            one_line_error(mmfs(*command), *fragments, *named)
        assert not os.path.ismount(tmp_path / "m")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    config = _config(tmp_path, remote("data/u16_docs"), proxy.url)
    proxy.inject("deny", count=1000, every=True)
    one_line_error(mmfs("build", config), "access denied", "AWS_ACCESS_KEY_ID")
    proxy.inject(None)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    one_line_error(mmfs("build", config), "no credentials")
    proxy.down = True
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    one_line_error(mmfs("build", config), "cannot reach the object store")


def test_a_missing_msc_object_or_profile_is_one_line(tmp_path, proxy, msc_profile):
    for path, *fragments in [(remote("data/nothing", "msc"), "no dataset", "msc://golden/data/nothing"),
                             ("msc://elsewhere/data/u16_docs", "msc://elsewhere/data/u16_docs",
                              "MSC_CONFIG")]:
        config = _config(tmp_path, path, proxy.url)
        one_line_error(mmfs("build", config), "datasets[0].path: ", *fragments)
        one_line_error(mmfs("info", path), *fragments[-1:])


@pytest.mark.parametrize("storage,key,words", [
    ({"cache_limit": "lots"}, "storage.cache_limit", "is not a size"),
    ({"cache_limit": 1000}, "storage.cache_limit", "below the least"),
    ({"endpoint_url": "localhost:9000"}, "storage.endpoint_url", "expected a URL"),
    ({"max_requests": 0}, "storage.max_requests", "at least 1"),
    ({"max_requests": 1025}, "storage.max_requests", "at most 1024"),
    ({"prefetch": "900MB", "cache_limit": "1GB"}, "storage.prefetch", "more than half"),
    ({"colour": "blue"}, "storage.colour", "unknown key"),
    ({"anonymous": "yes"}, "storage.anonymous", "true or false"),
])
def test_a_bad_storage_block_is_one_line_naming_the_key(tmp_path, storage, key, words):
    config = tmp_path / "c.yaml"
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    config.write_text(yaml.safe_dump({"datasets": [{"path": "data/u16_docs"}], "sequence_length": 64,
                                      "tokenizer": {"eod": 50256}, "storage": storage}))
    one_line_error(mmfs("build", config), f"{config}: {key}: ", words)


def _cached_bytes(folder: Path) -> int:
    return sum(os.stat(os.path.join(d, n)).st_blocks * 512 for d, _, ns in os.walk(folder) for n in ns)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


@pytest.fixture(scope="module")
def big(server, tmp_path_factory):
    """A 4 MB uint16 dataset (larger than the least cache limit), as a prefix and as
    a .pbin, on local disk and in the bucket."""
    from mmfs.formats.writer import IndexedDatasetWriter, write_packed

    folder = tmp_path_factory.mktemp("big") / "data"
    folder.mkdir()
    rng = np.random.default_rng(17)
    docs = [rng.integers(0, 50000, int(n), dtype=np.uint16) for n in rng.integers(200, 1800, 2000)]
    with IndexedDatasetWriter(str(folder / "big.bin"), dtype=np.uint16) as w:
        for d in docs:
            w.add_item(d)
            w.end_document()
        w.finalize(str(folder / "big.idx"))
    write_packed(str(folder / "big.pbin"), docs, token_size=2)
    for name in ("big.bin", "big.idx", "big.pbin"):
        server.put(BUCKET, f"big/{name}", (folder / name).read_bytes())
    return folder


def big_configs(tmp_path: Path, big: Path, name: str, endpoint: str, **storage) -> tuple[Path, Path]:
    (tmp_path / "data").symlink_to(big, target_is_directory=True)
    base = {"split": "98,2,0", "sequence_length": 512, "tokenizer": {"eod": 0, "pad": None},
            "training": {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8}}
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({**base, "datasets": [{"path": f"data/{name}"}], "cache_dir": "c1"}))
    s3 = tmp_path / "s3.yaml"
    s3.write_text(yaml.safe_dump({**base, "datasets": [{"path": remote(f"big/{name}")}], "cache_dir": "c2",
                                  "storage": {"endpoint_url": endpoint,
                                              "cache_dir": str(tmp_path / "storage"), **storage}}))
    return local, s3


def test_reading_more_than_the_cache_limit_stays_under_it(tmp_path, proxy, big):
    limit = 1 << 20
    local, s3 = big_configs(tmp_path, big, "big", proxy.url, cache_limit=limit, prefetch=256 << 10)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(b.path / "train/samples"))[:1500]  # 1.5 MB of tokens, 6 MB of pages
        peak, rss = 0, []
        for k, name in enumerate(names):
            assert (b.path / "train/samples" / name).read_bytes() == (a.path / "train/samples" / name).read_bytes()
            if k % 100 == 0:
                peak = max(peak, _cached_bytes(tmp_path / "storage" / "ranges"))
                rss.append(_rss(b.pid))
        assert proxy.ranged_gets > len(names) // 4
    assert limit // 2 < peak <= limit
    assert max(rss[3:]) - min(rss[3:]) < 16 << 20, rss


def test_a_pbin_from_a_bucket_is_the_local_one_and_its_index_is_kept(tmp_path, proxy, big, monkeypatch):
    local, s3 = big_configs(tmp_path, big, "big.pbin", proxy.url, prefetch=0)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        assert assert_same_mount(a.path / "train", b.path / "train", stride=97) > 50
    kept = list((tmp_path / "storage" / "objects").glob("*-big.pbin-*.npy"))
    assert len(kept) == 2  # pointers and lengths, named by URL and ETag
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    info = mmfs("info", remote("big/big.pbin"))
    assert info.returncode == 0 and "2,000" in info.stdout, info.stdout + info.stderr
    assert list((tmp_path / "xdg" / "mmfs" / "objects").glob("*-big.pbin-*.npy"))
    before = proxy.ranged_gets
    with mounted(s3, tmp_path / "again") as c:  # the index from the cache: the header is fetched
        assert (c.path / "train/samples/0000000.bin").read_bytes()
    assert proxy.ranged_gets - before <= 3  # the header, the sample's piece or two


def test_every_command_takes_remote_datasets(tmp_path, proxy, big, monkeypatch):
    local, s3 = big_configs(tmp_path, big, "big", proxy.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # for the commands without a config
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mmfs("build", s3).returncode == 0
    for argv in (["sample", "{}", "17"], ["which", "{}", "--consumed", "40"],
                 ["which", "{}", "--iteration", "3", "--rank", "1", "--json"]):
        here, there = (mmfs(*[a.format(c) for a in argv]) for c in (local, s3))
        assert there.returncode == 0, there.stderr
        same = there.stdout.replace(str(s3), str(local)).replace(remote("big/big"), "data/big")
        assert same == here.stdout, argv
    for target in (remote("big/big"), remote("big/big.pbin")):
        for command in ("info", "verify"):
            done = mmfs(command, target)
            assert done.returncode == 0 and remote("big/big") in done.stdout, done.stdout + done.stderr


def pieces_of(config: Path, folder: str, count: int) -> list[list[tuple[str, int, int]]]:
    """(object path, first byte, end) of what reading each of the first `count` files of
    `folder` in a mount of `config` needs, as the C core notes it (in this process,
    fetching nothing)."""
    from mmfs.megatron import open_corpus
    from mmfs.megatron.arrays import noted_fetches
    from mmfs.mount.tree import Tree

    registry = Tree(open_corpus(str(config), progress=False)).registry
    view = registry.by_path["/" + folder]
    out = []
    for j in range(count):
        with noted_fetches() as wanted:
            registry.read(view, j, 0, registry.size(view, j))
        out.append([("/" + s.url.split("://", 1)[1], o, o + n) for s, o, n in wanted])
    return out


def span(rng: str) -> tuple[int, int]:
    """[lo, hi) of an HTTP Range header "bytes=first-last"."""
    first, last = rng.removeprefix("bytes=").split("-")
    return int(first), int(last) + 1


def requested(proxy: RecordingProxy) -> dict[str, list[tuple[int, int]]]:
    """The byte ranges [lo, hi) of every ranged GET the proxy has seen, by object path."""
    out: dict[str, list[tuple[int, int]]] = {}
    for path, rng in list(proxy.asked):
        out.setdefault(path, []).append(span(rng))
    return out


def by_path(pieces) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for path, lo, hi in pieces:
        out.setdefault(path, []).append((lo, hi))
    return out


def covered(pieces, ranges: dict[str, list[tuple[int, int]]]) -> bool:
    """Every byte of `pieces` lies in `ranges`."""
    for path, lo, hi in pieces:
        for a, b in sorted(ranges.get(path, ())):
            if a <= lo < b:
                lo = b
        if lo < hi:
            return False
    return True


def test_a_remote_mount_prefetches_the_next_files_in_order(tmp_path, recording, local_mount):
    """What the prefetcher asks the store for, seen at the proxy (never how long a read
    took): the two files after the first one read; a wider window when the reader reaches
    a file still being fetched; the files after the last one read; no other rank's."""
    proxy = recording
    _, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=64 << 10)
    rank = "train/ranks/001"
    pieces = pieces_of(s3, rank, 42)
    # what reading each file needs that the files before it do not
    new = [[p for p in mine if not covered([p], by_path(sum(pieces[:j], [])))] for j, mine in enumerate(pieces)]
    assert all(new[1:7]) and all(new[40:])

    def fetched(*files: int) -> bool:  # requested, or with the files before them
        ranges = requested(proxy)
        for path, spans in by_path(sum(pieces[:min(files)], [])).items():
            ranges.setdefault(path, []).extend(spans)
        return all(covered(pieces[j], ranges) for j in files)

    # file 1's fetch stays in flight until the reader has reached it: the proxy holds the
    # request for its last piece (a file's pieces are fetched in the order of their offsets)
    last, file0 = max(new[1]), by_path(pieces[0])

    def holds(path: str, rng: str) -> bool:
        lo, hi = span(rng)
        return (path == last[0] and last[1] < hi and lo < last[2]
                and not any(a < hi and lo < b for a, b in file0.get(path, ())))

    proxy.hold = holds
    with mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(b.path / rank))
        gets = proxy.ranged_gets
        (b.path / rank / names[0]).read_bytes()
        assert proxy.ranged_gets > gets  # fetched on demand
        wait_for(lambda: fetched(1, 2), "the window starts at two files")
        assert not fetched(3)
        reader = threading.Thread(target=(b.path / rank / names[1]).read_bytes)
        reader.start()
        try:  # the reader caught up with the window: it doubles
            wait_for(lambda: fetched(3, 4, 5), "the window grows to four files")
            assert not fetched(6)
        finally:
            proxy.let_go()
            reader.join(HANG_GUARD)
        assert not reader.is_alive(), f"the read of file 1 hangs past {HANG_GUARD:.0f} s"
        local = local_mount("p1_single_u16").path / rank
        for name in names[2:40]:  # what the window fetched reads as the local bytes
            assert (b.path / rank / name).read_bytes() == (local / name).read_bytes()
        wait_for(lambda: fetched(40, 41), "the window is ahead of the last read")
        other = b.path / "train" / "ranks" / "000"
        gets = proxy.ranged_gets
        assert (other / sorted(os.listdir(other))[3]).read_bytes()
        assert proxy.ranged_gets > gets  # another rank's file: not prefetched
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp_path / "s3.log")


def test_a_text_dataset_in_a_bucket_is_tokenized_once_per_etag(tmp_path, server, proxy):
    preprocess = Path(__file__).parent / "golden" / "preprocess"
    corpus = (preprocess / "corpus.jsonl").read_bytes()
    server.put(BUCKET, "text/corpus.jsonl", corpus)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": remote("text/corpus.jsonl")}], "sequence_length": 64,
        "tokenizer": {"type": "HuggingFaceTokenizer", "model": str(preprocess / "hf_tokenizer")},
        "storage": {"endpoint_url": proxy.url, "cache_dir": str(tmp_path / "storage")}}))
    first = mmfs("build", config)
    assert first.returncode == 0 and "tokenizing s3://golden/text/corpus.jsonl" in first.stderr, first.stderr
    [idx] = (tmp_path / "storage" / "text").glob("corpus-*_text_document.idx")
    for ext in (".bin", ".idx"):  # Megatron's tools/preprocess_data.py output of the same file
        assert idx.with_suffix(ext).read_bytes() == (preprocess / f"hf_text_document{ext}").read_bytes()
    assert not list((tmp_path / "storage" / "objects").glob("*corpus.jsonl*"))  # the copy is dropped
    again = mmfs("build", config)
    assert again.returncode == 0 and "tokenizing" not in again.stderr, again.stderr
    server.put(BUCKET, "text/corpus.jsonl", corpus.replace(b"the", b"The"))  # a new ETag
    changed = mmfs("build", config)
    assert changed.returncode == 0 and "tokenizing" in changed.stderr, changed.stderr
    assert len(list((tmp_path / "storage" / "text").glob("corpus-*_text_document.idx"))) == 2


def test_back_to_back_pieces_are_one_request(tmp_path, server, recording):
    """A document of many sequences lies back to back in the .bin: reading it (or
    prefetching it) is one ranged GET, not one per sequence."""
    from mmfs.formats.writer import IndexedDatasetWriter

    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(5)
    ends = [0]  # of each document in multi.bin, in bytes
    with IndexedDatasetWriter(str(folder / "multi.bin"), dtype=np.uint16) as w:
        for _ in range(40):  # 40 documents of 30 sequences each
            lengths = rng.integers(5, 60, 30)
            for n in lengths:
                w.add_item(rng.integers(0, 60000, int(n), dtype=np.uint16))
            w.end_document()
            ends.append(ends[-1] + 2 * int(lengths.sum()))
        w.finalize(str(folder / "multi.idx"))
    for name in ("multi.bin", "multi.idx"):
        server.put(BUCKET, f"multi/{name}", (folder / name).read_bytes())
    base = {"split": "100,0,0", "sequence_length": 256, "tokenizer": {"eod": 0, "pad": None}}
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({**base, "datasets": [{"path": "data/multi"}], "cache_dir": "c1"}))
    s3 = tmp_path / "s3.yaml"
    s3.write_text(yaml.safe_dump({**base, "datasets": [{"path": remote("multi/multi")}], "cache_dir": "c2",
                                  "storage": {"endpoint_url": recording.url,
                                              "cache_dir": str(tmp_path / "storage"), "prefetch": 0}}))
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        before = len(recording.asked)
        for d in (3, 17):
            name = f"datasets/multi/documents/{d:07d}.bin"
            assert (b.path / name).read_bytes() == (a.path / name).read_bytes()
        bins = [r for r in recording.asked[before:] if r[0].endswith("multi.bin")]
        assert len(bins) == 2, bins  # one per document, not 30
    s3.write_text(s3.read_text().replace("prefetch: 0", "prefetch: 65536"))  # the window joins them too
    with mounted(s3, tmp_path / "ahead") as c:
        before = len(recording.asked)
        for d in range(12):
            assert (c.path / f"datasets/multi/documents/{d:07d}.bin").read_bytes()
        # the requests for the bytes of the documents read (those are all made: each read has
        # returned), by the reader or the window: one or two a document (the two at once); per sequence: 30
        bins = [span(r) for p, r in recording.asked[before:] if p.endswith("multi.bin")]
        for d in range(12):
            asked = [(lo, hi) for lo, hi in bins if lo < ends[d + 1] and ends[d] < hi]
            assert 1 <= len(asked) <= 2, (d, asked)
