"""`mmfs resume-check CONFIG --consumed C --to dp=D,mbs=M[,sampler=...][,sharding=...]`:
does a job that ran with the config's `training:` layout up to consumed_samples C,
resumed on the new layout, read every sample exactly once (mmfs.megatron.sampling.resume)?
In a run in phases the report names the phase the job resumes in and the phases
of the samples repeated or skipped.

`--to-config NEW` (with or without --to): the job resumes with another config, as
when a phase is added or changed at the resume point (mmfs.megatron.phases.resume):
are the new config's samples before C the ones the job trained on, and does it
serve again what the job already trained on?
Exit 0 if so, 1 if not, 2 on a user error."""

from __future__ import annotations

import json
import re
from typing import Any

from mmfs.errors import ConfigError, MmfsError
from mmfs.megatron import open_corpus
from mmfs.megatron.phases.resume import PhaseResume, compare
from mmfs.megatron.phases.sampling import cyclic_spans, sample_phase
from mmfs.megatron.sampling.phaseplan import check_phased_resume
from mmfs.megatron.sampling.resume import ResumeReport, Sampling, check_resume
from mmfs.megatron.sampling.samplers import SamplerError
from mmfs.mount.streams import parse_layout

SHOWN = 10  # ids of each kind printed
MAX_STEP = 2**40  # samples per step (dp x mbs) at most: the id arrays are int64, a split far smaller
TO_SPEC = re.compile(r"(?P<layout>dp=[^,]*,mbs=[^,]*)(?P<rest>(,.*)?)")


class ResumeCheckError(MmfsError):
    """resume-check was given something it cannot check."""


def parse_to(text: str, consumed: int, training: Any) -> Sampling:
    """The new layout of `--to` (a stream folder's name without from=)."""
    m = TO_SPEC.fullmatch(text)
    try:
        if m is None:
            raise SamplerError("not dp=<D>,mbs=<M>[,sampler=single|cyclic][,sharding=true|false]")
        layout = parse_layout(f"{m['layout']},from={consumed}{m['rest']}", training)
    except SamplerError as exc:
        raise ResumeCheckError(f"--to {text!r}: {exc}") from None
    if layout.data_parallel_size * layout.micro_batch_size > MAX_STEP:
        raise ResumeCheckError(f"--to {text!r}: data-parallel size x micro-batch size is "
                               f"{layout.data_parallel_size * layout.micro_batch_size}, more than {MAX_STEP:,} "
                               "samples per step; give the layout the job resumes on")
    return Sampling(layout.data_parallel_size, layout.micro_batch_size, layout.dataloader_type,
                    layout.data_sharding)


def _ids(ids: Any) -> str:
    shown = " ".join(map(str, ids[:SHOWN].tolist()))
    return shown + (" ..." if ids.size > SHOWN else "")


def describe(report: ResumeReport, split: str, old: Sampling, new: Sampling, consumed: int,
             phase: int | None = None) -> str:
    """The report in words; phase: the phase whose own sampler was checked (docs/phases.md)."""
    def name(s: Sampling) -> str:
        sharding = f",sharding={str(s.data_sharding).lower()}" if s.dataloader_type == "cyclic" else ""
        return f"dp={s.data_parallel_size},mbs={s.micro_batch_size},sampler={s.dataloader_type}{sharding}"

    where = f"epoch {report.epoch} of {split}" if report.epoch is not None else split
    if phase is not None:
        where = f"phase {phase}'s own sampler" + ("" if report.epoch is None else f", its epoch {report.epoch}")
    lines = [f"{name(old)} up to consumed_samples {consumed}, then {name(new)}: {where}: "
             f"{report.expected} samples in the old layout's pass, {report.read_before} read before, "
             f"{report.read_after} after"]
    if report.exactly_once:
        lines.append("every sample exactly once")
    else:
        for what, ids in (("repeated", report.repeated), ("skipped", report.skipped)):
            lines.append(f"{what}: {ids.size}" + (f" ({_ids(ids)})" if ids.size else ""))
    return "\n".join(lines)


def _by_phase(split: Any, ids: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in ids.tolist():
        k = str(sample_phase(split, i))  # (ids past the run's samples: a restart phase's own)
        out[k] = out.get(k, 0) + 1
    return out


def _phase_facts(split: Any, report: ResumeReport, consumed: int) -> dict[str, Any]:
    phases = split.phases
    k = phases.phase_of(consumed)
    start, end = phases.bounds()[k]
    return {"phase_at_resume": k, "phase_at_resume_samples": [start, end],
            "repeated_by_phase": _by_phase(split, report.repeated),
            "skipped_by_phase": _by_phase(split, report.skipped)}


def _describe_phases(facts: dict[str, Any]) -> str:
    start, end = facts["phase_at_resume_samples"]
    line = f"resumes in phase {facts['phase_at_resume']} (samples {start}..{end})"
    for what in ("repeated", "skipped"):
        counts = facts[f"{what}_by_phase"]
        if counts:
            line += f"; {what} by phase: " + ", ".join(f"phase {k}: {n}" for k, n in sorted(counts.items()))
    return line


def _to_config(args: Any, corpus: Any) -> PhaseResume:
    new = open_corpus(args.to_config, progress=False)
    old_c, new_c = corpus.config, new.config
    if (old_c.sequence_length, old_c.add_extra_token) != (new_c.sequence_length, new_c.add_extra_token):
        raise ResumeCheckError(f"--to-config {args.to_config}: sequence_length {new_c.sequence_length} is not the "
                               f"old config's {old_c.sequence_length}: the samples cannot be compared")
    old_run, new_run = corpus.splits.get("train"), new.splits.get("train")
    for name, reader in ((args.config, old_run), (args.to_config, new_run)):
        if reader is None or len(reader) < args.consumed:
            raise ResumeCheckError(f"--consumed {args.consumed}: {name} has "
                                   f"{0 if reader is None else len(reader)} train samples, fewer than the job consumed")
    return compare(old_run, new_run, old_c.phases, new_c.phases, args.consumed)


def _resumed_json(r: PhaseResume) -> dict[str, Any]:
    return {"same_before_resume": r.same_before_resume, "first_difference": r.first_difference,
            "changed_phases": r.changed_phases, "served_again": r.served_again,
            "served_again_uninterrupted": r.served_again_uninterrupted}


def _describe_to_config(args: Any, r: PhaseResume, phases: Any) -> str:
    def phase(i: int) -> str:
        return "" if phases is None else f" (phase {phases.phase_of(i)} of the new config)"

    lines = [f"{args.config} up to consumed_samples {r.consumed}, then {args.to_config}: "
             + ("changed phases: " + ", ".join(map(str, r.changed_phases)) if r.changed_phases
                else "no phase changed")]
    if r.same_before_resume:
        lines.append(f"samples before {r.consumed}: the same in both configs")
    else:
        lines.append(f"samples before {r.consumed}: the new config first differs at sample {r.first_difference}"
                     f"{phase(r.first_difference)}: it rewrites what the job already trained on")
    lines.append(f"served again from {r.consumed} on: {r.served_again} samples the job trained on "
                 f"(the new config run from the start: {r.served_again_uninterrupted})")
    return "\n".join(lines)


def resume_check_command(args: Any) -> int:
    if args.consumed < 0:
        raise ResumeCheckError(f"--consumed {args.consumed}: consumed_samples cannot be negative")
    if args.to is None and args.to_config is None:
        raise ResumeCheckError("give --to LAYOUT (a new data-parallel layout), --to-config NEW_CONFIG "
                               "(a changed or added phase), or both")
    corpus = open_corpus(args.config, progress=False)
    if args.to is None:
        resumed = _to_config(args, corpus)
        if args.json:
            print(json.dumps({"exactly_once": resumed.exactly_once, "phases": _resumed_json(resumed)}))
        else:
            print(_describe_to_config(args, resumed, corpus.config.phases))
        return 0 if resumed.exactly_once else 1
    t = corpus.config.training
    if t is None:
        raise ConfigError(f"{args.config}: training: missing: resume-check needs the layout the job ran with "
                          "(data_parallel_size, micro_batch_size, dataloader_type)")
    if args.split not in corpus.splits or len(corpus.splits[args.split]) == 0:
        raise ResumeCheckError(f"{args.config}: the {args.split} split has no samples")
    old = Sampling(t.data_parallel_size, t.micro_batch_size, t.dataloader_type, t.data_sharding)
    new = parse_to(args.to, args.consumed, t)
    if "batch" in (old.dataloader_type, new.dataloader_type):
        raise ResumeCheckError(f"{args.config}: training.dataloader_type: batch (Megatron-Bridge's sampler): "
                               "resume-check counts Megatron-LM's samplers; compare the streams/ folders instead")
    split = corpus.splits[args.split].indices
    phases = corpus.config.phases if args.split == "train" else None
    in_phase = phases is not None and "cyclic" in (old.dataloader_type, new.dataloader_type)
    try:
        if in_phase:  # each phase its own sampler (docs/phases.md): checked within the phase the job resumes in
            report = check_phased_resume(cyclic_spans(split), old, args.consumed, new)
        else:
            report = check_resume(len(corpus.splits[args.split]), old, args.consumed, new)
    except SamplerError as exc:
        raise ResumeCheckError(f"--consumed {args.consumed} --to {args.to}: {exc}") from None
    facts = {} if phases is None else _phase_facts(split, report, args.consumed)
    resumed = None if args.to_config is None else _to_config(args, corpus)
    if args.json:
        print(json.dumps({"exactly_once": report.exactly_once and (resumed is None or resumed.exactly_once),
                          "epoch": report.epoch, "expected": report.expected,
                          "read_before": report.read_before, "read_after": report.read_after,
                          "repeated": report.repeated.size, "skipped": report.skipped.size,
                          "first_repeated": report.repeated[:SHOWN].tolist(),
                          "first_skipped": report.skipped[:SHOWN].tolist(), **facts,
                          **({} if resumed is None else {"phases": _resumed_json(resumed)})}))
    else:
        print(describe(report, args.split, old, new, args.consumed, facts["phase_at_resume"] if in_phase else None))
        if facts:
            print(_describe_phases(facts))
        if resumed is not None:
            print(_describe_to_config(args, resumed, corpus.config.phases))
    return 0 if report.exactly_once and (resumed is None or resumed.exactly_once) else 1
