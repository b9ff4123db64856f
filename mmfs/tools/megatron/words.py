"""The words of a Megatron-LM launch line as `mmfs config --from-megatron` takes
them: @FILE expanded (shell quoting and comments, no shell expansion), the entry
script named at most once, and every flag one that Megatron's parser knows.

Megatron-LM's parse_args is argparse with allow_abbrev=False: a flag it does not
know stops the job ("unrecognized arguments"), so a misspelt --splt is refused here
too rather than read as nothing. The flags it knows are recorded from its own
parser (megatron_options.json, tests/reference/record_megatron_options.py).
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from functools import lru_cache
from pathlib import Path

from mmfs.config.blend import MAX_ARGS_FILE
from mmfs.errors import MmfsError
from mmfs.storage import StorageError
from mmfs.storage.file import read_text_file

# The entry script the launch line is given to, and the defaults it passes to
# parse_and_validate_args (pretrain_gpt.py's __main__, Megatron-LM core_v0.19.0 and main).
ENTRY_SCRIPT = "pretrain_gpt.py"
ENTRY_DEFAULTS = {"--tokenizer-type": "GPT2BPETokenizer"}
# torchrun's flags and mmfs's own --world-size: taken for the data-parallel size, but
# Megatron's parser refuses them (they go before pretrain_gpt.py, to torchrun).
LAUNCHER_FLAGS = ("--world-size", "--nproc_per_node", "--nproc-per-node", "--nnodes")
# What a shell would expand and mmfs does not: $VAR, ${VAR}, ${A[@]}, $(cmd), `cmd`.
SHELL_SYNTAX = re.compile(r"\$[A-Za-z_{(@*#0-9]|`")


class MegatronArgsError(MmfsError):
    """A Megatron argument mmfs cannot honour, or one Megatron itself refuses."""


@lru_cache(maxsize=1)
def megatron_options() -> dict[str, int | str | None]:
    """{option: its argparse nargs} of Megatron-LM's parser."""
    data = json.loads((Path(__file__).parent / "megatron_options.json").read_text())
    return data["options"]


def expand_args(argv: list[str]) -> list[str]:
    """The arguments with every @FILE replaced by the words of its lines."""
    out: list[str] = []
    for arg in argv:
        if not arg.startswith("@") or len(arg) == 1:
            out.append(arg)
            continue
        path = arg[1:]
        try:
            text = read_text_file(path, MAX_ARGS_FILE, "arguments file")
        except StorageError as exc:
            raise MegatronArgsError(f"{exc}: give a launch script's arguments as a text file") from None
        try:
            words = split_words(text)
        except ValueError as exc:
            raise MegatronArgsError(f"{path}: {exc} (shell quoting as in a launch script)") from None
        for word in words:
            if SHELL_SYNTAX.search(word):
                raise MegatronArgsError(f"{path}: {word!r} is shell syntax that mmfs does not expand (variables, "
                                        "$(...), `...`); write the values themselves, e.g. the words the script's "
                                        "echo prints for its launch line")
        out.extend(words)
    return out


def split_words(text: str) -> list[str]:
    """The words of a launch script's lines, as a POSIX shell splits them."""
    text = text.replace("\\\n", " ")
    if not any(c in text for c in "'\"\\#"):  # nothing to unquote: shlex's words, 70 times faster
        return re.findall(r"[^ \t\r\n]+", text)
    return shlex.split(text, comments=True)


def check_words(argv: list[str], extra: tuple[str, ...] = ()) -> None:
    """One line, as Megatron's parser, for a flag it does not know (with the nearest it
    knows), a word that no flag takes (argparse's "unrecognized arguments"), or an entry
    script other than pretrain_gpt.py. Words before the entry script are the
    launcher's (torchrun's): not Megatron's, not checked."""
    scripts = [i for i, w in enumerate(argv) if w.endswith(".py") and not w.startswith("-")]
    for i in scripts:
        if Path(argv[i]).name != ENTRY_SCRIPT:
            raise MegatronArgsError(f"{argv[i]}: mmfs reads launch lines of {ENTRY_SCRIPT} (its GPTDataset and "
                                    "defaults); other entry scripts are not supported")
    known = megatron_options()
    i = scripts[0] + 1 if scripts else 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("--"):
            if Path(word).name == ENTRY_SCRIPT:
                continue
            raise MegatronArgsError(f"{word}: unrecognized argument: no flag takes it (Megatron-LM's parser refuses "
                                    "it; a value that holds spaces is one word: quote it)")
        flag, eq, _ = word.partition("=")
        if flag in known:
            i = _taken(argv, i, known[flag], bool(eq))
        elif flag in LAUNCHER_FLAGS or flag in extra:
            i = _taken(argv, i, "*", bool(eq))  # not Megatron's (main's, or the launcher's): its words pass
        else:
            near = difflib.get_close_matches(flag, sorted(known), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise MegatronArgsError(f"{flag}: unrecognized argument: Megatron-LM's parser refuses it{hint}")


def _taken(argv: list[str], i: int, nargs: int | str | None, inline: bool) -> int:
    """Where the words a flag at argv[i - 1] takes end, as argparse takes them."""
    if inline:
        return i
    free = len(argv)
    for j in range(i, len(argv)):
        if argv[j].startswith("--"):
            free = j
            break
    if nargs is None or nargs == "?":
        return min(i + 1, free)
    if nargs in ("*", "+"):
        return free
    return min(i + int(nargs), free)
