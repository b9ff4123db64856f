"""`mmfs config --from-megatron` reads a launch line as Megatron-LM's pretrain_gpt.py
does (issue 42 item 1): a flag Megatron's parser does not know is one line and exit
2, with the nearest it knows; the entry script's own defaults apply (pretrain_gpt.py:
tokenizer_type GPT2BPETokenizer); an @FILE holding shell syntax that mmfs does not
expand is one line; another entry script is refused."""

from __future__ import annotations

import json

import pytest
import yaml
from test_megatron_flags import LINE, config

from golden_cases import GOLDEN
from mmfs.tools.megatron.flags import HONOURED, NOTED, REFUSED, SILENT, WARNED
from mmfs.tools.megatron.words import LAUNCHER_FLAGS, megatron_options

TOKENIZERS = GOLDEN.parent / "golden" / "preprocess" / "tokenizers"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path


@pytest.mark.parametrize("flag,near", [("--splt", "--split"), ("--data-pth", "--data-path"),
                                       ("--seq-len", "--seq-length"), ("--zzzzqqqq", None)])
def test_an_unknown_flag_is_one_line_with_the_nearest(folder, flag, near):
    code, out, err = config(*LINE, flag, "98,1,1")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert f"{flag}: unrecognized argument: Megatron-LM's parser refuses it" in err
    assert (f"(did you mean {near}?)" in err) if near else "did you mean" not in err


def test_a_flag_with_its_value_after_an_equals_sign_is_checked_too(folder):
    code, _, err = config(*LINE, "--splt=98,1,1")
    assert code == 2 and "--splt: unrecognized argument" in err


def test_every_flag_mmfs_names_is_megatron_s_or_the_launcher_s():
    """The tables of flags.py hold no flag Megatron's parser (core 0.19.2) does not know,
    except Megatron-LM main's, which flags.py says are main's."""
    known = set(megatron_options())
    main_only = {"--use-varlen-dataset", "--sequence-packing-scheduler"}
    named = set(HONOURED) | set(NOTED) | set(REFUSED) | set(WARNED) | set(SILENT)
    assert named - known - set(LAUNCHER_FLAGS) <= main_only


def test_the_recorded_options_say_where_they_came_from():
    from mmfs.tools.megatron import words

    data = json.loads((words.Path(words.__file__).parent / "megatron_options.json").read_text())
    assert data["provenance"]["megatron-core"] == "0.19.2" and len(data["options"]) > 800


def test_pretrain_gpt_s_default_tokenizer_is_taken(folder):
    line = [w for w in LINE]
    i = line.index("--tokenizer-type")
    del line[i:i + 4]  # --tokenizer-type NullTokenizer --vocab-size 9
    code, out, err = config(*line, "--vocab-file", str(TOKENIZERS / "gpt2-vocab.json"),
                            "--merge-file", str(TOKENIZERS / "gpt2-merges.txt"))
    assert (code, err) == (0, ""), err
    block = yaml.safe_load(out)["tokenizer"]
    assert block["type"] == "GPT2BPETokenizer"
    assert "# --tokenizer-type GPT2BPETokenizer: pretrain_gpt.py's default (not on the line)" in out
    assert out.startswith("# mmfs config from Megatron-LM arguments of pretrain_gpt.py")


@pytest.mark.parametrize("text", ["--data-path $DATA_PATH", "--data-path ${DATA}", "${GPT_ARGS[@]}",
                                  "--seed $(date +%s)", "--seed `date`"])
def test_an_args_file_with_shell_syntax_is_one_line(folder, text):
    (folder / "launch.args").write_text(" ".join(LINE) + f"\n{text}\n")
    code, out, err = config("@launch.args")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "shell syntax that mmfs does not expand" in err and "launch.args" in err


def test_shell_syntax_in_a_comment_or_plain_dollar_is_fine(folder):
    (folder / "launch.args").write_text(" ".join(LINE) + "\n# --data-path $DATA_PATH\n")
    code, _, err = config("@launch.args")
    assert (code, err) == (0, "")


def test_the_entry_script_may_be_named_and_no_other(folder):
    code, _, err = config("pretrain_gpt.py", *LINE)
    assert (code, err) == (0, "")
    code, _, err = config("path/to/pretrain_mamba.py", *LINE)
    assert code == 2 and "path/to/pretrain_mamba.py: mmfs reads launch lines of pretrain_gpt.py" in err
