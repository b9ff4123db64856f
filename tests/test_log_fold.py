"""Failed reads folded in the daemon log (mmfs/mount/repeats.py FoldedFailures): the
first read that fails a way in full, then one line an interval with how many more
failed the same way; distinct causes each in full. Counted against injected
failures on a clock the test moves (no real time)."""

from __future__ import annotations

import re

from mmfs.mount.repeats import FoldedFailures, cause

DOWN = ("s3://b/data/x.bin: bytes {lo}..{hi}: the store has not answered since 12:00:0{s} (503); "
        "reads fail until it does")
DENIED = "s3://b/data/y.bin: bytes {lo}..{hi}: AccessDenied (HTTP 403)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def folded(interval: float = 10.0) -> tuple[FoldedFailures, list[str], Clock]:
    lines: list[str] = []
    clock = Clock()
    return FoldedFailures(lines.append, interval, clock=clock, timer=False), lines, clock


def fail(f: FoldedFailures, template: str, k: int) -> None:
    detail = template.format(lo=100 * k, hi=100 * k + 64, s=k % 10)
    f.failed(f"/train/samples/{k:07d}.bin: {detail} (a read of 4096 bytes at 0)", detail)


def counts(lines: list[str]) -> list[int]:
    return [int(m.group(1).replace(",", "")) for line in lines
            if (m := re.match(r"([\d,]+) more reads? failed the same way in the last", line))]


def test_a_storm_of_one_cause_is_one_line_then_a_count_an_interval():
    f, lines, clock = folded()
    for k in range(1237):  # over 30 s: a failure about every 24 ms
        clock.now = 1000.0 + k * 30.0 / 1237
        fail(f, DOWN, k)
    f.close()
    assert len(lines) == 1 + 3, lines  # the first; then a count at 10 s, 20 s, and at the end
    assert lines[0].startswith("/train/samples/0000000.bin: s3://b/data/x.bin: bytes 0..64")
    assert sum(counts(lines)) == 1236
    assert "more reads failed the same way in the last 10 s (the last: /train/samples/" in lines[1]
    assert counts(lines)[0] == sum(1 for k in range(1, 1237) if k * 30.0 / 1237 < 10.0)


def test_distinct_causes_are_each_written_in_full():
    f, lines, clock = folded()
    for k in range(10):
        fail(f, DOWN, k)
        fail(f, DENIED, k)
        f.failed(f"/x/{k}: reading data.bin at byte {k} failed (it ends before that byte)",
                 f"reading data.bin at byte {k} failed (it ends before that byte)")
    assert len(lines) == 3 and counts(lines) == []  # one full line each, the rest held
    clock.now += 10.0
    f.flush()
    assert counts(lines) == [9, 9, 9]
    clock.now += 10.0  # an interval with no failure closes the cause
    f.flush()
    fail(f, DENIED, 99)
    assert lines[-1].startswith("/train/samples/0000099.bin: s3://b/data/y.bin: bytes 9900..9964: AccessDenied")
    f.close()
    assert len(lines) == 3 + 3 + 1


def test_a_cause_masks_the_numbers_that_differ_from_read_to_read():
    assert cause(DOWN.format(lo=1, hi=2, s=3)) == cause(DOWN.format(lo=40960, hi=41000, s=9))
    assert cause(DOWN.format(lo=1, hi=2, s=3)) != cause(DENIED.format(lo=1, hi=2))


def test_an_interval_of_0_writes_every_failed_read():
    f, lines, _ = folded(0)
    for k in range(50):
        fail(f, DENIED, k)
    f.close()
    assert len(lines) == 50 and counts(lines) == []


def test_one_more_is_said_in_the_singular():
    f, lines, _ = folded()
    fail(f, DENIED, 1)
    fail(f, DENIED, 2)
    f.close()
    assert lines[1].startswith("1 more read failed the same way in the last 0.0 s")
