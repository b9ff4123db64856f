"""Requests in flight sized to the readers' demand and the store's answers
(mmfs/storage/inflight.py): an object of the real S3-protocol server fetched by many
threads at once through the fault proxy, which counts the ranged GETs it holds at
once. Never more than the cap; more than the start while the readers want more;
fewer once the store answers 503 SlowDown. Counts, never durations (the proxy's
delay only keeps each request in flight long enough to be counted together)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from s3_server import FaultProxy, MotoServer, use_test_credentials  # noqa: E402

from mmfs.storage.inflight import START, Gate, gate  # noqa: E402
from mmfs.storage.s3 import S3Object  # noqa: E402
from mmfs.storage.settings import StorageSettings  # noqa: E402

BLOB = bytes(range(256)) * 4096  # 1 MiB
PIECE = 4096
CAP = 24
READERS = 2 * CAP  # more than the cap wants slots at once


@pytest.fixture(scope="module")
def server():
    moto = MotoServer()
    moto.put("inflight", "blob", BLOB)
    yield moto
    moto.stop()


@pytest.fixture
def proxy(server, monkeypatch):
    use_test_credentials(monkeypatch)
    p = FaultProxy(server.port)
    yield p
    p.close()


def fetch_pieces(obj: S3Object, pieces: list[int]) -> None:
    """Every piece fetched by READERS threads at once; each one's bytes checked."""
    def one(at: int) -> bool:
        buffer = bytearray(PIECE)
        obj.fetch(at, memoryview(buffer))
        return bytes(buffer) == BLOB[at:at + PIECE]

    with ThreadPoolExecutor(READERS) as pool:
        assert all(pool.map(one, pieces))


def pieces(first: int, count: int) -> list[int]:
    return [(first + k) * PIECE % len(BLOB) for k in range(count)]


def test_the_limit_grows_with_the_readers_demand_up_to_the_cap_and_backs_off_on_slowdown(proxy, tmp_path):
    settings = StorageSettings(endpoint_url=proxy.url, cache_dir=str(tmp_path), max_requests=CAP, retries=10)
    obj = S3Object("s3://inflight/blob", settings)
    slots = gate(settings)
    proxy.delay = 0.3  # each request held long enough for those sent together to be counted together

    fetch_pieces(obj, pieces(0, 4 * READERS))  # the readers want more than the start gives
    grown = proxy.peak_in_flight
    assert START < grown <= CAP, grown  # grew past the start, never past the cap
    assert slots.peak <= CAP and slots.cuts == 0

    proxy.reset_peak()
    proxy.inject("503", count=16)  # SlowDown for the next 16 attempts, whoever sends them: each read still succeeds
    fetch_pieces(obj, pieces(4 * READERS, READERS))
    proxy.inject(None)
    assert proxy.injected == 16 and slots.cuts >= 1 and slots.overloads == 16
    assert slots.limit < CAP  # halved at a cut, grown back one per round trip since

    proxy.reset_peak()
    fetch_pieces(obj, pieces(5 * READERS, READERS))
    after = proxy.peak_in_flight
    assert after < grown  # the store gets fewer at once than before it asked for fewer
    assert slots.limit < CAP and slots.peak <= CAP


def test_a_store_that_queues_gets_fewer_requests_and_more_again_once_it_answers_as_fast():
    """The latency rule alone (no reader waits, so nothing grows by demand): answers
    at ten times the best latency shrink the limit by one a round trip; once they
    are fast again, it stops shrinking."""
    slots = Gate(cap=64)
    for _ in range(100):
        slots.answered(0.020)
    assert slots.limit == START and not slots.queueing()
    for _ in range(100):
        slots.answered(0.200)
    assert slots.queueing() and slots.limit < START
    shrunk = slots.limit
    for _ in range(100):
        slots.answered(0.020)
    assert not slots.queueing() and slots.limit <= shrunk and slots.cuts == 0


def wait_until(condition) -> None:
    for _ in range(300_000):  # a hang guard (300 s at least): each turn waits a millisecond
        if condition():
            return
        threading.Event().wait(0.001)
    raise AssertionError("the awaited state never came (it hangs)")


def test_a_thread_holding_a_slot_takes_no_second_one_and_readers_go_before_the_prefetch():
    slots = Gate(cap=1, start=1)
    order: list[str] = []

    def take(name: str, background: bool) -> None:
        with slots.slot(background=background):
            order.append(name)

    with slots.slot(background=True):
        with slots.slot():  # nested: the same slot
            assert slots.in_flight == 1
        prefetch = threading.Thread(target=take, args=("prefetch", True))
        prefetch.start()
        wait_until(lambda: slots.waits == 1)  # the prefetch's attempt waits first
        reader = threading.Thread(target=take, args=("reader", False))
        reader.start()
        wait_until(lambda: slots.waits == 2)
    prefetch.join(300)  # hang guards
    reader.join(300)
    assert order == ["reader", "prefetch"]
    assert slots.peak == 1
