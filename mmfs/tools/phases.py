"""`mmfs phases CONFIG [--json]`: what each phase of a run in phases draws (docs/phases.md).

Per phase: where it starts (iteration, sample), and per dataset its weight, the
share it realised, its draws, its position before and after the phase, how many
samples of its GPTDataset are left, and how many of the phase's samples were
served earlier in the run (under restart: what the relaunched phase reads again).
Under restart, each phase's own valid and test too: their samples, what Megatron
builds of them, and the evaluations its launch runs (docs/phases.md)."""

from __future__ import annotations

import json
from typing import Any

from mmfs.errors import ConfigError
from mmfs.megatron import open_corpus
from mmfs.megatron.phases.evaluations import eval_schedule
from mmfs.megatron.phases.facts import describe_phases, served_before


def phases_report(config_path: str) -> dict[str, Any]:
    corpus = open_corpus(config_path, progress=False)
    train = corpus.indices.get("train")
    if getattr(train, "phases", None) is None:
        raise ConfigError(f"{config_path}: phases: missing: the config has no `phases:` list "
                          "(see docs/phases.md)")
    report = describe_phases(train, eval_schedule(corpus.config.training, train.phases.train_samples))
    for phase, again in zip(report["phases"], served_before(corpus.splits["train"])):
        phase["served_before"] = again
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"phase_mode: {report['phase_mode']}"]
    for p in report["phases"]:
        # Megatron's numbering, from 1: start_iteration counts the iterations trained before
        it = "" if p["start_iteration"] is None else f"iteration {p['start_iteration'] + 1:,}, "
        lines.append(f"phase {p['phase']}: from {it}sample {p['start_sample']:,} to {p['end_sample']:,} "
                     f"({p['samples']:,} samples; {p['served_before']:,} served before in the run)")
        lines.append(f"  {'dataset':<24} {'weight':>8} {'share':>8} {'draws':>10} {'position':>21} "
                     f"{'left':>10}")
        for d in p["datasets"]:
            position = f"{d['position_before']:,} -> {d['position_after']:,}"
            lines.append(f"  {d['name']:<24} {d['normalized_weight']:>8.4f} {d['share']:>8.4f} {d['draws']:>10,} "
                         f"{position:>21} {d['left']:>10,}")
        for name, split in p.get("splits", {}).items():
            lines.append(f"  {name}: {split['samples']:,} samples ({split['top_level']}), {_evaluated(split)}")
    return "\n".join(lines)


def _evaluated(split: dict[str, Any]) -> str:
    """What the phase's launch evaluates of its own valid or test split."""
    e = split["evaluations"]
    if e is None:
        return "evaluations not known (give training.train_iters and eval_interval)"
    if e["count"] == 0:
        return "not evaluated by this launch"
    first, last = e["after_iterations"]
    after = f"after iteration {first:,}" if first == last else f"after iterations {first:,} to {last:,}"
    lo, hi = e["consumed_samples"]
    return f"{e['count']:,} evaluation(s) {after}, consumed_samples {lo:,} -> {hi:,}"


def phases_command(args) -> int:
    report = phases_report(args.config)
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0
