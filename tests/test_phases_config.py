"""The `phases:` list of a config: mistakes are one line naming the key; the
forms a phase may take."""

from __future__ import annotations

import pytest
from phase_helpers import (
    DATA,
    TRAINING,
    TWO_PHASES,
    ds,
    write,
)

from mmfs.errors import ConfigError
from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phases.plan import megatron_weights

# -- mistakes ---------------------------------------------------------------------


@pytest.mark.parametrize("phases, extra, key, fragment", [
    ([TWO_PHASES[0], {**TWO_PHASES[1], "start_iteration": 0}], {}, "phases[1].start_iteration",
     "not after phases[0]"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "start_iteration": 10}, {**TWO_PHASES[1], "start_iteration": 5}], {},
     "phases[2].start_iteration", "not after phases[1]"),
    ([TWO_PHASES[0], {"start_samples": 84, "datasets": TWO_PHASES[1]["datasets"]}], {},
     "phases[1].start_samples", "falls inside iteration 11"),
    ([TWO_PHASES[0], {"start_tokens": 84 * 32, "datasets": TWO_PHASES[1]["datasets"]}], {},
     "phases[1].start_tokens", "a phase starts where a global batch starts"),
    ([TWO_PHASES[0], {"start_tokens": 80 * 32 + 1, "datasets": TWO_PHASES[1]["datasets"]}], {},
     "phases[1].start_tokens", "inside sample 80"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [ds("u16_docs", 0), ds("u16_small", 0)]}], {},
     "phases[1].datasets[0].weight", "positive"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [ds("nope", 1.0)]}], {},
     "phases[1].datasets[0].path", ""),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "sequence_length": 64}], {}, "phases[1].sequence_length",
     "cannot change sequence_length"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "split": "1,0,0"}], {}, "phases[1].split", "cannot change split"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "tokenizer": {"eod": 1}}], {}, "phases[1].tokenizer", "cannot change"),
    ([TWO_PHASES[0], {"datasets": TWO_PHASES[1]["datasets"]}], {}, "phases[1].start_iteration", "missing"),
    ([{**TWO_PHASES[0], "start_iteration": 3}], {}, "phases[0].start_iteration", "starts at 0"),
    ("web", {}, "phases", "a non-empty list of phases"),  # these three named `datasets`, a key never meant
    ([], {}, "phases", "a non-empty list of phases"),
    ([{"start_iteration": 0}, TWO_PHASES[1]], {}, "phases[0].datasets", "missing"),
    (["web", TWO_PHASES[1]], {}, "phases[0]", "expected a mapping"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "start_iteration": 30}], {}, "phases[1].start_iteration",
     "past the end of training"),
    (TWO_PHASES, {"phase_mode": "later"}, "phase_mode", "not a phase mode"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [ds("u16_docs", 1.0), ds("u16_small", 1.0),
                                                          ds("u16_docs", 2.0)]}], {},
     "phases[1].datasets[2].path", "a second time"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [{"path": str(DATA / "u16_docs")},
                                                          {"path": str(DATA / "u16_small")}]}], {},
     "phases[1].datasets[0].weight", "missing"),
])
def test_mistakes_are_one_line_naming_the_key(tmp_path, phases, extra, key, fragment):
    with pytest.raises(ConfigError) as err:
        open_corpus(write(tmp_path, phases=phases, **extra), progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.split(": ")[1] == key, message
    assert fragment in message, message


def test_restart_needs_a_fixed_batch_size(tmp_path):
    training = {**TRAINING, "global_batch_size": 16, "rampup_batch_size": [4, 4, 64]}
    with pytest.raises(ConfigError, match=r": phase_mode: restart is Megatron's --phase-transition-iterations"):
        open_corpus(write(tmp_path, phases=TWO_PHASES, phase_mode="restart", training=training), progress=False)


def test_phases_with_blend_per_split_are_refused(tmp_path):
    per_split = {"train": TWO_PHASES[0]["datasets"], "valid": TWO_PHASES[0]["datasets"], "test": None}
    path = write(tmp_path, phases=TWO_PHASES, blend_per_split=per_split, split=None)
    with pytest.raises(ConfigError, match=r": phases: phases change the train blend"):
        open_corpus(path, progress=False)


def test_a_phase_in_megatrons_data_path_form_and_a_ramp_up(tmp_path):
    """`data_path` words in a phase, and boundaries counted through a batch-size ramp-up."""
    training = {**TRAINING, "global_batch_size": 16, "rampup_batch_size": [4, 4, 64]}
    words = f"0.2 {DATA / 'u16_docs'} 0.8 {DATA / 'u16_small'}"
    phases = [TWO_PHASES[0], {"start_iteration": 12, "data_path": words}]
    corpus = open_corpus(write(tmp_path, phases=phases, training=training), progress=False)
    schedule = corpus.config.training.schedule
    train = corpus.indices["train"]
    assert train.slices[1].start == schedule.consumed_before(13)
    assert [g.spec.name for g in train.gpts] == ["u16_docs", "u16_multiseq", "u16_small"]
    assert train.slices[1].weights == tuple(megatron_weights([0.2, 0.8]))


def test_no_phases_is_todays_config(tmp_path):
    path = write(tmp_path, datasets=TWO_PHASES[0]["datasets"])
    corpus = open_corpus(path, progress=False)
    assert type(corpus.indices["train"]).__name__ == "SplitIndices"
    assert corpus.config.phases is None and "phases" not in corpus.config.as_dict()
