"""Which launch of a restart run evaluates when, and where its valid loader starts
(phase_mode restart: Megatron-LM's --phase-transition-iterations, docs/phases.md).

Megatron-LM core_v0.19.0 (megatron/training/training.py): train() evaluates after
every iteration that is a multiple of eval_interval (before it saves and exits at
a phase transition, so an evaluation at a transition is the ending launch's), and
pretrain() evaluates valid once more after the last iteration, then test; a
launch that exits at a transition runs neither of those two. Each evaluation is
eval_iters steps of eval_global_batch_size samples, and each step adds that to
args.consumed_valid_samples, which the checkpoint carries to the next launch:
build_train_valid_test_data_loaders builds the launch's valid loader over its own
valid dataset at that consumed_valid_samples, and its test loader at 0. So launch
k, started after iteration S_k, has run S_k // eval_interval evaluations before it
(Megatron's own fallback when a checkpoint holds no count gives the same) and
reads the run's valid stream from there with its own dataset.

Index math only: no config parsing, no dataset."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from mmfs.config.training import MEGATRON_EVAL_ITERS


@dataclass(frozen=True)
class EvalSchedule:
    """A run's evaluations: after iterations eval_interval, 2 x eval_interval, ...
    up to train_iters, then once more after train_iters; each eval_iters steps of
    batch_size samples (eval_global_batch_size)."""

    train_iters: int
    eval_interval: int
    eval_iters: int
    batch_size: int

    @property
    def count(self) -> int:
        """The run's evaluations (get_train_valid_test_num_samples' total_eval_points)."""
        return self.train_iters // self.eval_interval + 1 if self.eval_iters > 0 else 0

    @property
    def samples_per_evaluation(self) -> int:
        return self.eval_iters * self.batch_size

    def done_after(self, iteration: int) -> int:
        """Evaluations the training loop has run once `iteration` iterations are trained."""
        return min(iteration, self.train_iters) // self.eval_interval if self.eval_iters > 0 else 0

    def after_iteration(self, evaluation: int) -> int:
        """The iteration after which evaluation `evaluation` (0-based) runs."""
        in_loop = self.train_iters // self.eval_interval
        return (evaluation + 1) * self.eval_interval if evaluation < in_loop else self.train_iters


def eval_schedule(training: Any, train_samples: int | None) -> EvalSchedule | None:
    """The evaluations of a config's training block (TrainingConfig), or None when it
    does not say when Megatron evaluates (no eval_interval, or no run length)."""
    if training is None or training.eval_interval is None:
        return None
    iters = training.run_iterations(train_samples)
    if iters is None:
        return None
    eval_iters = MEGATRON_EVAL_ITERS if training.eval_iters is None else training.eval_iters
    return EvalSchedule(iters, training.eval_interval, eval_iters, training.evaluation_batch_size())


@dataclass(frozen=True)
class LaunchEvaluations:
    """What launch `phase` of a restart run evaluates of one split: evaluations
    [first, end) of the run's (0-based), with its loader built at consumed_samples
    `loader_start`, reading [loader_start, read_end) of the split's stream."""

    phase: int
    first: int
    end: int
    loader_start: int
    read_end: int
    after_iterations: tuple[int, ...]  # the first and last iteration it evaluates after (empty: none)

    @property
    def count(self) -> int:
        return self.end - self.first

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "after_iterations": list(self.after_iterations),
                "loader_consumed_samples": self.loader_start, "consumed_samples": [self.loader_start, self.read_end]}


def valid_launches(schedule: EvalSchedule, starts: list[int]) -> list[LaunchEvaluations]:
    """Per launch (phase), its valid evaluations; starts: the iterations trained
    before each phase (start_iteration; the first is 0)."""
    step = schedule.samples_per_evaluation
    out = []
    for k, s in enumerate(starts):
        first = schedule.done_after(s)
        end = schedule.done_after(starts[k + 1]) if k + 1 < len(starts) else schedule.count
        ends = (schedule.after_iteration(first), schedule.after_iteration(end - 1)) if end > first else ()
        out.append(LaunchEvaluations(k, first, end, first * step, end * step, ends))
    return out


def test_launches(schedule: EvalSchedule, phases: int) -> list[LaunchEvaluations]:
    """Per launch, its test evaluation: only the last launch's, from consumed_samples
    0 (the others exit at their transition before it)."""
    count = 1 if schedule.eval_iters > 0 else 0
    out = [LaunchEvaluations(k, 0, 0, 0, 0, ()) for k in range(phases - 1)]
    after = (schedule.train_iters, schedule.train_iters) if count else ()
    out.append(LaunchEvaluations(phases - 1, 0, count, 0, count * schedule.samples_per_evaluation, after))
    return out


def launch_of(launches: list[LaunchEvaluations], evaluation: int) -> LaunchEvaluations:
    """The launch that runs evaluation `evaluation` (0-based; below the run's count)."""
    firsts = [launch.first for launch in launches]
    return launches[bisect.bisect_right(firsts, evaluation) - 1]


__all__ = ["EvalSchedule", "LaunchEvaluations", "eval_schedule", "launch_of", "test_launches", "valid_launches"]
