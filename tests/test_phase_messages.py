"""The phases' messages, as a new user meets them: a mistake in the first phase names
`phases[0].…` (its data are also the run's valid and test), and one dataset written two
ways is one dataset."""

from __future__ import annotations

import pytest
from phase_helpers import DATA, TWO_PHASES, ds, write

from mmfs.errors import ConfigError
from mmfs.megatron.corpus import open_corpus


def first_phase(*datasets) -> list[dict]:
    return [{"datasets": list(datasets)}, TWO_PHASES[1]]


@pytest.mark.parametrize("phases, key, fragment", [
    (first_phase({"path": str(DATA / "u16_docs"), "weigth": 0.7}, ds("u16_multiseq", 0.3)),
     "phases[0].datasets[0].weigth", "unknown key"),
    (first_phase(ds("u16_docs", 0.7), ds("u16_multiseq", -0.2)), "phases[0].datasets[1].weight", "-0.2"),
    (first_phase({**ds("u16_docs", 0.7), "name": "a"}, {**ds("u16_multiseq", 0.3), "name": "a"}),
     "phases[0].datasets", "two datasets are named 'a'"),
    (first_phase(ds("nope", 1.0)), "phases[0].datasets[0].path", ""),
])
def test_a_mistake_in_the_first_phase_names_phases_0(tmp_path, phases, key, fragment):
    with pytest.raises(ConfigError) as err:
        open_corpus(write(tmp_path, phases=phases), progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.split(": ")[1] == key, message
    assert fragment in message, message


@pytest.mark.parametrize("mode", ["continue", "restart"])
def test_one_dataset_written_two_ways_is_one_dataset(tmp_path, mode):
    (tmp_path / "link").symlink_to(DATA, target_is_directory=True)
    ways = [str(DATA / "u16_docs"), f"{DATA}/./u16_docs", str(tmp_path / "link" / "u16_docs"),
            f"{DATA}/../data/u16_docs"]
    phases = [{"datasets": [{"path": ways[0], "weight": 0.7}, ds("u16_multiseq", 0.3)]}]
    for k, way in enumerate(ways[1:], start=1):
        phases.append({"start_iteration": 6 * k, "datasets": [{"path": way, "weight": 0.5},
                                                               ds("u16_multiseq", 0.5)]})
    corpus = open_corpus(write(tmp_path, phases=phases, phase_mode=mode), progress=False)
    assert sorted(d.name for d in corpus.datasets) == ["u16_docs", "u16_multiseq"]
    written = {d.path for p in corpus.config.phases.phases for d in p.blend.datasets if "docs" in d.path}
    assert written == set(ways)  # each phase keeps the path as written: Megatron hashes it
