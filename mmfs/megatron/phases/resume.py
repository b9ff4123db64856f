"""A job of a run in phases resumed with another config (a phase added or changed
at the resume point, docs/phases.md): what it trains on against what it trained.

The job trained on the old config's train samples [0, C) and resumes on the new
config's samples from C. A sample is known by what it holds: its dataset file and
the pieces (sequence, offset, length) of its tokens. Compared:

- the two configs' samples before C (append-only: a change at or after C leaves
  them the same; the first that differs says where the new config rewrote the job's
  past);
- served again: the new config's samples from C on that the job already trained on
  before C, against the same count had the new config run from the start (under
  continue, what a dataset's next pass gives anyway). More than that means a
  dataset's position in the new config is not where the job left it.

Walks every sample before C and after it: a checker's job, not a mount's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PhaseResume:
    consumed: int
    first_difference: int | None  # first sample before C that differs, or None
    changed_phases: list[int]  # new config's phases whose start or blend differ from the old's
    served_again: int  # new samples from C on that the old job trained on before C
    served_again_uninterrupted: int  # the same, had the new config run from 0

    @property
    def same_before_resume(self) -> bool:
        return self.first_difference is None

    @property
    def exactly_once(self) -> bool:
        return self.same_before_resume and self.served_again == self.served_again_uninterrupted


def sample_key(reader: Any, i: int) -> tuple:
    gpt, k = reader.locate(i)
    return gpt.gpt.spec.file, tuple(gpt.pieces(k))


def changed_phases(old: Any, new: Any) -> list[int]:
    """Indices of the new config's phases that the old config does not have as they
    are (start and datasets with weights); old/new: Phases or None."""
    def facts(phases):
        if phases is None:
            return []
        return [(p.start, [(d.file, d.weight) for d in p.blend.datasets]) for p in phases.phases]

    before, after = facts(old), facts(new)
    return [k for k, f in enumerate(after) if k >= len(before) or before[k] != f or
            (phases_mode(old) != phases_mode(new))]


def phases_mode(phases: Any) -> str | None:
    return None if phases is None else phases.mode


def compare(old_reader: Any, new_reader: Any, old_phases: Any, new_phases: Any, consumed: int) -> PhaseResume:
    old_keys = [sample_key(old_reader, i) for i in range(consumed)]
    new_before = [sample_key(new_reader, i) for i in range(consumed)]
    first = next((i for i, (a, b) in enumerate(zip(old_keys, new_before)) if a != b), None)
    trained, own = set(old_keys), set(new_before)
    again = again_own = 0
    for i in range(consumed, len(new_reader)):
        key = sample_key(new_reader, i)
        again += key in trained
        again_own += key in own
    return PhaseResume(consumed, first, changed_phases(old_phases, new_phases), again, again_own)
