"""The optional `training:` block: how Megatron's data loader hands samples to
data-parallel ranks, and the global batch size over the run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mmfs.config.checker import Checker
from mmfs.config.rampup import (
    BatchSchedule,
    ScheduleError,
    check_reached,
    constant_schedule,
    rampup_schedule,
    step_schedule,
    train_iters_from_samples,
)
from mmfs.config.safe_yaml import show

# keys that shape the global batch size over the run and its length
SCHEDULE_KEYS = {"rampup_batch_size", "step_batch_size_schedule", "train_samples"}
# evaluation on its own layout (Megatron-Bridge: validation.eval_micro_batch_size,
# eval_global_batch_size, and the cyclic sampler for valid; docs/bridge.md)
EVAL_KEYS = {"eval_micro_batch_size", "eval_global_batch_size", "valid_dataloader_type"}
TRAINING_KEYS = {
    "data_parallel_size", "micro_batch_size", "dataloader_type", "data_sharding",
    "global_batch_size", "train_iters", "eval_interval", "eval_iters", "hybrid_context_parallel",
} | SCHEDULE_KEYS | EVAL_KEYS
DATALOADER_TYPES = ("single", "cyclic")
# Megatron-Bridge's fine-tuning sampler: whole global batches of randperm(split, seed + epoch),
# rank r reading G[r::dp] of each, cut into micro-batches (docs/bridge.md)
BATCH = "batch"
MEGATRON_EVAL_ITERS = 100  # megatron's default for --eval-iters


@dataclass(frozen=True)
class TrainingConfig:
    """How Megatron's data loader hands samples to data-parallel ranks."""

    data_parallel_size: int
    micro_batch_size: int
    dataloader_type: str = "single"  # single | cyclic
    data_sharding: bool = True  # cyclic only; Megatron's default
    global_batch_size: int | None = None
    train_iters: int | None = None
    eval_interval: int | None = None
    eval_iters: int | None = None  # None: Megatron's default (100) where it is needed
    rampup_batch_size: tuple[int, int, int] | None = None
    step_batch_size_schedule: str | None = None
    train_samples: int | None = None
    schedule: BatchSchedule | None = None  # global batch size by iteration (set by load_config)
    eval_micro_batch_size: int | None = None  # None: micro_batch_size
    eval_global_batch_size: int | None = None  # None: Megatron's default (evaluation_batch_size)
    valid_dataloader_type: str | None = None  # None: dataloader_type; Bridge: cyclic
    batch_seed: int = 0  # the config's seed, which the batch sampler reshuffles with (set by load_config)
    # Megatron's --hybrid-context-parallel: its train iterator (HybridCPDataLoaderWrapper)
    # re-deals sub-samples between ranks each step, so train's ranks/ and streams/ are not served.
    hybrid_context_parallel: bool = False

    def evaluation_batch_size(self) -> int:
        """The global batch of every evaluation step: eval_global_batch_size, else
        Megatron's evaluate() default, args.global_batch_size, which is
        micro_batch_size x data_parallel_size when not given, as with a step
        schedule; a ramp-up evaluates at its final size."""
        return self.eval_global_batch_size or self.global_batch_size or self.micro_batch_size * self.data_parallel_size

    @property
    def has_eval_layout(self) -> bool:
        """Evaluation read on a layout of its own (Megatron-Bridge's keys)."""
        return any(getattr(self, k) is not None for k in EVAL_KEYS)

    def split_batch_size(self, split: str) -> int:
        """The global batch `split` is read in: the training's, or an evaluation step's."""
        if split == "train":
            return self.global_batch_size or self.micro_batch_size * self.data_parallel_size
        return self.evaluation_batch_size()

    def files_per_rank(self, split: str, samples: int) -> int:
        """The micro-batches each rank reads in one pass of `split` (of `samples`)."""
        kind, mbs = self.layout(split)
        if kind == BATCH:  # whole global batches only
            gbs = self.split_batch_size(split)
            return samples // gbs * (gbs // (mbs * self.data_parallel_size))
        return samples // (mbs * self.data_parallel_size)

    def layout(self, split: str) -> tuple[str, int]:
        """(dataloader_type, micro_batch_size) of the sampler that reads `split`: train
        the training's; valid and test the eval micro-batch size, valid its own sampler
        (Megatron-Bridge validates with the cyclic sampler), test the training's."""
        if split == "train":
            return self.dataloader_type, self.micro_batch_size
        mbs = self.eval_micro_batch_size or self.micro_batch_size
        return (self.valid_dataloader_type or self.dataloader_type) if split == "valid" else self.dataloader_type, mbs

    def split_schedule(self, split: str) -> BatchSchedule | None:
        """The batches `split` is read in: training follows the schedule; valid and
        test read a constant eval_global_batch_size per evaluation step."""
        if split == "train" or self.schedule is None:
            return self.schedule
        return constant_schedule(self.evaluation_batch_size())

    def run_iterations(self, train_samples: int | None = None) -> int | None:
        """The iterations of the run: train_iters, else those of training.train_samples
        (or of `train_samples`, the train split's configured count, when neither is
        given); None when nothing bounds the run."""
        if self.train_iters is not None:
            return self.train_iters
        samples = self.train_samples if self.train_samples is not None else train_samples
        if samples is None or self.schedule is None:
            return None
        return train_iters_from_samples(self.schedule, samples,
                                        None if self.rampup_batch_size is None else self.rampup_batch_size[2])

    def derived_samples(self) -> dict[str, int] | None:
        """Sample counts per split as Megatron derives them from train_iters or
        train_samples (get_train_valid_test_num_samples), or None without either."""
        if self.train_iters is None and self.train_samples is None:
            return None
        iters = self.run_iterations()
        eval_iters = MEGATRON_EVAL_ITERS if self.eval_iters is None else self.eval_iters
        gbs = self.evaluation_batch_size()
        return {
            "train": self.train_samples if self.train_samples is not None
            else iters * (self.global_batch_size or self.micro_batch_size * self.data_parallel_size),
            "valid": (iters // self.eval_interval + 1) * eval_iters * gbs,
            "test": eval_iters * gbs,
        }

    def derived_from(self, split: str) -> str:
        """The keys derived_samples() computes the split's count from, as a formula."""
        gbs = "training.global_batch_size" if self.global_batch_size else \
            "training.micro_batch_size × training.data_parallel_size"
        if split != "train" and self.eval_global_batch_size:
            gbs = "training.eval_global_batch_size"
        if split == "train":
            return "training.train_samples" if self.train_samples is not None else \
                f"training.train_iters × {gbs}"
        iters = "training.train_iters" if self.train_iters is not None else \
            "the iterations of training.train_samples"
        if split == "valid":
            return f"({iters} ÷ training.eval_interval + 1) × training.eval_iters × {gbs}"
        return f"training.eval_iters × {gbs}"

    def as_dict(self) -> dict[str, Any]:
        scheduled = {k: getattr(self, k) for k in sorted(SCHEDULE_KEYS) if getattr(self, k) is not None}
        if "rampup_batch_size" in scheduled:
            scheduled["rampup_batch_size"] = list(self.rampup_batch_size)
        return {
            **scheduled,
            "data_parallel_size": self.data_parallel_size,
            "micro_batch_size": self.micro_batch_size,
            "dataloader_type": self.dataloader_type,
            "data_sharding": self.data_sharding,
            "global_batch_size": self.global_batch_size,
            "train_iters": self.train_iters,
            "eval_interval": self.eval_interval,
            "eval_iters": self.eval_iters,
            **{k: getattr(self, k) for k in sorted(EVAL_KEYS) if getattr(self, k) is not None},
        }


# Ranks the mount shows a folder for, at most: each costs the daemon a view (about
# 2 KB), and 16,384 is past the data-parallel size of today's largest jobs.
MAX_DATA_PARALLEL_SIZE = 16384


def parse_training(value: Any, checker: Checker) -> TrainingConfig | None:
    """The `training:` block, checked; None when it is absent."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise checker.fail("training", "expected a mapping {data_parallel_size: N, micro_batch_size: N, ...}")
    checker.unknown_keys(value, TRAINING_KEYS, "training.")

    def optional_int(key: str, minimum: int) -> int | None:
        v = value.get(key)
        return None if v is None else checker.integer(v, f"training.{key}", minimum=minimum)

    for key in ("data_parallel_size", "micro_batch_size"):
        if value.get(key) is None:
            raise checker.fail(f"training.{key}", "missing: needed to give each data-parallel rank its micro-batches")
    dp = checker.integer(value["data_parallel_size"], "training.data_parallel_size", minimum=1,
                         maximum=MAX_DATA_PARALLEL_SIZE,
                         why=" (the mount holds a folder of micro-batches per rank)")
    mbs = optional_int("micro_batch_size", 1)
    kind = value.get("dataloader_type", "single")
    if kind not in (*DATALOADER_TYPES, BATCH):
        raise checker.fail("training.dataloader_type", f"{kind!r} is not a dataloader type (single or cyclic; "
                                                       "batch: Megatron-Bridge's)")
    sharding = value.get("data_sharding")
    if sharding is not None:
        sharding = checker.boolean(sharding, "training.data_sharding")
        if kind != "cyclic" and value.get("valid_dataloader_type") != "cyclic":
            raise checker.fail("training.data_sharding", "only applies with dataloader_type: cyclic")
    gbs = optional_int("global_batch_size", 1)
    if gbs is not None and gbs % (mbs * dp):
        raise checker.fail(
            "training.global_batch_size",
            f"{gbs} is not a multiple of micro_batch_size x data_parallel_size = {mbs * dp}",
        )
    train_iters = optional_int("train_iters", 0)
    eval_interval = optional_int("eval_interval", 1)
    eval_iters = optional_int("eval_iters", 0)
    scheduled = _parse_schedule_keys(value, gbs, checker)
    evals = _parse_eval_keys(value, mbs, dp, checker)
    if kind == BATCH:
        for key in ("rampup_batch_size", "step_batch_size_schedule"):
            if scheduled[key] is not None:
                raise checker.fail(f"training.{key}", "the batch sampler (Megatron-Bridge's) deals whole global "
                                   "batches of one size")
        if gbs is None:
            raise checker.fail("training.global_batch_size", "missing: the batch sampler deals whole global batches")
    given = [k for k in sorted(EVAL_KEYS) if evals[k] is not None]
    scheduled_by = [k for k in ("rampup_batch_size", "step_batch_size_schedule") if scheduled[k] is not None]
    if given and scheduled_by:  # Bridge's keys; Bridge 0.6.x runs no batch-size schedule
        raise checker.fail(f"training.{given[0]}", f"Megatron-Bridge's evaluation keys with {scheduled_by[0]}: "
                           "Bridge 0.6.x runs no batch-size schedule, and mmfs has no reference for the mix")
    if train_iters is not None and scheduled["train_samples"] is not None:
        raise checker.fail("training.train_samples", "give train_iters or train_samples, not both (Megatron asserts)")
    if train_iters is not None or scheduled["train_samples"] is not None:
        if gbs is None and scheduled["step_batch_size_schedule"] is None:
            raise checker.fail("training.global_batch_size", "missing: train_iters counts iterations of a global batch")
        if eval_interval is None:
            raise checker.fail("training.eval_interval", "missing: with train_iters, Megatron sizes the validation "
                               "split as (train_iters // eval_interval + 1) x eval_iters x global_batch_size")
    else:
        for key in ("eval_interval", "eval_iters"):
            if value.get(key) is not None:
                raise checker.fail(f"training.{key}", "only used with train_iters or train_samples "
                                                      "(to derive the sample counts)")
    hybrid = checker.boolean(value.get("hybrid_context_parallel", False), "training.hybrid_context_parallel")
    return TrainingConfig(dp, mbs, kind, True if sharding is None else sharding, gbs, train_iters,
                          eval_interval, eval_iters, **scheduled, **evals, hybrid_context_parallel=hybrid)


def _parse_eval_keys(value: dict, mbs: int, dp: int, checker: Checker) -> dict[str, Any]:
    """eval_micro_batch_size, eval_global_batch_size, valid_dataloader_type: evaluation
    on a layout of its own, as Megatron-Bridge runs it."""
    emb = value.get("eval_micro_batch_size")
    emb = None if emb is None else checker.integer(emb, "training.eval_micro_batch_size", minimum=1)
    egb = value.get("eval_global_batch_size")
    egb = None if egb is None else checker.integer(egb, "training.eval_global_batch_size", minimum=1)
    step = (emb or mbs) * dp
    if egb is not None and egb % step:
        raise checker.fail("training.eval_global_batch_size",
                           f"{egb} is not a multiple of eval_micro_batch_size x data_parallel_size = {step}")
    kind = value.get("valid_dataloader_type")
    if kind is not None and kind not in DATALOADER_TYPES:
        raise checker.fail("training.valid_dataloader_type", f"{kind!r} is not a dataloader type (single or cyclic)")
    return {"eval_micro_batch_size": emb, "eval_global_batch_size": egb, "valid_dataloader_type": kind}


def samples_with_training(samples: dict[str, int | None], training: TrainingConfig | None,
                          checker: Checker) -> dict[str, int | None]:
    """`samples` with the counts train_iters derives filled in; a count given in
    both places must agree."""
    derived = None if training is None else training.derived_samples()
    if derived is None:
        return samples
    out = dict(samples)
    source = "train_iters" if training.train_iters is not None else "train_samples"
    for split, n in derived.items():
        if out.get(split) is None:
            out[split] = n
        elif out[split] != n:
            raise checker.fail(
                f"samples.{split}",
                f"{out[split]} disagrees with training.{source}, "
                f"which gives {n} as Megatron derives it; "
                "give one of them",
            )
    return out


# -- the global batch size over the run (training.rampup_batch_size, ...) ----------


def _parse_schedule_keys(value: dict, gbs: int | None, checker: Checker) -> dict[str, Any]:
    """The keys of `training:` that shape the global batch size and the run's length."""
    out: dict[str, Any] = {"rampup_batch_size": None, "step_batch_size_schedule": None, "train_samples": None}
    ramp = value.get("rampup_batch_size")
    if ramp is not None:
        key = "training.rampup_batch_size"
        if not isinstance(ramp, list) or len(ramp) != 3:
            raise checker.fail(key, f"expected [start, increment, ramp_samples], got {show(ramp)}")
        out["rampup_batch_size"] = tuple(checker.integer(v, f"{key}[{i}]", minimum=0) for i, v in enumerate(ramp))
        if gbs is None:
            raise checker.fail("training.global_batch_size", "missing: the ramp-up ends at global_batch_size")
    step = value.get("step_batch_size_schedule")
    if step is not None:
        key = "training.step_batch_size_schedule"
        if not isinstance(step, str):
            raise checker.fail(key, f"expected a string like \"0:768 250B:1536\", got {show(step)}")
        if ramp is not None:
            raise checker.fail(key, "give rampup_batch_size or step_batch_size_schedule, not both")
        if gbs is not None:
            raise checker.fail(key, "Megatron-LM refuses it with --global-batch-size: leave global_batch_size out")
        out["step_batch_size_schedule"] = step
    samples = value.get("train_samples")
    if samples is not None:
        out["train_samples"] = checker.integer(samples, "training.train_samples", minimum=0)
    return out


def with_schedule(training: TrainingConfig | None, sequence_length: int, train_samples: int | None,
                  checker: Checker) -> TrainingConfig | None:
    """`training` with its BatchSchedule. Every batch size the run reaches must be a
    multiple of micro_batch_size x data_parallel_size and not below the one before
    (Megatron asserts both when an iteration reaches the size); the run is
    train_iters, train_samples, else the `samples.train` count (`train_samples`),
    else unbounded."""
    if training is None:
        return None
    t = training
    key = "training.global_batch_size"
    try:
        if t.rampup_batch_size is not None:
            key = "training.rampup_batch_size"
            schedule = rampup_schedule(*t.rampup_batch_size, t.global_batch_size)
        elif t.step_batch_size_schedule is not None:
            key = "training.step_batch_size_schedule"
            # Megatron-LM passes --seq-length: thresholds are tokens.
            schedule = step_schedule(t.step_batch_size_schedule, sequence_length)
        elif t.global_batch_size is not None:
            schedule = constant_schedule(t.global_batch_size)
        else:
            return t
        t = replace(t, schedule=schedule)
        check_reached(schedule, t.micro_batch_size * t.data_parallel_size, t.run_iterations(train_samples))
    except ScheduleError as exc:
        raise checker.fail(key, str(exc)) from None
    return t
