"""`mmfs config --from-megatron` of a run in phases (issue 27 item 6): one launch
per phase with Megatron-LM's --phase-transition-iterations becomes a `phases:`
config with phase_mode restart, the run those launches train on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from golden_cases import GOLDEN
from mmfs.config.schema import load_config
from mmfs.megatron.corpus import open_corpus
from mount_fixtures import mmfs

COMMON = ("--split 90,8,2 --seq-length 32 --seed 1234 --data-cache-path cache --micro-batch-size 2 "
          "--global-batch-size 8 --train-samples 240 --eval-interval 10 --eval-iters 2 "
          "--tokenizer-type NullTokenizer --vocab-size 50257 --world-size 2 --lr 3e-4 "
          "--phase-transition-iterations 22,10")
DATA = ["--data-path 0.7 data/u16_docs 0.3 data/u16_multiseq",
        "--data-path 0.2 data/u16_docs 0.3 data/u16_multiseq 0.5 data/u16_small",
        "--data-path 1 data/u16_small 3 data/u16_docs"]


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    for k, data in enumerate(DATA):
        (tmp_path / f"phase{k}.args").write_text(f"# phase {k}\n{data}\n{COMMON}\n")
    return tmp_path


def _launches(*files: str) -> list[str]:
    out: list[str] = []
    for f in files:
        out += (["--next-phase"] if out else []) + [f"@{f}"]
    return out


def test_one_launch_per_phase_is_a_restart_config_of_the_same_run(tmp_path):
    folder = _folder(tmp_path)
    proc = mmfs("config", "--from-megatron", *_launches("phase0.args", "phase1.args", "phase2.args"), cwd=folder)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "# phase_mode: continue (mmfs's default) would go on in each dataset" in text
    (folder / "run.yaml").write_text(text)
    config = load_config(str(folder / "run.yaml"))
    assert config.phases.mode == "restart"
    assert [(p.start, p.start_iteration) for p in config.phases.phases] == [(0, 0), (80, 10), (176, 22)]
    assert [[(d.name, d.weight) for d in p.blend.datasets] for p in config.phases.phases] == [
        [("u16_docs", 0.7), ("u16_multiseq", 0.3)],
        [("u16_docs", 0.2), ("u16_multiseq", 0.3), ("u16_small", 0.5)],
        [("u16_small", 1.0), ("u16_docs", 3.0)]]
    assert config.samples["train"] == 240 and config.training.global_batch_size == 8
    # the same run written by hand: the same samples
    raw = yaml.safe_load(text)
    by_hand = {key: v for key, v in raw.items() if key not in ("phases",)}
    by_hand["phases"] = [
        {"datasets": [{"path": "data/u16_docs", "weight": 0.7}, {"path": "data/u16_multiseq", "weight": 0.3}]},
        {"start_samples": 80, "datasets": [{"path": "data/u16_docs", "weight": 0.2},
                                           {"path": "data/u16_multiseq", "weight": 0.3},
                                           {"path": "data/u16_small", "weight": 0.5}]},
        {"start_iteration": 22, "datasets": [{"path": "data/u16_small", "weight": 1},
                                             {"path": "data/u16_docs", "weight": 3}]}]
    (folder / "by_hand.yaml").write_text(yaml.safe_dump(by_hand))
    a = open_corpus(str(folder / "run.yaml"), progress=False).splits["train"]
    b = open_corpus(str(folder / "by_hand.yaml"), progress=False).splits["train"]
    assert [a.read(i) for i in range(0, 240, 7)] == [b.read(i) for i in range(0, 240, 7)]
    # a launch line per phase, inline, gives the same config
    inline = []
    for k, data in enumerate(DATA):
        inline += (["--next-phase"] if k else []) + f"{data} {COMMON}".split()
    again = mmfs("config", "--from-megatron", *inline, cwd=folder)
    assert again.returncode == 0 and again.stdout == text, again.stderr


@pytest.mark.parametrize("edit, words", [
    (lambda files: files[:2], "3 phases, but 2 launch(es)"),
    (lambda files: [*files, "phase2.args"], "3 phases, but 4 launch(es)"),
    (lambda files: ["seq64.args", *files[1:]], "launch 1: its sequence_length is not launch 0's"),
    (lambda files: [files[0], "other_its.args", files[2]], "is not launch 0's 10,22"),
    (lambda files: [files[0], "no_its.args", files[2]], "launch 1: --phase-transition-iterations missing"),
    (lambda files: ["iters.args", "iters.args", "iters.args"], "give --train-samples, not --train-iters"),
    (lambda files: ["step.args", "step.args", "step.args"], "needs a fixed global batch size"),
    (lambda files: [files[0], "unweighted.args", files[2]], "give each dataset a weight"),
    (lambda files: [files[0], "per_split.args", files[2]], "per-split paths cannot be phased"),
    # a FIFO hung, a non-UTF-8 file was a traceback-free but cut read of 16 MiB: the shared sized-file check
    (lambda files: [files[0], "fifo.args", files[2]], "pipe: is a FIFO (named pipe), not a regular file "
                                                      "(launch 1's --data-args-path)"),
    (lambda files: [files[0], "latin1.args", files[2]], "not UTF-8 text (byte 0)"),
    # printed a config mmfs build refuses (a phase at or past the end; a weight that is not above 0)
    (lambda files: ["end0.args", "end1.args", "end2.args"], "iteration 30 starts at sample 240, at or past "
                                                            "--train-samples 240"),
    (lambda files: [files[0], "nan.args", files[2]], "--data-path: the weight nan of data/u16_docs is not a "
                                                     "positive number"),
])
def test_mistakes_are_one_line(tmp_path, edit, words):
    folder = _folder(tmp_path)
    common = COMMON
    variants = {
        "seq64.args": f"{DATA[0]}\n{common.replace('--seq-length 32', '--seq-length 64')}",
        "other_its.args": f"{DATA[1]}\n{common.replace('22,10', '10,20')}",
        "no_its.args": f"{DATA[1]}\n{common.replace('--phase-transition-iterations 22,10', '')}",
        "iters.args": f"{DATA[0]}\n{common.replace('--train-samples 240', '--train-iters 30')}",
        "step.args": f"{DATA[0]}\n{common.replace('--global-batch-size 8', '--step-batch-size-schedule 0:8')}",
        "unweighted.args": f"--data-path data/u16_docs data/u16_small\n{common}",
        "per_split.args": f"--train-data-path 1 data/u16_docs\n{common}",
        "fifo.args": f"--data-args-path pipe\n{common}",
        "latin1.args": f"--data-args-path latin1.txt\n{common}",
        "nan.args": f"--data-path nan data/u16_docs 1 data/u16_small\n{common}",
        **{f"end{k}.args": f"{data}\n{common.replace('22,10', '10,30')}" for k, data in enumerate(DATA)},
    }
    os.mkfifo(folder / "pipe")
    (folder / "latin1.txt").write_bytes(b"\xe91 data/u16_docs")
    for name, text in variants.items():
        (folder / name).write_text(text + "\n")
    files = edit(["phase0.args", "phase1.args", "phase2.args"])
    proc = mmfs("config", "--from-megatron", *_launches(*files), cwd=folder)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr


def test_the_transitions_in_one_launch_ask_for_the_others(tmp_path):
    folder = _folder(tmp_path)
    proc = mmfs("config", "--from-megatron", "@phase0.args", cwd=folder)
    assert proc.returncode == 2 and "3 phases, but 1 launch(es); give one per phase, separated by --next-phase" \
        in proc.stderr, proc.stderr
    assert not os.path.exists(folder / "cache")
