"""Building a run in phases (config `phases:`): valid and test as the top level
builds them, the train split as one blend over the run's GPTDatasets
(phases.py says how), cached like Megatron's own indices."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from mmfs.config.phases import Phases
from mmfs.config.schema import SPLITS
from mmfs.megatron.blend import check_blend_fits, sizes_per_dataset
from mmfs.megatron.builder import Builder, default_cache_dir, log
from mmfs.megatron.buildtasks import _Task
from mmfs.megatron.cache import IndexCache
from mmfs.megatron.indices import BlendIndices, GptIndices, SplitIndices
from mmfs.megatron.phases import PhasedBlend, PhaseSlice, continue_blend, restart_blend
from mmfs.megatron.splits import normalize, split_matrix

PHASED_ARRAYS = {
    "dataset_index": (("int16",), 1),
    "dataset_sample_index": (("int64",), 1),
    "draws": (("int64",), 2),
}


@dataclass
class PhasedSplit(SplitIndices):
    """The train split of a run in phases: `gpts` are the run's GPTDatasets (under
    restart, each phase's own), `blend` the run's blend (phases.py), and per phase
    its slice and draws. phase_gpts[k]: the run's GPTDataset ids phase k draws from."""

    phases: Phases | None = None
    slices: list[PhaseSlice] = field(default_factory=list)
    draws: np.ndarray | None = None  # int64[phases, gpts]

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
    """Builder for a config with `phases:`; without, exactly the Builder."""

    def build(self, splits: tuple[str, ...] = SPLITS) -> dict[str, SplitIndices]:
        phases = self.config.phases
        if phases is None or "train" not in splits:
            return super().build(splits)
        out = super().build(tuple(s for s in splits if s != "train"))
        bookend = split_matrix(self.config.split)[0]
        if bookend is None:
            raise self.fail("split", "gives the train split no share; a run in phases trains on it")
        out["train"] = self._continue(phases, bookend) if phases.mode == "continue" else \
            self._restart(phases, bookend)
        return out

    # -- continue: one GPTDataset per dataset ---------------------------------------

    def _continue(self, phases: Phases, bookend: tuple) -> PhasedSplit:
        c = self.config
        first: dict[str, tuple] = {}  # dataset file -> (spec, phase, its size)
        for p in phases.phases:
            weights = normalize(p.blend.weights)
            sizes = sizes_per_dataset(weights, phases.train_samples, c.mid_level_dataset_surplus)
            for spec, n in zip(p.blend.datasets, sizes):
                first.setdefault(spec.file, (spec, p, n))
        ids = {file: g for g, file in enumerate(first)}
        made = [self.gpt_task(spec, "train", bookend, n, f"{p.key}.datasets")
                for spec, p, n in first.values()]
        self._run([t for t, _ in made])
        gpts = [GptIndices(spec, params, t.cache, *t.result)
                for (spec, _, _), (t, params) in zip(first.values(), made)]
        slices = self._slices(phases, [[ids[d.file] for d in p.blend.datasets] for p in phases.phases])
        lengths = [len(g) for g in gpts]
        return self._phased(phases, slices, gpts, lambda: continue_blend(slices, lengths))

    # -- restart: each phase's own BlendedDataset ----------------------------------------

    def _restart(self, phases: Phases, bookend: tuple) -> PhasedSplit:
        plans = []
        for p, (start, end) in zip(phases.phases, phases.bounds()):
            plan, = self._plan_blend(p.blend.datasets, p.blend.weights, {"train": bookend},
                                     f"{p.key}.datasets", per_split=False, split_sizes={"train": end - start})
            plans.append(plan)
        tasks: dict[str, _Task] = {}  # by cache file: a phase identical to another shares it
        for plan in plans:
            plan["blend_task"] = tasks.setdefault(plan["blend_task"].cache.base, plan["blend_task"])
            plan["gpt_tasks"] = [tasks.setdefault(t.cache.base, t) for t in plan["gpt_tasks"]]
        self._run(list(tasks.values()))
        run_gpts: dict[str, GptIndices] = {}
        members = []
        for p, plan in zip(phases.phases, plans):
            gpts = [run_gpts.setdefault(t.cache.base, GptIndices(spec, params, t.cache, *t.result))
                    for spec, params, t in zip(plan["specs"], plan["params"], plan["gpt_tasks"])]
            task = plan["blend_task"]
            blend = BlendIndices(task.weights, plan["size"], task.cache, *task.result)
            self._check_blend_fits("train", gpts, blend, plan["drawn"], f"{p.key}.datasets")
            plan["blend"] = blend
            members.append([list(run_gpts).index(t.cache.base) for t in plan["gpt_tasks"]])
        slices = self._slices(phases, members)
        gpts = list(run_gpts.values())
        return self._phased(phases, slices, gpts, lambda: restart_blend(
            slices, [{"dataset_index": plan["blend"].dataset_index,
                      "dataset_sample_index": plan["blend"].dataset_sample_index} for plan in plans], len(gpts)))

    # -- the run's blend ------------------------------------------------------------------

    @staticmethod
    def _slices(phases: Phases, members: list[list[int]]) -> list[PhaseSlice]:
        return [PhaseSlice(start, end, tuple(m), tuple(normalize(normalize(p.blend.weights))))
                for p, (start, end), m in zip(phases.phases, phases.bounds(), members)]

    def _phased(self, phases: Phases, slices: list[PhaseSlice], gpts: list[GptIndices], make_blend) -> PhasedSplit:
        c = self.config
        total = phases.train_samples
        description = json.dumps({
            "class": "PhasedBlend", "phase_mode": phases.mode,
            "datasets": [g.cache.base for g in gpts],
            "phases": [{"start": s.start, "end": s.end, "datasets": list(s.members), "weights": list(s.weights)}
                       for s in slices],
        }, indent=4)
        cache = IndexCache(c.cache_dir or default_cache_dir(gpts[0].spec, c, "BlendedDataset"), description,
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
                and arrays["draws"].shape == (len(slices), len(gpts))

        task = _Task(cache, PHASED_ARRAYS, "train/phases", fits, make,
                     lambda: check_blend_fits(total, f"{c.path}: samples.train: ", "samples.train"))
        self._run([task])
        arrays, from_cache = task.result
        draws = arrays["draws"]
        draws = np.asarray(draws.map() if hasattr(draws, "map") else draws)
        blend = BlendIndices(None, total, cache, {k: arrays[k] for k in ("dataset_index", "dataset_sample_index")},
                             from_cache)
        return PhasedSplit("train", gpts, blend, phases=phases, slices=slices, draws=draws)
