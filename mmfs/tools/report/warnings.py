"""The warnings of `mmfs report`, each with the numbers that triggered it: a dataset
listed twice in a split (the same file, or the same bytes under two names: equal
sizes and an equal hash of the .idx), a dataset read for more than one epoch, a
split that gets almost nothing of a dataset, a weight that draws no samples; in
a run in phases, per phase, and the samples of a phase served earlier in the run."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from mmfs.tools.report.words import plural

ALMOST_NOTHING = 10  # documents of a dataset in a split below which the split "gets almost nothing"
EPOCH_SLACK = 1e-9


def blend_warnings(corpus, splits: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Warnings over the figures of every split (mmfs.tools.report.command._split). A weight
    "rounds to no samples" when weight x the run's samples rounds to 0: Megatron's
    greedy blend still draws such a dataset once or so, early on. A run in phases is
    looked at phase by phase for what a blend decides (a dataset listed twice, a
    weight of no samples, samples served again) and over the whole run for epochs."""
    out: list[dict[str, Any]] = []
    datasets = {e.name: e.dataset for e in corpus.datasets}
    for name, split in splits.items():
        gpts = corpus.indices[name].gpts
        phases = split.get("phases")
        if phases is None:
            out += _duplicates(name, gpts, datasets)
        else:
            for p, s in zip(phases["phases"], corpus.indices[name].slices):
                out += _duplicates(f"{name} phase {p['phase']}", [gpts[g] for g in s.members], datasets)
        for row in split["datasets"]:
            out += _row_warnings(name, split, row, corpus.sample_tokens, per_phase=phases is not None)
        if phases is not None:
            out += _phase_warnings(name, phases, split["run"]["samples"])
    return out


def _phase_warnings(split: str, phases: dict[str, Any], run: int) -> list[dict[str, Any]]:
    """Per phase the run reads: a weight that rounds to no samples of the phase, and the
    samples of the phase that were served earlier in the run."""
    out = []
    for p in phases["phases"]:
        if p["start_sample"] >= run:
            continue
        where = f"{split} phase {p['phase']}"
        for row in p["datasets"]:
            w, d, expected = row["normalized_weight"], row["name"], row["normalized_weight"] * p["samples"]
            if w > 0 and (round(expected) == 0 or row["draws"] == 0):
                out.append({"kind": "no_samples", "split": split, "phase": p["phase"], "dataset": d, "weight": w,
                            "run_samples": p["samples"], "expected": expected, "samples": row["draws"],
                            "message": f"{where}: {d}'s weight {w:.3g} of the phase's "
                                       f"{plural(p['samples'], 'sample')} is {expected:.3g} samples: it rounds to "
                                       f"none (the blend draws {row['draws']:,})"})
        if p["served_before"]:  # None: not counted (report/phases.py SERVED_COUNTED_UP_TO)
            why = (" (restart: each phase reads its datasets from their first sample)"
                   if phases["phase_mode"] == "restart" else " (a used-up dataset's next pass)")
            out.append({"kind": "served_again", "split": split, "phase": p["phase"], "samples": p["samples"],
                        "served_before": p["served_before"], "phase_mode": phases["phase_mode"],
                        "message": f"{where}: {p['served_before']:,} of its {plural(p['samples'], 'sample')} "
                                   f"were served earlier in the run{why}"})
    return out


def _row_warnings(split: str, figs: dict[str, Any], row: dict[str, Any], sample_tokens: int,
                  per_phase: bool = False) -> list[dict]:
    out = []
    d = row["dataset"]
    if row["epochs"] > 1 + EPOCH_SLACK:
        out.append({"kind": "epochs", "split": split, "dataset": d, "epochs": row["epochs"],
                    "tokens": row["tokens"], "tokens_available": row["tokens_available"],
                    "message": f"{split}: {d} is read for {row['epochs']:.2f} epochs ({row['tokens']:,} tokens of "
                               f"the {row['tokens_available']:,} its {_documents(row['documents'])} hold): the "
                               "model sees its documents more than once"})
    if row["documents"] < ALMOST_NOTHING or row["tokens_available"] < sample_tokens:
        out.append({"kind": "almost_nothing", "split": split, "dataset": d, "documents": row["documents"],
                    "tokens_available": row["tokens_available"],
                    "message": f"{split}: gets almost nothing of {d}: {_documents(row['documents'])}, "
                               f"{row['tokens_available']:,} tokens (a sample is {sample_tokens:,}); "
                               f"{plural(row['samples'], 'sample')} {'is' if row['samples'] == 1 else 'are'} cut "
                               "from them"})
    run = figs["run"]["samples"]
    if not per_phase and run > 0 and row["weight"] > 0 and (round(row["weight"] * run) == 0 or row["samples"] == 0):
        out.append({"kind": "no_samples", "split": split, "dataset": d, "weight": row["weight"],
                    "run_samples": run, "expected": row["weight"] * run, "samples": row["samples"],
                    "message": f"{split}: {d}'s weight {row['weight']:.3g} of the run's {plural(run, 'sample')} is "
                               f"{row['weight'] * run:.3g} samples: it rounds to none (the blend draws "
                               f"{row['samples']:,})"})
    return out


def _documents(n: int) -> str:
    return plural(n, "document")


def _duplicates(split: str, gpts: list, datasets: dict) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    by_file: dict[str, str] = {}
    by_size: dict[tuple, list[str]] = {}
    for g in gpts:
        name = g.spec.name
        file = os.path.realpath(getattr(datasets[name], "idx_path", None) or g.spec.file)  # through symlinks
        if file in by_file:
            out.append({"kind": "same_path", "split": split, "datasets": [by_file[file], name], "path": g.spec.path,
                        "message": f"{split}: {by_file[file]} and {name} are the same file {g.spec.path}: "
                                   "the blend lists it twice"})
            continue
        by_file[file] = name
        size = _sizes(datasets[name])
        if size is not None:
            by_size.setdefault(size, []).append(name)
    for (idx_size, bin_size), names in by_size.items():
        if len(names) < 2:
            continue
        groups: dict[tuple[str, str], list[str]] = {}
        for n in names:  # the .idx holds lengths only: the .bin's ends tell datasets of equal lengths apart
            ds = datasets[n]
            groups.setdefault((file_digest(ds.idx_path), ends_digest(ds.bin_path)), []).append(n)
        for (digest, _), same in groups.items():
            if len(same) > 1:
                out.append({"kind": "same_bytes", "split": split, "datasets": same, "idx_bytes": idx_size,
                            "bin_bytes": bin_size, "idx_sha256": digest,
                            "message": f"{split}: {', '.join(same)} hold the same bytes under {len(same)} names "
                                       f"(.idx {idx_size:,} bytes, sha256 {digest[:12]}; .bin {bin_size:,} bytes, "
                                       "the same first and last MiB): "
                                       "the blend has one dataset more than once"})
    return out


def _sizes(dataset) -> tuple[int, int] | None:
    """(.idx bytes, .bin bytes) of a dataset on local disk; None for one elsewhere."""
    try:
        return os.path.getsize(dataset.idx_path), os.path.getsize(dataset.bin_path)
    except (AttributeError, OSError, TypeError):
        return None


HASHED_AT_MOST = 256 << 20  # bytes of an index hashed (a .pbin is its own index: its head only)


def ends_digest(path: str, span: int = 1 << 20) -> str:
    """SHA-256 of a file's first and last `span` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(span))
        size = os.fstat(f.fileno()).st_size
        if size > span:
            f.seek(max(span, size - span))
            h.update(f.read(span))
    return h.hexdigest()


def file_digest(path: str, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's first HASHED_AT_MOST bytes (the whole of any usual .idx)."""
    h = hashlib.sha256()
    left = HASHED_AT_MOST
    with open(path, "rb") as f:
        while left > 0 and (block := f.read(min(chunk, left))):
            h.update(block)
            left -= len(block)
    return h.hexdigest()
