"""`mmfs config --from-megatron` and every Megatron-LM flag that touches the data
(issue 31 item 4): the flags after which no view would show what Megatron reads are
one line and exit 2; those after which some views do not show what a rank trains on
are written with a comment and one warning line each; those that change only a
batch's fields are named in a comment; the rest change nothing and pass silently.
Every flag of Megatron-LM's data group, SFT group and training and validation configs
(core_v0.19.0 and main, tests/reference/megatron_data_flags.json) is one of these."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from golden_cases import GOLDEN
from mmfs import cli
from mmfs.config.schema import load_config
from mmfs.tools.megatron.flags import HONOURED, NOTED, REFUSED, SILENT, WARNED, warned_line
from mmfs.tools.megatron.phase_args import TRANSITIONS

HERE = Path(__file__).resolve().parent
RECORDED = json.loads((HERE / "reference" / "megatron_data_flags.json").read_text())
LINE = ["--data-path", "data/u16_docs", "--split", "90,8,2", "--seq-length", "8", "--tokenizer-type",
        "NullTokenizer", "--vocab-size", "9", "--micro-batch-size", "1", "--world-size", "2",
        "--train-iters", "10", "--eval-interval", "5", "--eval-iters", "1"]
# a value for the flags that take one (the others are switches)
VALUES = {"--sequence-packing-scheduler": ["dp_balanced"], "--iterations-to-skip": ["3", "5"],
          "--exit-interval": ["7"], "--fim-rate": ["0.5"], "--decoder-seq-length": ["8"],
          "--validation-set-names": ["a", "b"], "--sft-tokenizer-prompt-format": ["nemotron-h-aligned"],
          "--per-dataset-sequences-path": ["seqs.json"], "--eval-global-batch-size": ["4"],
          "--eval-micro-batch-size": ["1"], "--start-eval-at-iter": ["2"], "--tokenizer-metadata": ["m.json"]}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path


def config(*argv: str) -> tuple[int, str, str]:
    """`mmfs config --from-megatron ARGV`, in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["config", "--from-megatron", *argv])
    return code, out.getvalue(), err.getvalue()


def test_every_data_flag_of_megatron_lm_is_accounted_for():
    """Each flag of the recorded groups, in both versions, is read, noted, refused, warned
    or silent (with why): none passes unexamined."""
    known = set(HONOURED) | set(NOTED) | set(REFUSED) | set(WARNED) | set(SILENT) | {TRANSITIONS}
    for version, groups in RECORDED["versions"].items():
        for group, flags in groups.items():
            assert not set(flags) - known, (version, group, sorted(set(flags) - known))
    for table in (NOTED, REFUSED, WARNED, SILENT):  # one answer per flag
        assert not set(table) & (set(HONOURED) | {t for other in (NOTED, REFUSED, WARNED, SILENT)
                                                  if other is not table for t in other})


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_a_flag_after_which_no_view_shows_what_megatron_reads_is_one_line(folder, flag):
    code, out, err = config(*LINE, flag, *VALUES.get(flag, []))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"mmfs: error: {flag}: mmfs cannot serve it ("), err


@pytest.mark.parametrize("flag", sorted(WARNED))
def test_a_flag_after_which_ranks_do_not_show_what_a_rank_trains_on_is_a_warning(folder, flag):
    code, out, err = config(*LINE, flag, *VALUES.get(flag, []))
    assert code == 0, err
    line = warned_line(flag)
    assert err == f"mmfs: warning: {line}\n"
    assert f"# {line}\n" in out
    (folder / "c.yaml").write_text(out)
    assert load_config(str(folder / "c.yaml")).training.data_parallel_size == 2  # the config is still right


def test_an_external_data_loader_is_the_mount_itself_and_refused(folder):
    """A line with --dataloader-type external already reads a mount: the sampler it replaced
    decides what the views show, so the line to give is that one."""
    code, out, err = config(*LINE, "--dataloader-type", "external")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--dataloader-type: external is how a job reads the mount" in err


@pytest.mark.parametrize("flag", sorted(NOTED))
def test_a_flag_of_a_batch_field_or_of_loading_is_named_in_a_comment(folder, flag):
    code, out, err = config(*LINE, flag)
    assert (code, err) == (0, "")
    assert f"# ignored {flag}: {NOTED[flag]}" in out


def test_flags_that_change_nothing_about_the_data_pass_silently(folder):
    """The silent flags (and a model flag) give the very config the launch line gives alone."""
    _, plain, _ = config(*LINE)
    for flag in [*sorted(SILENT), "--lr", "--fp16"]:
        code, out, err = config(*LINE, flag, *VALUES.get(flag, []))
        assert (code, err, out) == (0, "", plain), flag


def test_the_encoder_sequence_length_is_the_sequence_length(folder):
    line = [w for w in LINE if w != "--seq-length" and w != "8"] + ["--encoder-seq-length", "8"]
    code, out, err = config(*line)
    assert (code, err) == (0, "") and yaml.safe_load(out)["sequence_length"] == 8
    code, _, err = config(*LINE, "--encoder-seq-length", "8")
    assert code == 2 and "--encoder-seq-length: give it or --seq-length, not both" in err


def test_a_warning_of_any_launch_of_a_run_in_phases_is_said(folder):
    common = [*LINE[2:], "--train-samples", "80", "--phase-transition-iterations", "5"]
    common = [w for w in common if w not in ("--train-iters", "10")]
    code, out, err = config("--data-path", "data/u16_docs", *common, "--hybrid-context-parallel", "--next-phase",
                            "--data-path", "data/u16_small", *common, "--hybrid-context-parallel")
    assert code == 0, err
    assert err == f"mmfs: warning: {warned_line('--hybrid-context-parallel')}\n"
    # in one launch only, the launches' training differs (hybrid_context_parallel): refused
    code, out, err = config("--data-path", "data/u16_docs", *common, "--next-phase",
                            "--data-path", "data/u16_small", *common, "--hybrid-context-parallel")
    assert code == 2 and "launch 1: its training is not launch 0's" in err


def test_docs_list_every_refused_warned_and_noted_flag():
    text = (HERE.parent / "docs" / "config.md").read_text()
    listed = {f for row in re.findall(r"^\| (`--.*?) \|", text, re.M) for f in re.findall(r"`(--[a-z0-9-]+)`", row)}
    assert set(REFUSED) | set(WARNED) | set(NOTED) | {"--dataloader-type"} <= listed
