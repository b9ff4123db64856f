"""The figures of `mmfs report` for a run in phases (config `phases:`, docs/phases.md).

The train split of a phased run is one blend over the run's GPTDatasets (under
restart each phase has its own GPTDatasets, so one dataset may have several).
The report shows one row, and one series, per dataset across the whole run
(GPTDatasets of the same dataset file summed), each with its weight averaged over
the run (each phase's weight times the samples of the phase the run reads), and per
phase what mmfs.json's `phases` section says (mmfs.megatron.phases.facts: weights,
draws, realised shares, positions) with the samples of the phase served earlier in
the run. Under restart each phase's own valid and test get the figures of a split,
with the evaluations its launch runs on them. Nothing here computes an index: the
draws and positions are the phased split's own."""

from __future__ import annotations

from typing import Any

import numpy as np

from mmfs.megatron.phases.evaluations import eval_schedule
from mmfs.megatron.phases.facts import describe_evals, describe_phases, served_before

# Samples served earlier in the run are found by walking every train sample (phases.facts.served_before,
# about 15 us each): past this many the report leaves them uncounted and says so.
SERVED_COUNTED_UP_TO = 1_000_000
SUMMED = ("samples", "samples_built", "tokens", "mid_document")
LONGEST = ("epochs_in_index", "epochs_reached")
ADDED_ELEMENTWISE = ("documents_per_sample", "samples_per_epoch")


def is_phased(indices) -> bool:
    return getattr(indices, "phases", None) is not None


def dataset_groups(gpts: list) -> np.ndarray:
    """For each GPTDataset of the split, its dataset (numbered by dataset file, in
    order of first use)."""
    ids: dict[str, int] = {}
    return np.asarray([ids.setdefault(g.spec.file, len(ids)) for g in gpts], dtype=np.int64)


def run_weights(indices, groups: np.ndarray, run_samples: int) -> list[float]:
    """Each dataset's weight over the samples the run reads: sum over phases of its
    weight in the phase (as Megatron holds it) times the phase's samples read, over
    the samples read."""
    out = np.zeros(int(groups.max()) + 1 if len(groups) else 0)
    for s in indices.slices:
        read = max(0, min(s.end, run_samples) - s.start)
        for g, w in zip(s.members, s.weights):
            out[groups[g]] += w * read
    return (out / run_samples if run_samples else out).tolist()


def merge_rows(rows: list[dict[str, Any]], groups: np.ndarray, run_samples: int) -> list[dict[str, Any]]:
    """One row per dataset from the rows of its GPTDatasets (mmfs.tools.report.command._gpt_row):
    counts summed, the furthest epoch kept; shares and epochs recomputed."""
    out: list[dict[str, Any]] = []
    for g, row in zip(groups, rows):
        if g < len(out):
            merged = out[g]
            for key in SUMMED:
                merged[key] += row[key]
            for key in LONGEST:
                merged[key] = max(merged[key], row[key])
            for key in ADDED_ELEMENTWISE:
                merged[key] = _add(merged[key], row[key])
        else:
            out.append(dict(row))
    for r in out:
        r["share"] = r["samples"] / run_samples if run_samples else 0.0
        r["epochs"] = r["tokens"] / r["tokens_available"] if r["tokens_available"] else 0.0
        r["mid_document_share"] = r["mid_document"] / r["samples"] if r["samples"] else 0.0
    return out


def _add(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[k] if k < len(a) else 0) + (b[k] if k < len(b) else 0) for k in range(n)]


def phase_figures(indices, reader, groups: np.ndarray, schedule, training=None) -> dict[str, Any]:
    """mmfs.json's `phases` section, each phase with its first and last iteration
    (under a batch size), the samples of it served earlier in the run, and each
    dataset's number in the report's rows; and each dataset's draws per phase and
    (under continue) its position as each phase starts and at the end. training:
    the config's TrainingConfig, for the evaluations of each restart launch."""
    figs = describe_phases(indices, eval_schedule(training, indices.phases.train_samples))
    total = indices.slices[-1].end
    if total <= SERVED_COUNTED_UP_TO:
        served = served_before(reader)
    else:
        served = [None] * len(indices.slices)
        figs["note"] = (f"samples served earlier in the run not counted: the run's {total:,} train samples are "
                        f"more than the {SERVED_COUNTED_UP_TO:,} the report walks (`mmfs phases` counts them)")
    for phase, s, again in zip(figs["phases"], indices.slices, served):
        phase["served_before"] = again
        phase["first_iteration"] = None if schedule is None else schedule.iteration_at(s.start)[0]
        phase["last_iteration"] = None if schedule is None else schedule.iteration_at(s.end)[0] - 1
        for row, g in zip(phase["datasets"], s.members):
            row["dataset"] = int(groups[g])
    datasets = int(groups.max()) + 1
    draws = np.zeros((len(indices.slices), datasets), dtype=np.int64)
    np.add.at(draws, (slice(None), groups), indices.draws)  # GPTDatasets of one dataset summed
    figs["draws"] = draws.tolist()  # [phase][dataset]
    if figs["phase_mode"] == "continue":  # one GPTDataset per dataset: its position is the dataset's
        figs["positions"] = indices.positions.tolist()  # [phase boundary][dataset]
    return figs


def phase_split_figures(corpus, figure) -> dict[str, list[dict[str, Any]]]:
    """Under restart, per split (valid, test), each phase's own: {phase, the
    evaluations its launch runs on it, and figure(split name, its indices), the
    figures of a split}. {} under continue."""
    train = corpus.indices.get("train")
    if not corpus.phase_splits or train is None:
        return {}
    facts = describe_evals(train, eval_schedule(corpus.config.training, train.phases.train_samples))
    out: dict[str, list[dict[str, Any]]] = {}
    for k, (own, said) in enumerate(zip(corpus.phase_splits, facts)):
        for name, reader in own.items():
            out.setdefault(name, []).append({"phase": k, "evaluations": said[name]["evaluations"],
                                             **figure(name, reader.indices)})
    return out


def phase_bands(figs: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """A band on the mix chart per phase the run reads."""
    out = []
    for p in figs["phases"]:
        if p["start_sample"] >= run["samples"]:
            continue
        band = {"kind": "phase", "phase": p["phase"], "label": f"phase {p['phase']}",
                "first_sample": p["start_sample"], "end_sample": min(p["end_sample"], run["samples"])}
        if run["axis"] == "iteration":
            band |= {"first_iteration": p["first_iteration"],
                     "last_iteration": min(p["last_iteration"], run["iterations"])}
        out.append(band)
    return out
