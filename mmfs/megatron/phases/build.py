"""Building a run in phases (config `phases:`): valid and test as the top level
builds them (under restart also each phase's own: evals.py), the train split as
one blend over the run's GPTDatasets (plan.py says how), cached like Megatron's
own indices."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from mmfs.config.phases import Phases
from mmfs.config.schema import SPLITS
from mmfs.megatron.build.builder import Builder, log
from mmfs.megatron.build.tasks import _Task
from mmfs.megatron.cache.index_cache import IndexCache, default_cache_dir
from mmfs.megatron.indices.blend import check_blend_fits, sizes_per_dataset
from mmfs.megatron.indices.built import BlendIndices, GptIndices, SplitIndices
from mmfs.megatron.indices.splits import normalize, split_matrix
from mmfs.megatron.phases.evals import RestartEvals
from mmfs.megatron.phases.plan import (
    PhasedBlend,
    PhaseSlice,
    continue_blend,
    megatron_weights,
    restart_blend,
    used_up,
    wrap,
)
from mmfs.megatron.phases.sampling import PhaseTail, blend_tail, gpt_tail

PHASED_ARRAYS = {
    "dataset_index": (("int16",), 1),
    "dataset_sample_index": (("int64",), 1),
    "draws": (("int64",), 2),
}


@dataclass
class PhasedSplit(SplitIndices):
    """The train split of a run in phases: `gpts` are the run's GPTDatasets (under
    restart, each phase's own), `blend` the run's blend (plan.py), and per phase
    its slice and draws. phase_gpts[k]: the run's GPTDataset ids phase k draws from.
    evals: under restart, per phase {valid, test: the indices its relaunch builds}."""

    phases: Phases | None = None
    slices: list[PhaseSlice] = field(default_factory=list)
    draws: np.ndarray | None = None  # int64[phases, gpts]
    evals: list[dict[str, SplitIndices]] = field(default_factory=list)
    tails: list[PhaseTail] = field(default_factory=list)  # restart: each phase's dataset past its samples

    @property
    def positions(self) -> np.ndarray:
        """int64[phases + 1, gpts]: where each GPTDataset stands as each phase starts
        (the last row: at the end of training)."""
        out = np.zeros((len(self.slices) + 1, len(self.gpts)), dtype=np.int64)
        np.cumsum(self.draws, axis=0, out=out[1:])
        return out

    @property
    def starts(self) -> list[int]:
        return [s.start for s in self.slices]

    def phase_of(self, sample: int) -> int:
        return self.phases.phase_of(sample)


class PhasedBuilder(Builder):
    """Builder for a config with `phases:`; without, exactly the Builder. Every
    index that does not wait for another (valid and test, the train GPTDatasets,
    under continue the run's blend, under restart each phase's blend) is obtained
    in one round, as a single blend's are."""

    def build(self, splits: tuple[str, ...] = SPLITS) -> dict[str, SplitIndices]:
        phases = self.config.phases
        if phases is None or "train" not in splits:
            return super().build(splits)
        others = tuple(s for s in splits if s != "train")
        plans = self.plan_splits(others)
        bookend = split_matrix(self.config.split)[0]
        if bookend is None:
            raise self.fail("split", "gives the train split no share; a run in phases trains on it")
        train = _ContinuePlan(self, phases, bookend) if phases.mode == "continue" else \
            _RestartPlan(self, phases, bookend)
        evals = RestartEvals(self, phases, others, plans) if phases.mode == "restart" else None
        self._run(self.first_tasks(plans) + train.tasks + (evals.tasks if evals else []))
        rest = self.finish(plans)
        out = {"train": train.finish(), **rest}
        if evals is not None:
            out["train"].evals = evals.finish(rest)
        return {s: out[s] for s in SPLITS if s in out}

    def phased_task(self, phases: Phases, slices: list[PhaseSlice], bases: list[str], folder_spec,
                    make_blend, wrapped_to: list[int] | None = None) -> _Task:
        """The run's blend, cached: described by the phases and the cache names of
        the run's GPTDatasets (`bases`); wrapped_to: the GPTDatasets' lengths, for
        the blend whose used-up datasets start their next pass (continue)."""
        c = self.config
        total = phases.train_samples
        description = json.dumps({
            "class": "PhasedBlend", "phase_mode": phases.mode, "datasets": bases,
            "phases": [{"start": s.start, "end": s.end, "datasets": list(s.members), "weights": list(s.weights)}
                       for s in slices],
            **({} if wrapped_to is None else {"wrapped_to": wrapped_to}),
        }, indent=4)
        cache = IndexCache(c.cache_dir or default_cache_dir(folder_spec, c, "BlendedDataset"), description,
                           "PhasedBlend", "train")

        def make() -> dict:
            t0 = time.perf_counter()
            blend: PhasedBlend = make_blend()
            log.info("train/phases: blend of %d samples over %d phases (%.2f s)", total, len(slices),
                     time.perf_counter() - t0)
            return {"dataset_index": blend.dataset_index, "dataset_sample_index": blend.dataset_sample_index,
                    "draws": blend.draws}

        def fits(arrays: dict) -> bool:
            return arrays["dataset_index"].shape == (total,) and arrays["dataset_sample_index"].shape == (total,) \
                and arrays["draws"].shape == (len(slices), len(bases))

        return _Task(cache, PHASED_ARRAYS, "train/phases", fits, make,
                     lambda: check_blend_fits(total, f"{c.path}: samples.train: ", "samples.train"))


def _slices(phases: Phases, members: list[list[int]]) -> list[PhaseSlice]:
    return [PhaseSlice(start, end, tuple(m), tuple(megatron_weights(p.blend.weights)))
            for p, (start, end), m in zip(phases.phases, phases.bounds(), members)]


def _split(phases: Phases, slices: list[PhaseSlice], gpts: list[GptIndices], task: _Task) -> PhasedSplit:
    arrays, from_cache = task.result
    draws = arrays["draws"]
    draws = np.asarray(draws.map() if hasattr(draws, "map") else draws)
    blend = BlendIndices(None, phases.train_samples, task.cache,
                         {k: arrays[k] for k in ("dataset_index", "dataset_sample_index")}, from_cache)
    return PhasedSplit("train", gpts, blend, phases=phases, slices=slices, draws=draws)


class _ContinuePlan:
    """phase_mode continue: one GPTDataset per dataset, as megatron-core builds it
    for the first phase that names it with the run's train sample count."""

    def __init__(self, builder: PhasedBuilder, phases: Phases, bookend: tuple) -> None:
        c = builder.config
        first: dict[str, tuple] = {}  # dataset file -> (spec, phase, its size)
        for p in phases.phases:
            # a bare prefix is Megatron's bare GPTDataset of the run's samples (no surplus)
            sizes = [phases.train_samples] if p.bare else \
                sizes_per_dataset(normalize(p.blend.weights), phases.train_samples, c.mid_level_dataset_surplus)
            for spec, n in zip(p.blend.datasets, sizes):
                first.setdefault(spec.file, (spec, p, n))
        ids = {file: g for g, file in enumerate(first)}
        self.builder = builder
        self.specs = [spec for spec, _, _ in first.values()]
        self.made = [builder.gpt_task(spec, "train", bookend, n, f"{p.key}.datasets") for spec, p, n in first.values()]
        self.phases = phases
        self.slices = _slices(phases, [[ids[d.file] for d in p.blend.datasets] for p in phases.phases])
        self.blend_task = builder.phased_task(phases, self.slices, [t.cache.base for t, _ in self.made],
                                              self.specs[0], lambda: continue_blend(self.slices, len(ids)))
        self.tasks = [self.blend_task] + [t for t, _ in self.made]

    def finish(self) -> PhasedSplit:
        gpts = [GptIndices(spec, params, t.cache, *t.result) for spec, (t, params) in zip(self.specs, self.made)]
        split = _split(self.phases, self.slices, gpts, self.blend_task)
        lengths = [len(g) for g in gpts]
        if not used_up(split.positions, lengths):
            return split
        # Some dataset is drawn past its GPTDataset: its next pass, cached as a blend of its own.
        log.info("train/phases: %s used up; each next pass starts over at its first sample",
                 ", ".join(g.spec.name for g, n in zip(gpts, split.positions[-1]) if n > len(g)))
        unwrapped = split.blend

        def make() -> PhasedBlend:
            return PhasedBlend(unwrapped.dataset_index,
                               wrap(unwrapped.dataset_index, unwrapped.dataset_sample_index, lengths),
                               split.draws, split.positions)

        task = self.builder.phased_task(self.phases, self.slices, [t.cache.base for t, _ in self.made],
                                        self.specs[0], make, wrapped_to=lengths)
        self.builder._run([task])
        return _split(self.phases, self.slices, gpts, task)


class _RestartPlan:
    """phase_mode restart: each phase's own GPTDatasets and BlendedDataset, sized
    to the phase, as megatron-core builds them from that phase's arguments alone."""

    def __init__(self, builder: PhasedBuilder, phases: Phases, bookend: tuple) -> None:
        self.builder, self.phases = builder, phases
        self.plans = []
        for p, (start, end) in zip(phases.phases, phases.bounds()):
            # a bare prefix (no weight): Megatron's bare GPTDataset of the phase's samples, no blend
            plan, = builder._plan_blend(p.blend.datasets, None if p.bare else p.blend.weights, {"train": bookend},
                                        f"{p.key}.datasets", per_split=False, split_sizes={"train": end - start})
            plan.setdefault("size", end - start)
            self.plans.append(plan)
        tasks: dict[str, _Task] = {}  # by cache file: a phase identical to another shares it
        for plan in self.plans:
            if "blend_task" in plan:
                plan["blend_task"] = tasks.setdefault(plan["blend_task"].cache.base, plan["blend_task"])
            plan["gpt_tasks"] = [tasks.setdefault(t.cache.base, t) for t in plan["gpt_tasks"]]
        self.tasks = list(tasks.values())

    def finish(self) -> PhasedSplit:
        run_gpts: dict[str, GptIndices] = {}  # by cache file, in order of first use
        members = []
        for p, plan in zip(self.phases.phases, self.plans):
            for spec, params, t in zip(plan["specs"], plan["params"], plan["gpt_tasks"]):
                if t.cache.base not in run_gpts:
                    run_gpts[t.cache.base] = GptIndices(spec, params, t.cache, *t.result)
            gpts = [run_gpts[t.cache.base] for t in plan["gpt_tasks"]]
            members.append([t.cache.base for t in plan["gpt_tasks"]])
            if "blend_task" not in plan:  # the bare GPTDataset: its samples in order
                plan["arrays"] = {"dataset_index": np.zeros(plan["size"], dtype=np.int16),
                                  "dataset_sample_index": np.arange(plan["size"], dtype=np.int64)}
                continue
            task = plan["blend_task"]
            blend = BlendIndices(task.weights, plan["size"], task.cache, *task.result)
            self.builder._check_blend_fits("train", gpts, blend, plan["drawn"], f"{p.key}.datasets")
            plan["arrays"] = {"dataset_index": blend.dataset_index, "dataset_sample_index": blend.dataset_sample_index}
        index_of = {base: g for g, base in enumerate(run_gpts)}
        members = [[index_of[base] for base in m] for m in members]
        slices = _slices(self.phases, members)
        gpts = list(run_gpts.values())
        blends = [plan["arrays"] for plan in self.plans]
        task = self.builder.phased_task(self.phases, slices, [g.cache.base for g in gpts], gpts[0].spec,
                                        lambda: restart_blend(slices, blends, len(gpts)))
        self.builder._run([task])
        split = _split(self.phases, slices, gpts, task)
        # what each relaunch's own dataset holds past the phase's samples (its cyclic sampler reads it)
        split.tails = [gpt_tail(s.members[0], len(gpts[s.members[0]]), s.size) if p.bare else
                       blend_tail(b["dataset_index"], b["dataset_sample_index"], list(s.members), s.size)
                       for p, s, b in zip(self.phases.phases, slices, blends)]
        return split
