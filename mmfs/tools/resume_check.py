"""`mmfs resume-check CONFIG --consumed C --to dp=D,mbs=M[,sampler=...][,sharding=...]`:
does a job that ran with the config's `training:` layout up to consumed_samples C,
resumed on the new layout, read every sample exactly once (mmfs.megatron.resume)?
Exit 0 if so, 1 if not, 2 on a user error."""

from __future__ import annotations

import json
import re
from typing import Any

from mmfs.errors import ConfigError, MmfsError
from mmfs.megatron import open_corpus
from mmfs.megatron.resume import ResumeReport, Sampling, check_resume
from mmfs.megatron.samplers import SamplerError
from mmfs.mount.streams import parse_layout

SHOWN = 10  # ids of each kind printed
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
    return Sampling(layout.data_parallel_size, layout.micro_batch_size, layout.dataloader_type,
                    layout.data_sharding)


def _ids(ids: Any) -> str:
    shown = " ".join(map(str, ids[:SHOWN].tolist()))
    return shown + (" ..." if ids.size > SHOWN else "")


def describe(report: ResumeReport, split: str, old: Sampling, new: Sampling, consumed: int) -> str:
    def name(s: Sampling) -> str:
        sharding = f",sharding={str(s.data_sharding).lower()}" if s.dataloader_type == "cyclic" else ""
        return f"dp={s.data_parallel_size},mbs={s.micro_batch_size},sampler={s.dataloader_type}{sharding}"

    where = f"epoch {report.epoch} of {split}" if report.epoch is not None else split
    lines = [f"{name(old)} up to consumed_samples {consumed}, then {name(new)}: {where}: "
             f"{report.expected} samples in the old layout's pass, {report.read_before} read before, "
             f"{report.read_after} after"]
    if report.exactly_once:
        lines.append("every sample exactly once")
    else:
        for what, ids in (("repeated", report.repeated), ("skipped", report.skipped)):
            lines.append(f"{what}: {ids.size}" + (f" ({_ids(ids)})" if ids.size else ""))
    return "\n".join(lines)


def resume_check_command(args: Any) -> int:
    if args.consumed < 0:
        raise ResumeCheckError(f"--consumed {args.consumed}: consumed_samples cannot be negative")
    corpus = open_corpus(args.config, progress=False)
    t = corpus.config.training
    if t is None:
        raise ConfigError(f"{args.config}: training: missing: resume-check needs the layout the job ran with "
                          "(data_parallel_size, micro_batch_size, dataloader_type)")
    if args.split not in corpus.splits or len(corpus.splits[args.split]) == 0:
        raise ResumeCheckError(f"{args.config}: the {args.split} split has no samples")
    old = Sampling(t.data_parallel_size, t.micro_batch_size, t.dataloader_type, t.data_sharding)
    new = parse_to(args.to, args.consumed, t)
    try:
        report = check_resume(len(corpus.splits[args.split]), old, args.consumed, new)
    except SamplerError as exc:
        raise ResumeCheckError(f"--consumed {args.consumed} --to {args.to}: {exc}") from None
    if args.json:
        print(json.dumps({"exactly_once": report.exactly_once, "epoch": report.epoch, "expected": report.expected,
                          "read_before": report.read_before, "read_after": report.read_after,
                          "repeated": report.repeated.size, "skipped": report.skipped.size,
                          "first_repeated": report.repeated[:SHOWN].tolist(),
                          "first_skipped": report.skipped[:SHOWN].tolist()}))
    else:
        print(describe(report, args.split, old, new, args.consumed))
    return 0 if report.exactly_once else 1
