"""The `phases:` list and `phase_mode:` of a config: a run whose train blend
changes at phase boundaries (docs/phases.md).

    phases:
      - datasets: [{path: web, weight: 0.7}, {path: code, weight: 0.3}]   # from iteration 1
      - start_iteration: 60000                # or start_samples, or start_tokens
        datasets: [{path: web, weight: 0.2}, {path: math, weight: 0.8}]
    phase_mode: continue                      # or restart

Each phase names where it starts (iterations trained before it, consumed samples,
or tokens: consumed samples × sequence_length, as Megatron's step batch-size
schedule counts them) and its train blend, with the keys of the top level
(`datasets`, `data_path`). Only the train split changes: valid and test are the
top level's (or, with no top-level data keys, the first phase's). Everything else
(sequence length, tokenizer, split, seed, ...) is the run's and cannot change.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Any

from mmfs.config.blend import Blend, parse_blend, parse_data_words
from mmfs.config.checker import Checker
from mmfs.config.safe_yaml import show
from mmfs.config.training import TrainingConfig

PHASE_MODES = ("continue", "restart")
STARTS = ("start_iteration", "start_samples", "start_tokens")
PHASE_DATA_KEYS = ("datasets", "data_path")
PHASE_KEYS = set(STARTS) | set(PHASE_DATA_KEYS)
PHASES_SHAPE = "expected a non-empty list of phases ({start_iteration, datasets})"
PHASE_SHAPE = "expected a mapping {start_iteration: N, datasets: [...]}"
# Keys of the run that a phase may not change, and why (the one line says it).
FIXED_KEYS = {
    "sequence_length": "every sample of a run has one length",
    "add_extra_token_to_sequence": "every sample of a run has one length",
    "tokenizer": "a run has one vocabulary",
    "split": "a dataset's train sequences are the same in every phase",
    "seed": "a dataset keeps its Megatron order from phase to phase",
    "samples": "the run's length is the top level's",
    "training": "the data-parallel layout is the run's",
    "blend_per_split": "phases change the train blend only",
    "data_args_path": "give the phase's datasets as `datasets` or `data_path`",
    "per_split_data_args_path": "phases change the train blend only",
    "mid_level_dataset_surplus": "a dataset's Megatron size is the run's",
    "drop_last_partial_validation_sequence": "valid and test are not phased",
    "cache_dir": "the run has one index cache",
    "storage": "the run has one storage setting",
    "phases": "phases do not nest",
    "phase_mode": "one mode holds for the whole run",
}


@dataclass(frozen=True)
class Phase:
    """One phase: from consumed_samples `start` (until the next phase's start, or the
    end of training) the train split blends `blend` (every dataset with a weight)."""

    index: int
    key: str  # "phases[1]": what a message about it names
    start: int  # consumed_samples where it starts (0 for the first)
    start_iteration: int | None  # iterations trained before it (None without a batch size)
    blend: Blend
    # one dataset given without a weight: Megatron builds it as a bare GPTDataset of the
    # phase's samples, not as a one-dataset blend with the surplus (which can differ)
    bare: bool = False


@dataclass(frozen=True)
class Phases:
    """A run in phases: `mode` (continue | restart), its phases in order, and where
    training ends (samples.train: the end of the last phase)."""

    mode: str
    phases: tuple[Phase, ...]
    train_samples: int

    def bounds(self) -> list[tuple[int, int]]:
        """(first sample, one past the last) of each phase."""
        starts = [p.start for p in self.phases] + [self.train_samples]
        return list(zip(starts, starts[1:]))

    def phase_of(self, sample: int) -> int:
        """The phase (index) that train sample `sample` belongs to."""
        return bisect.bisect_right([p.start for p in self.phases], sample) - 1

    def with_blends(self, change) -> Phases:
        """These phases with each blend changed by change(blend, key)."""
        return Phases(self.mode, tuple(replace(p, blend=change(p.blend, p.key)) for p in self.phases),
                      self.train_samples)

    def as_dict(self) -> list[dict[str, Any]]:
        return [{"start_iteration": p.start_iteration, "start_samples": p.start,
                 "datasets": [{"name": d.name, "path": d.path, "weight": d.weight} for d in p.blend.datasets]}
                for p in self.phases]


def first_phase_data(raw: dict, checker: Checker) -> tuple[dict, str]:
    """`raw` with the first phase's data as the top level's when the top level has
    none (valid and test, and the split, then come from it), and the prefix that a
    message about those data names ("phases[0]." when they came from there)."""
    phases = raw.get("phases")
    if phases is None:
        return raw, ""
    if not isinstance(phases, list) or not phases:
        raise checker.fail("phases", PHASES_SHAPE)  # (not "datasets: missing", a key the user never meant)
    if not isinstance(phases[0], dict):
        raise checker.fail("phases[0]", PHASE_SHAPE)
    given = [k for k in PHASE_DATA_KEYS if phases[0].get(k) is not None]
    if len(given) == 1:
        return {**raw, given[0]: phases[0][given[0]]}, "phases[0]."
    if not given:
        raise checker.fail("phases[0].datasets", "missing: the first phase's datasets (with weights), or give "
                                                 "them at the top level")
    return raw, ""


def parse_phases(raw: dict, checker: Checker, base_dir: str, top: Blend | None, samples: dict,
                 sequence_length: int, training: TrainingConfig | None) -> Phases | None:
    """The checked `phases:` list (None without one: the run is today's). `top` is
    the top-level blend (None with blend_per_split); `samples` the split counts."""
    value, mode = raw.get("phases"), raw.get("phase_mode")
    if value is None:
        if mode is not None:
            raise checker.fail("phase_mode", "only applies with a `phases:` list")
        return None
    mode = "continue" if mode is None else mode
    if mode not in PHASE_MODES:
        raise checker.fail("phase_mode", f"{show(mode)} is not a phase mode (continue or restart)")
    if not isinstance(value, list) or not value:
        raise checker.fail("phases", PHASES_SHAPE)
    if top is None:
        raise checker.fail("phases", "phases change the train blend of `datasets` or `data_path`; "
                                     "they cannot be used with blend_per_split")
    total = samples.get("train")
    if total is None:
        raise checker.fail("samples.train", "missing: a run in phases needs its train sample count "
                                            "(or training.train_iters) to know where the last phase ends")
    schedule = None if training is None else training.schedule
    if mode == "restart" and schedule is not None and schedule.kind != "constant":
        raise checker.fail("phase_mode", "restart is Megatron's --phase-transition-iterations, which needs a "
                                         "fixed global batch size (it counts a phase's samples as iterations × "
                                         "global_batch_size); use phase_mode: continue with a batch-size schedule")
    out: list[Phase] = []
    checked: dict[str, str] = {}  # file -> its default name, once looked at
    for k, entry in enumerate(value):
        key = f"phases[{k}]"
        if not isinstance(entry, dict):
            raise checker.fail(key, PHASE_SHAPE)
        for name in entry:
            if name in FIXED_KEYS:
                raise checker.fail(f"{key}.{name}", f"a phase cannot change {name} ({FIXED_KEYS[name]}); "
                                                    "set it once at the top level")
        checker.unknown_keys(entry, PHASE_KEYS, f"{key}.")
        start, iteration = _start(entry, key, k, checker, schedule, sequence_length)
        if out and start <= out[-1].start:
            raise checker.fail(f"{key}.{_start_key(entry)}",
                               f"starts at sample {start:,}, not after {out[-1].key} (sample {out[-1].start:,}); "
                               "list phases in the order they start")
        if start >= total:
            raise checker.fail(f"{key}.{_start_key(entry)}",
                               f"starts at sample {start:,}, at or past the end of training "
                               f"({total:,} train samples); remove the phase or train longer")
        group = 0 if training is None else training.micro_batch_size * training.data_parallel_size
        if group and training.dataloader_type == "cyclic" and start % group:
            raise checker.fail(f"{key}.{_start_key(entry)}",
                               f"starts at sample {start:,}, not a multiple of micro_batch_size x "
                               f"data_parallel_size = {group}: each phase's cyclic sampler reads whole "
                               "micro-batch steps (a phase starts where a global batch starts)")
        blend, bare = _blend(entry, key, k, checker, base_dir, top, checked)
        if mode == "continue":
            _no_twice(blend, entry, key, checker)
        out.append(Phase(k, key, start, iteration, blend, bare))
    return Phases(mode, tuple(out), total)


def _no_twice(blend: Blend, entry: dict, key: str, checker: Checker) -> None:
    """Under continue a dataset has one position: it is named once a phase."""
    seen: dict[str, int] = {}
    where = f"{key}.{'data_path' if entry.get('data_path') is not None else 'datasets'}"
    for i, d in enumerate(blend.datasets):
        if d.file in seen:
            raise checker.fail(f"{where}[{i}].path", f"names {d.name} a second time in the phase (first as "
                                                     f"[{seen[d.file]}]); give it once, with the two weights summed")
        seen[d.file] = i


def _start_key(entry: dict) -> str:
    given = [s for s in STARTS if entry.get(s) is not None]
    return given[0] if given else "start_iteration"


def _start(entry: dict, key: str, k: int, checker: Checker, schedule: Any,
           sequence_length: int) -> tuple[int, int | None]:
    """(consumed_samples, iterations before it) where the phase starts."""
    given = [s for s in STARTS if entry.get(s) is not None]
    if len(given) > 1:
        raise checker.fail(f"{key}.{given[1]}", f"give one of {', '.join(STARTS)}, not both {given[0]} and {given[1]}")
    if not given:
        if k == 0:
            return 0, 0 if schedule is not None else None
        raise checker.fail(f"{key}.start_iteration", "missing: where the phase starts (start_iteration, "
                                                     "start_samples or start_tokens)")
    name = given[0]
    n = checker.integer(entry[name], f"{key}.{name}", minimum=0)
    if k == 0 and n != 0:
        raise checker.fail(f"{key}.{name}", f"the first phase starts at 0 (training's start), got {n}; "
                                            "leave it out")
    if name == "start_iteration":
        if schedule is None:
            raise checker.fail(f"{key}.start_iteration", "needs training.global_batch_size (or a batch-size "
                                                         "schedule) to count iterations in samples; or give "
                                                         "start_samples")
        return schedule.consumed_before(n + 1), n
    samples = n if name == "start_samples" else n // sequence_length
    if name == "start_tokens" and n % sequence_length:
        raise checker.fail(f"{key}.start_tokens", f"{n:,} tokens falls inside sample {samples:,} (a sample is "
                                                  f"{sequence_length} tokens); a phase starts where a global "
                                                  f"batch starts: give a multiple of {sequence_length}")
    if schedule is None:
        return samples, None
    iteration, offset = schedule.iteration_at(samples)
    if offset:
        before = schedule.consumed_before(iteration)
        after = before + schedule.batch_size(iteration)
        what = f"{n:,} tokens = sample {samples:,}" if name == "start_tokens" else f"sample {samples:,}"
        raise checker.fail(f"{key}.{name}", f"{what} falls inside iteration {iteration} (samples {before:,} to "
                                            f"{after - 1:,}); a phase starts where a global batch starts: give "
                                            f"{before:,} or {after:,} samples")
    return samples, iteration - 1


def _blend(entry: dict, key: str, k: int, checker: Checker, base_dir: str, top: Blend,
           checked: dict[str, str]) -> tuple[Blend, bool]:
    """The phase's blend (every dataset with a weight), and whether it is one dataset
    given without a weight."""
    given = [d for d in PHASE_DATA_KEYS if entry.get(d) is not None]
    if len(given) > 1:
        raise checker.fail(f"{key}.{given[1]}", "give `datasets` or `data_path`, not both")
    if not given:
        if k == 0:
            blend = top
        else:
            raise checker.fail(f"{key}.datasets", "missing: the phase's datasets (with weights)")
    else:
        name = given[0]
        value = entry[name]
        if name == "data_path" and isinstance(value, list) and value and all(isinstance(w, str) for w in value):
            value = parse_data_words(value, checker, f"{key}.data_path")
        blend = parse_blend(value, checker, f"{key}.{name}", base_dir, checked)
    where = f"{key}.{given[0] if given else 'datasets'}"
    if blend.weights is None:
        if len(blend.datasets) > 1:
            raise checker.fail(f"{where}[0].weight", "missing: a phase blends its datasets by weight; "
                                                     "give each one a weight")
        return Blend((replace(blend.datasets[0], weight=1.0),)), True  # one dataset: all of the phase
    return blend, False  # (every weight is above 0: parse_blend refuses 0, so no phase's weights sum to 0)
