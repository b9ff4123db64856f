"""resume-check in the last restart phase when that phase's dataset is far longer than
the phase (issue 42 item 3): a bare prefix, whose GPTDataset megatron-core builds to a
whole epoch (212 samples for a phase of 40). Megatron's jobs stop at train_iters, so
what they read after it counts for nothing: the counts are those recorded from
Megatron's own relaunches (tests/reference/record_matrix_long_phase.py)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

import matrix_cases as mc
from matrix_mounts import write_data
from mmfs import cli

HERE = Path(__file__).resolve().parent
RECORDED = json.loads((HERE / "reference" / "matrix_long_phase.json").read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("long-phase")
    write_data(folder / "data")
    return folder


def _config(data: Path, sampler: str) -> Path:
    def datasets(blend) -> list[dict]:
        if isinstance(blend, str):
            return [{"path": str(data / "data" / blend), "name": blend}]
        return [{"path": str(data / "data" / n), "name": n, "weight": w} for n, w in blend.items()]

    phases, starts = RECORDED["phases"], RECORDED["phase_starts"]
    config = {"split": mc.SPLIT, "sequence_length": mc.SEQUENCE_LENGTH, "seed": mc.SEED,
              "cache_dir": str(data / "cache"), "tokenizer": {"eod": mc.EOD, "pad": None},
              "training": mc.training(sampler, "constant"), "phase_mode": "restart",
              "phases": [{"datasets": datasets(phases[0])},
                         *({"start_iteration": s, "datasets": datasets(b)} for s, b in zip(starts, phases[1:]))]}
    path = data / f"{sampler}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_the_recording_says_where_it_came_from():
    p = RECORDED["provenance"]
    assert p["megatron-core"] == "0.19.2" and "core_v0.19.0" in p["megatron_lm"]
    for cell in RECORDED["cells"].values():  # the last phase's dataset far longer than its 40 samples
        assert cell["phase_train_dataset_samples"][-1] > 5 * 40


@pytest.mark.parametrize("sampler", sorted(mc.SAMPLERS))
def test_resume_check_in_a_long_last_phase_counts_as_megatron_s_jobs(data, sampler):
    config = _config(data, sampler)
    cell = RECORDED["cells"][f"{sampler}/restart/constant"]
    for key, want in cell["resumed"].items():
        layout, at = key.rsplit(",from=", 1)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["resume-check", str(config), "--consumed", at, "--to", layout, "--json"])
        answer = json.loads(out.getvalue())
        assert (answer["repeated"], answer["skipped"]) == (want["repeated"], want["skipped"]), key
        assert code == (0 if (want["repeated"], want["skipped"]) == (0, 0) else 1), key


def test_the_matrix_says_where_it_came_from():
    matrix = json.loads((HERE / "reference" / "matrix.json").read_text())
    p = matrix["provenance"]
    assert p["megatron-core"] == "0.19.2" and "5be9626709af" in p["megatron_lm"]["core_v0.19.0"]
    assert "parse_args and validate_args" in p["args"]["how"]
    made = p["args"]["cells"]  # per cell: through parse_args, or (the ramp-up) how else and why
    assert set(made) == set(matrix["cells"]) and "--rampup-batch-size" in p["args"]["rampup"]
    assert {made[c] for c in made if "/rampup" in c and "/restart/" not in c} == {"rampup"}
    assert {made[c] for c in made if "/constant" in c or "/step" in c and "/restart/" not in c} == {"parse_args"}
    long = json.loads((HERE / "reference" / "matrix_long_phase.json").read_text())["provenance"]
    assert long["args"] == p["args"]["how"]
