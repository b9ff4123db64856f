"""The global batch size over a run: constant, Megatron's batch-size ramp-up, or
Megatron-LM's step schedule, and from it iteration -> consumed_samples.

Megatron's training loop, per iteration: the calculator is updated with the
samples consumed so far, the iteration reads a global batch of the size it gives,
and consumed_samples grows by that size. The samplers' streams do not change with
the batch size; only where each iteration starts in them does.

- rampup_batch_size [start, increment, ramp_samples]: megatron-core's
  RampupBatchsizeNumMicroBatchesCalculator (up to megatron-core 0.17; 0.18 and
  later accept the flag, log that it is deprecated and ignore it): while
  consumed <= ramp_samples the size is start + int(consumed / (ramp_samples /
  increments)) * increment, then global_batch_size.
- step_batch_size_schedule "THRESHOLD:BS ...": megatron-core 0.18+'s
  StepBatchsizeNumMicroBatchesCalculator as Megatron-LM builds it (always with
  seq_length, so thresholds are tokens, turned into samples by // seq_length):
  the size of the last entry whose threshold is <= consumed.

The schedule is held as segments (first iteration, first consumed sample, batch
size), so that any iteration or consumed_samples is found by bisection. A job
resumed at a consumed_samples value that no iteration of the uninterrupted run
starts at gets what the calculator gives for that value (`batch_size_at`), which
may differ from the size of the segment around it.

Megatron checks a size when an iteration reaches it, not when it parses the
schedule: each iteration's size must be a multiple of micro_batch_size x
data_parallel_size, and from the second iteration on the number of micro-batches
must not go down (the training loop asserts "Number of microbatches should not
decrease"). `check_reached` applies both to the iterations of a run.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_SEGMENTS = 1_000_000  # batch-size changes held at most (each is 3 ints)
_SUFFIXES = {"T": 10**12, "B": 10**9, "M": 10**6, "K": 10**3}


class ScheduleError(ValueError):
    """A schedule Megatron would refuse; the message says why (the caller names the key)."""


def parse_step_schedule(text: str, seq_length: int | None) -> list[tuple[int, int]]:
    """(threshold in samples, batch size) pairs, sorted, as Megatron parses the string."""
    if not isinstance(text, str) or not text.strip():
        raise ScheduleError("expected a string of THRESHOLD:BATCH_SIZE entries, e.g. \"0:768 250B:1536\"")
    entries = []
    for entry in text.strip().replace(",", " ").split():
        if ":" not in entry:
            raise ScheduleError(f"{entry!r} is not THRESHOLD:BATCH_SIZE")
        threshold, size = (_number(part, entry) for part in entry.split(":", 1))
        if seq_length is not None:
            threshold //= seq_length
        entries.append((threshold, size))
    entries.sort(key=lambda e: e[0])
    if entries[0][0] != 0:
        raise ScheduleError(f"the first threshold must be 0 (Megatron asserts), got {entries[0][0]} samples")
    for (a, _), (b, _) in zip(entries, entries[1:]):
        if b <= a:
            raise ScheduleError(f"thresholds must be strictly increasing (in samples), got {a} before {b}")
    for _, size in entries:
        if size <= 0:
            raise ScheduleError(f"batch sizes must be positive, got {size}")
    return entries


def _number(text: str, entry: str) -> int:
    """Megatron's _parse_numeric_value: a float with an optional K/M/B/T suffix, truncated."""
    text = text.strip().upper()
    scale = _SUFFIXES.get(text[-1:], 1)
    if scale != 1:
        text = text[:-1]
    try:
        value = float(text) * scale
        return int(value)
    except (ValueError, OverflowError):
        raise ScheduleError(f"{entry!r}: {text!r} is not a number (suffixes K, M, B, T)") from None


@dataclass(frozen=True)
class BatchSchedule:
    """Global batch size by consumed_samples, and the iterations it makes."""

    first_iterations: tuple[int, ...]  # 1-based iteration where each segment starts
    first_consumed: tuple[int, ...]  # consumed_samples before that iteration
    batch_sizes: tuple[int, ...]  # global batch size of every iteration of the segment
    kind: str  # constant | rampup | step
    source: Any = None  # the schedule as configured (for mmfs.json)
    # consumed_samples -> global batch size, the calculator's own rule
    size_rule: Callable[[int], int] | None = field(default=None, compare=False, repr=False)

    def consumed_before(self, iteration: int) -> int:
        """consumed_samples when iteration (1-based) starts."""
        s = bisect.bisect_right(self.first_iterations, iteration) - 1
        return self.first_consumed[s] + (iteration - self.first_iterations[s]) * self.batch_sizes[s]

    def batch_size(self, iteration: int) -> int:
        return self.batch_sizes[bisect.bisect_right(self.first_iterations, iteration) - 1]

    def iteration_at(self, consumed: int) -> tuple[int, int]:
        """(iteration that reads sample `consumed` of the stream, its offset in that batch)."""
        s = bisect.bisect_right(self.first_consumed, consumed) - 1
        steps, offset = divmod(consumed - self.first_consumed[s], self.batch_sizes[s])
        return self.first_iterations[s] + steps, offset

    def batch_size_at(self, consumed: int) -> int:
        """The global batch size of an iteration that starts at `consumed`: what the
        calculator gives for it (update(consumed)), as a job resumed there reads.
        Where an iteration of the uninterrupted run starts, that is its size."""
        if self.size_rule is None:
            return self.batch_sizes[bisect.bisect_right(self.first_consumed, consumed) - 1]
        return self.size_rule(consumed)

    def describe(self) -> dict[str, Any]:
        """mmfs.json's rule: iteration I >= first_iteration of segment s starts at
        first_consumed[s] + (I - first_iteration[s]) * batch_size[s]."""
        return {
            "kind": self.kind,
            "configured": self.source,
            "rule": "iteration I (from 1) of segment s (the last with first_iteration <= I) starts at "
                    "consumed_samples first_consumed + (I - first_iteration) * batch_size and reads "
                    "batch_size samples",
            "segments": [
                {"first_iteration": i, "first_consumed": c, "batch_size": b}
                for i, c, b in zip(self.first_iterations, self.first_consumed, self.batch_sizes)
            ],
        }


# The calculators' rules as module-level classes, not closures: a Config holding a
# schedule is pickled whole (the mount hands its snapshot to report.html's child).
@dataclass(frozen=True)
class StepRule:
    """Megatron's StepBatchsizeNumMicroBatchesCalculator: the size of the last entry
    whose threshold (in samples) is <= consumed."""

    thresholds: tuple[int, ...]
    sizes: tuple[int, ...]

    def __call__(self, c: int) -> int:
        return self.sizes[bisect.bisect_right(self.thresholds, c) - 1]


@dataclass(frozen=True)
class RampupRule:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator (see the module's doc)."""

    start: int
    increment: int
    ramp_samples: int
    global_batch_size: int

    def __call__(self, c: int) -> int:
        if c > self.ramp_samples:
            return self.global_batch_size
        per_increment = self.ramp_samples / ((self.global_batch_size - self.start) // self.increment)  # a float
        return self.start + int(c / per_increment) * self.increment


def constant_schedule(global_batch_size: int) -> BatchSchedule:
    return BatchSchedule((1,), (0,), (global_batch_size,), "constant", global_batch_size)


def check_reached(schedule: BatchSchedule, step: int, last_iteration: int | None) -> None:
    """ScheduleError where Megatron's training loop asserts, in iterations 1 ..
    last_iteration (None: every iteration of an unbounded run): a size that is not
    a multiple of `step` (micro_batch_size x data_parallel_size), or a size below
    the one before (checked first, as the loop does; with the earlier size a
    multiple of step, fewer micro-batches is the same as a smaller size)."""
    previous = None
    for first, consumed, size in zip(schedule.first_iterations, schedule.first_consumed, schedule.batch_sizes):
        if last_iteration is not None and first > last_iteration:
            return
        where = f"at iteration {first} (consumed_samples {consumed})"
        if previous is not None and size < previous:
            raise ScheduleError(f"the global batch size goes down from {previous} to {size} {where}: Megatron's "
                                "training loop asserts \"Number of microbatches should not decrease\"")
        if size % step:
            raise ScheduleError(f"reaches a global batch size of {size} {where}, not a multiple of "
                                f"micro_batch_size x data_parallel_size = {step} (Megatron asserts)")
        previous = size


def step_schedule(text: str, seq_length: int) -> BatchSchedule:
    entries = parse_step_schedule(text, seq_length)
    thresholds = [t for t, _ in entries]
    size_at = StepRule(tuple(thresholds), tuple(b for _, b in entries))

    def changes_after(c: int, b: int) -> int | None:
        i = bisect.bisect_right(thresholds, c)
        return thresholds[i] if i < len(thresholds) else None

    iters, consumed, sizes = _walk(size_at, changes_after)
    return BatchSchedule(tuple(iters), tuple(consumed), tuple(sizes), "step", text, size_at)


def rampup_schedule(start: int, increment: int, ramp_samples: int, global_batch_size: int) -> BatchSchedule:
    for name, v, least in (("start", start, 1), ("increment", increment, 1), ("ramp_samples", ramp_samples, 0)):
        if v < least:
            raise ScheduleError(f"{name} must be at least {least} (Megatron asserts), got {v}")
    diff = global_batch_size - start
    if diff < 0:
        raise ScheduleError(f"start {start} is above global_batch_size {global_batch_size}")
    if diff % increment:
        raise ScheduleError(f"global_batch_size - start = {diff} is not a multiple of the increment {increment}")
    if diff == 0 or ramp_samples == 0:
        # Megatron divides by the number of increments, then by samples per increment.
        raise ScheduleError("start equals global_batch_size or ramp_samples is 0: Megatron's calculator "
                            "divides by zero; leave rampup_batch_size out for a constant batch size")
    if diff // increment > MAX_SEGMENTS:
        raise ScheduleError(f"more than {MAX_SEGMENTS:,} increments")
    size_at = RampupRule(start, increment, ramp_samples, global_batch_size)

    def changes_after(c: int, b: int) -> int | None:
        """The first c + n*b (n >= 1) whose size differs from b: the smallest such n by
        bisection (the size never decreases along the walk)."""
        if c > ramp_samples:
            return None
        lo, hi = 1, (ramp_samples - c) // b + 1  # hi: past ramp_samples, so the size is final
        if size_at(c + hi * b) == b:
            return None  # the ramp ends with this size (global_batch_size)
        while lo < hi:
            mid = (lo + hi) // 2
            if size_at(c + mid * b) != b:
                hi = mid
            else:
                lo = mid + 1
        return c + lo * b

    iters, consumed, sizes = _walk(size_at, changes_after)
    return BatchSchedule(tuple(iters), tuple(consumed), tuple(sizes), "rampup",
                         [start, increment, ramp_samples], size_at)


def _walk(size_at, changes_after) -> tuple[list[int], list[int], list[int]]:
    """Segments from consumed 0; changes_after(c, b) gives the consumed value (reached
    from c in steps of b) where the size may change next, or None."""
    iters, consumed, sizes = [1], [0], [size_at(0)]
    c, i = 0, 1
    while True:
        b = sizes[-1]
        nxt = changes_after(c, b)
        if nxt is None:
            return iters, consumed, sizes
        n = max(1, -(-(nxt - c) // b))  # iterations of size b until consumed >= nxt
        c, i = c + n * b, i + n
        b2 = size_at(c)
        if b2 != b:
            iters.append(i)
            consumed.append(c)
            sizes.append(b2)
            if len(sizes) > MAX_SEGMENTS:
                raise ScheduleError(f"changes the batch size more than {MAX_SEGMENTS:,} times")


def train_iters_from_samples(schedule: BatchSchedule, train_samples: int, ramp_samples: int | None) -> int:
    """Megatron-LM's update_train_iters for --train-samples."""
    if schedule.kind == "constant":
        return train_samples // schedule.batch_sizes[0]
    if schedule.kind == "step":  # iterations until consumed >= train_samples
        it, offset = schedule.iteration_at(train_samples)
        return it - 1 + (offset > 0)
    # rampup (megatron-core <= 0.17): iterate while consumed <= ramp_samples and
    # <= train_samples, then whole global batches of what is left.
    limit = min(ramp_samples, train_samples)
    it, _ = schedule.iteration_at(limit)  # the iteration reading sample `limit` ...
    consumed = schedule.consumed_before(it + 1)  # ... is the last one the loop runs
    iterations = it
    if train_samples > consumed:
        iterations += (train_samples - consumed) // schedule.batch_sizes[-1]
    return iterations
