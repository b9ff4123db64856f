"""phase_mode restart: each phase's valid and test as its relaunch builds them.

Megatron-LM builds every split again at each relaunch from that launch's data
arguments (build_train_valid_test_data_loaders): phase k's valid and test are
the BlendedDataset (for one prefix without a weight, the bare GPTDataset) that
megatron-core builds from phase k's blend with the run's split and Megatron's eval
sizes, which do not depend on the phase (samples.valid, samples.test: from
train_iters, eval_interval and eval_iters). Their indices are megatron-core's own,
cached under Megatron's own descriptions and names: a phase with the top level's
blend shares the top level's valid and test, and two phases with one blend share
theirs. Which launch reads which part of them: evaluations.py."""

from __future__ import annotations

from mmfs.config.phases import Phases
from mmfs.config.schema import SPLITS
from mmfs.megatron.build.tasks import _Task
from mmfs.megatron.indices.built import SplitIndices
from mmfs.megatron.indices.splits import split_matrix

EVAL_SPLITS = ("valid", "test")


class RestartEvals:
    """The valid and test indices of every phase of a restart run: planned beside the
    run's other indices (`tasks`: those no other plan of the build holds), then
    `finish`ed once they are obtained."""

    def __init__(self, builder, phases: Phases, splits: tuple[str, ...], top_plans: list[dict]) -> None:
        self.builder = builder
        matrix = split_matrix(builder.config.split)
        bookends = {s: matrix[SPLITS.index(s)] for s in EVAL_SPLITS if s in splits}
        # one task per cache file: the top level's where a phase's is the same
        held: dict[str, _Task] = {t.cache.base: t for t in builder.first_tasks(top_plans)}
        drawn: dict[str, list] = {p["blend_task"].cache.base: p["drawn"] for p in top_plans if p.get("blend_task")}
        new: list[_Task] = []

        def one(task: _Task) -> _Task:
            if task.cache.base not in held:
                held[task.cache.base] = task
                new.append(task)
            return held[task.cache.base]

        self.plans: list[list[dict]] = []
        for p in phases.phases:
            plans = builder._plan_blend(p.blend.datasets, None if p.bare else p.blend.weights, bookends,
                                        f"{p.key}.datasets", per_split=False)
            for plan in plans:
                plan["gpt_tasks"] = [one(t) for t in plan["gpt_tasks"]]
                if plan.get("blend_task"):
                    plan["blend_task"] = one(plan["blend_task"])
                    # the draws a fresh build counted, for the check that the blend fits its datasets
                    plan["drawn"] = drawn.setdefault(plan["blend_task"].cache.base, plan["drawn"])
            self.plans.append(plans)
        self.tasks = new

    def finish(self, top: dict[str, SplitIndices]) -> list[dict[str, SplitIndices]]:
        """Per phase, {split: its indices}; one SplitIndices for all that are the same
        (the top level's when a phase's is)."""
        same = {_identity(s): s for s in top.values()}
        out = []
        for plans in self.plans:
            splits = self.builder.finish(plans)
            out.append({name: same.setdefault(_identity(s), s) for name, s in splits.items()})
        return out


def _identity(split: SplitIndices) -> tuple[str, str]:
    """A split's top-level dataset by its cache file (Megatron's description hash)."""
    top = split.blend if split.blend is not None else split.gpts[0]
    return split.name, top.cache.base


__all__ = ["EVAL_SPLITS", "RestartEvals"]
