"""The global batch size over a run (training.rampup_batch_size, training.
step_batch_size_schedule) against megatron-core's calculators, Megatron-LM's
training loop and its evaluate() as recorded in tests/reference/batch_schedules.json,
and `mmfs which` following it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from golden_cases import PUBLIC, write_case_config
from mmfs.config.rampup import ScheduleError, check_reached, rampup_schedule, step_schedule
from mmfs.config.schema import load_config
from mmfs.tools.which import which
from mount_fixtures import mmfs

REFERENCE = json.loads((Path(__file__).parent / "reference" / "batch_schedules.json").read_text())
CASES = REFERENCE["cases"]


def _schedule(case: dict):
    if "rampup_batch_size" in case:
        return rampup_schedule(*case["rampup_batch_size"], case["global_batch_size"])
    return step_schedule(case["step_batch_size_schedule"], case["sequence_length"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c.get("rampup_batch_size") or c["step_batch_size_schedule"]))
def test_iteration_to_consumed_samples_as_megatrons_calculator(case):
    schedule = _schedule(case)
    expected = case["consumed_before_iteration"]
    assert [schedule.consumed_before(i) for i in range(1, len(expected) + 1)] == expected
    for i, c in enumerate(expected, start=1):
        assert schedule.iteration_at(c) == (i, 0)
        if i < len(expected):
            assert schedule.batch_size(i) == schedule.batch_size_at(c) == expected[i] - c


def _config(tmp_path: Path, training: dict, name: str = "c", drop_samples: bool = False) -> Path:
    path = write_case_config("p2_blend2_u16", tmp_path / name)
    raw = yaml.safe_load(path.read_text())
    raw["training"] = training
    if drop_samples:
        raw.pop("samples", None)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _layout_cases():
    return [c for c in CASES if (c["micro_batch_size"], c["data_parallel_size"]) == (2, 4)
            and c.get("sequence_length", 128) == 128]


def _training(case: dict) -> dict:
    training = {"data_parallel_size": 4, "micro_batch_size": 2}
    if "rampup_batch_size" in case:
        return {**training, "rampup_batch_size": case["rampup_batch_size"],
                "global_batch_size": case["global_batch_size"]}
    return {**training, "step_batch_size_schedule": case["step_batch_size_schedule"]}


@pytest.mark.parametrize("case", _layout_cases(), ids=lambda c: "rampup" if "rampup_batch_size" in c else "step")
def test_which_follows_the_schedule_inside_and_after_it(tmp_path, case):
    golden = json.loads((PUBLIC / "p2_blend2_u16" / "ranks-single_dp4_mb2.json").read_text())["ranks"]["train"]
    config = _config(tmp_path, _training(case))
    expected = case["consumed_before_iteration"]
    stream_end = len(golden["0"]) * 8
    last = max(i for i in range(1, len(expected)) if expected[i] <= stream_end)
    for iteration in (1, 3, 9, 12, last):  # inside the ramp and after it
        proc = mmfs("which", config, "--iteration", iteration, "--json")
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        lo, hi = expected[iteration - 1], expected[iteration]
        assert result["consumed_samples"] == [lo, hi]
        for r in result["ranks"]:
            got = [[s["sample"] for s in b["samples"]] for b in r["microbatches"]]
            assert got == golden[str(r["rank"])][lo // 8:hi // 8]
        by_consumed = mmfs("which", config, "--consumed", lo, "--json")
        assert json.loads(by_consumed.stdout) == result
    # a consumed_samples value inside an iteration (a job resumed on another layout)
    inside = mmfs("which", config, "--consumed", expected[12] + 8, "--json")
    result = json.loads(inside.stdout)
    assert result["iteration"] is None and result["consumed_samples"][0] == expected[12] + 8


def test_mmfs_json_gives_the_rule(tmp_path):
    case = _layout_cases()[0]
    corpus_json = mmfs("build", _config(tmp_path, _training(case)), "--json")
    assert corpus_json.returncode == 0, corpus_json.stderr
    rule = json.loads(corpus_json.stdout)["training"]["batch_schedule"]
    expected = case["consumed_before_iteration"]
    for i in range(1, len(expected) + 1):  # apply the rule as a reader of mmfs.json would
        seg = [s for s in rule["segments"] if s["first_iteration"] <= i][-1]
        assert seg["first_consumed"] + (i - seg["first_iteration"]) * seg["batch_size"] == expected[i - 1]


def test_train_samples_derive_iterations_and_eval_counts_as_megatron(tmp_path):
    base = {"data_parallel_size": 4, "micro_batch_size": 2, "eval_interval": 5, "eval_iters": 2}
    constant = load_config(str(_config(tmp_path, {**base, "global_batch_size": 24, "train_samples": 1000}, "a", True)))
    # update_train_iters: 1000 // 24 = 41 iterations; valid (41 // 5 + 1) x 2 x 24; test 2 x 24
    assert constant.samples == {"train": 1000, "valid": 9 * 2 * 24, "test": 48}
    case = next(c for c in _layout_cases() if "step_batch_size_schedule" in c)
    step = load_config(str(_config(tmp_path, {**_training(case), **base, "train_samples": 100}, "b", True)))
    # iterations while consumed < 100; eval counts use Megatron's default gbs (mbs x dp)
    iters = sum(1 for c in case["consumed_before_iteration"] if c < 100)
    assert step.samples == {"train": 100, "valid": (iters // 5 + 1) * 2 * 8, "test": 16}


@pytest.mark.parametrize("training,key,words", [
    ({"rampup_batch_size": [4, 4, 100], "global_batch_size": 24}, "training.rampup_batch_size",
     "reaches a global batch size of 4"),
    ({"rampup_batch_size": [8, 16, 100], "global_batch_size": 32}, "training.rampup_batch_size",
     "not a multiple of the increment"),
    ({"rampup_batch_size": [8, 8, 0], "global_batch_size": 24}, "training.rampup_batch_size", "divides by zero"),
    ({"rampup_batch_size": [8, 8], "global_batch_size": 24}, "training.rampup_batch_size", "expected [start"),
    ({"rampup_batch_size": [8, 8, 100]}, "training.global_batch_size", "missing"),
    ({"step_batch_size_schedule": "0:8 0:16"}, "training.step_batch_size_schedule", "strictly increasing"),
    ({"step_batch_size_schedule": "1K:8"}, "training.step_batch_size_schedule", "first threshold must be 0"),
    ({"step_batch_size_schedule": "0:8 1K:12"}, "training.step_batch_size_schedule",
     "reaches a global batch size of 12"),
    ({"step_batch_size_schedule": "0:x"}, "training.step_batch_size_schedule", "not a number"),
    ({"step_batch_size_schedule": 8}, "training.step_batch_size_schedule", "expected a string"),
    ({"step_batch_size_schedule": "0:8", "global_batch_size": 8}, "training.step_batch_size_schedule",
     "refuses it with --global-batch-size"),
    ({"global_batch_size": 8, "train_iters": 4, "train_samples": 9, "eval_interval": 2},
     "training.train_samples", "not both"),
])
def test_bad_schedules_are_one_line_naming_the_key(tmp_path, training, key, words):
    config = _config(tmp_path, {"data_parallel_size": 4, "micro_batch_size": 2, **training})
    proc = mmfs("build", config)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{config}: {key}: " in proc.stderr and words in proc.stderr, proc.stderr


@pytest.mark.parametrize("args,words", [
    (["--consumed", "12"], "multiple of micro_batch_size x data_parallel_size = 8"),
    (["--consumed", "-8"], "multiple of"),
    (["--iteration", "1", "--consumed", "8"], "not allowed with"),
])
def test_which_consumed_errors_are_one_line(tmp_path, args, words):
    config = _config(tmp_path, {"data_parallel_size": 4, "micro_batch_size": 2, "global_batch_size": 24})
    proc = mmfs("which", config, *args)
    # (argparse's own errors come after its usage lines)
    assert proc.returncode == 2 and words in proc.stderr.splitlines()[-1], proc.stderr


# -- a job resumed anywhere, the training loop's asserts, evaluation steps ------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c.get("rampup_batch_size") or c["step_batch_size_schedule"]))
def test_a_job_resumed_at_any_consumed_samples_gets_the_calculators_size(case):
    schedule = _schedule(case)
    step = case["micro_batch_size"] * case["data_parallel_size"]
    assert [schedule.batch_size_at(k * step) for k in range(len(case["resumed_batch_size"]))] == \
        case["resumed_batch_size"]


@pytest.mark.parametrize("loop", REFERENCE["loops"],
                         ids=lambda c: f"{c['step_batch_size_schedule']}-{c['train_iters']}")
def test_sizes_are_checked_where_megatrons_training_loop_reaches_them(loop):
    schedule = step_schedule(loop["step_batch_size_schedule"], loop["sequence_length"])
    consumed = loop["consumed_before_iteration"]
    assert [schedule.consumed_before(i) for i in range(1, len(consumed) + 1)] == consumed
    step = loop["micro_batch_size"] * loop["data_parallel_size"]
    assertion = loop["assertion"]
    if assertion is None:
        check_reached(schedule, step, loop["train_iters"])
        return
    with pytest.raises(ScheduleError) as exc:
        check_reached(schedule, step, loop["train_iters"])
    assert f"at iteration {assertion['iteration']} " in str(exc.value)
    decrease = "should not decrease" in assertion["message"]
    assert ("Number of microbatches should not decrease" in str(exc.value)) == decrease
    assert ("not a multiple" in str(exc.value)) == (not decrease)
    check_reached(schedule, step, assertion["iteration"] - 1)  # the run before it is fine


def _loop_training(loop: dict) -> dict:
    return {"data_parallel_size": loop["data_parallel_size"], "micro_batch_size": loop["micro_batch_size"],
            "step_batch_size_schedule": loop["step_batch_size_schedule"], "train_iters": loop["train_iters"],
            "eval_interval": 1000, "eval_iters": 1}


def test_a_decrease_the_run_reaches_is_one_line_and_one_it_never_reaches_is_accepted(tmp_path):
    loops = [c for c in REFERENCE["loops"] if c["sequence_length"] == 128]
    for n, loop in enumerate(loops):
        config = _config(tmp_path, _loop_training(loop), f"loop{n}", drop_samples=True)
        if loop["assertion"] is None:
            load_config(str(config))
            continue
        proc = mmfs("build", config)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"{config}: training.step_batch_size_schedule: " in proc.stderr
        assert f"at iteration {loop['assertion']['iteration']} " in proc.stderr
    # samples.train bounds the run when train_iters and train_samples are not given
    late = {"data_parallel_size": 4, "micro_batch_size": 2, "step_batch_size_schedule": "0:16 2K:24 10M:12"}
    assert load_config(str(_config(tmp_path, late, "bounded"))).samples["train"] < 10_000_000 // 128
    unbounded = _config(tmp_path, late, "unbounded", drop_samples=True)
    proc = mmfs("build", unbounded)
    assert proc.returncode == 2 and "should not decrease" in proc.stderr, proc.stderr


def _evaluation_config(tmp_path: Path, evaluation: dict) -> Path:
    # evaluations = train_iters // eval_interval + 1, as Megatron sizes the valid split
    training = {**evaluation["training"], "eval_iters": evaluation["eval_iters"], "eval_interval": 5,
                "train_iters": 5 * (evaluation["evaluations"] - 1)}
    return _config(tmp_path, training, f"eval{id(evaluation)}", drop_samples=True)


@pytest.mark.parametrize("evaluation", REFERENCE["evaluations"], ids=lambda e: json.dumps(e["training"]))
def test_valid_iterations_are_evaluate_steps_of_a_constant_eval_batch(tmp_path, evaluation):
    config = _evaluation_config(tmp_path, evaluation)
    t = evaluation["training"]
    step = t["micro_batch_size"] * t["data_parallel_size"]
    steps = evaluation["microbatches_per_eval_step"]
    assert load_config(str(config)).samples["valid"] == evaluation["consumed_valid_samples_after_each_evaluation"][-1]
    for k, expected in enumerate(steps, start=1):
        result = which(str(config), k, split="valid")
        assert result["consumed_samples"] == [expected[0] * step, (expected[-1] + 1) * step]
        for r in result["ranks"]:
            assert [b["stream_index"] for b in r["microbatches"]] == expected
    last = mmfs("which", config, "--split", "valid", "--iteration", len(steps), "--json")  # the last step is served
    assert last.returncode == 0, last.stderr
    past = mmfs("which", config, "--split", "valid", "--iteration", len(steps) + 1)
    assert past.returncode == 2 and "past the end of the valid split" in past.stderr
    test = which(str(config), evaluation["eval_iters"], split="test")
    assert test["consumed_samples"][1] == evaluation["consumed_valid_samples_after_each_evaluation"][0]


def test_which_consumed_between_iteration_starts_reads_what_a_resumed_job_reads(tmp_path):
    case = next(c for c in CASES if c.get("step_batch_size_schedule") == "0:8 2560:16 5632:32")
    config = _config(tmp_path, _training(case))
    golden = json.loads((PUBLIC / "p2_blend2_u16" / "ranks-single_dp4_mb2.json").read_text())["ranks"]["train"]
    assert 48 not in case["consumed_before_iteration"]
    result = json.loads(mmfs("which", config, "--consumed", 48, "--json").stdout)
    size = case["resumed_batch_size"][48 // 8]
    assert result["iteration"] is None and result["consumed_samples"] == [48, 48 + size] and size == 32
    for r in result["ranks"]:
        assert [[s["sample"] for s in b["samples"]] for b in r["microbatches"]] == \
            golden[str(r["rank"])][48 // 8:(48 + size) // 8]
