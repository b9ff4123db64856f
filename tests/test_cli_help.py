"""`mmfs SUBCOMMAND --help` says what the command does and what each option is; the
README's command table lists every subcommand."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmfs.cli import COMMANDS, build_parser

README = Path(__file__).resolve().parent.parent / "README.md"


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_has_a_parser_and_a_function():
    assert set(subparsers()) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_starts_with_a_sentence_of_what_the_command_does(command):
    out = subprocess.run([sys.executable, "-m", "mmfs.cli", command, "--help"], capture_output=True,
                         text=True, check=True).stdout
    description = out.split("\n\n")[1]  # after the usage lines
    assert re.match(r"[A-Z`]", description), description
    assert re.search(r"[.?)]\s", description + " "), description
    assert not description.startswith(("positional arguments", "options")), out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_and_argument_has_a_help_text(command):
    parser = subparsers()[command]
    missing = [a.option_strings or a.dest for a in parser._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert missing == []


def test_mount_help_names_the_options_it_takes():
    from mmfs.mount.options import OPTION_HELP

    text = subparsers()["mount"].format_help()
    flat = " ".join(text.split())
    for name in OPTION_HELP:
        assert name in flat


def test_the_readme_table_lists_every_command():
    listed = set(re.findall(r"^\| `mmfs ([a-z-]+)", README.read_text(), flags=re.M))
    assert listed == set(COMMANDS)
