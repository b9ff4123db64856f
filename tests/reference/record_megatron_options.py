"""Record every option string Megatron-LM's own parser takes into
mmfs/tools/megatron/megatron_options.json: `mmfs config --from-megatron` refuses a
flag that is not there, as Megatron's parse_args does (argparse with
allow_abbrev=False: "unrecognized arguments").

    python tests/reference/record_megatron_options.py

Needs the megatron-core 0.19.2 wheel (its megatron/training/arguments.py) and torch
2.13.0 (CPU). The parser is the one parse_args builds (add_megatron_arguments);
pretrain_gpt.py adds ModelOpt's flags only where nvidia-modelopt is installed (not
here). Each option is recorded with its argparse nargs, so that the words a launch
line holds beyond what its flags take are found as Megatron's parser finds them.
Deterministic: the options sorted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import typing
import warnings
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "mmfs" / "tools" / "megatron" / "megatron_options.json"


def provenance() -> dict:
    return {"megatron-core": metadata.version("megatron-core"), "torch": metadata.version("torch"),
            "python": platform.python_version(),
            "how": "argparse.ArgumentParser(allow_abbrev=False) through megatron.training.arguments."
                   "add_megatron_arguments, as parse_args builds it; every option string of its actions"}


def main() -> None:
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # Python 3.12's decorator, a no-op at run time
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        from megatron.training.arguments import add_megatron_arguments

        parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    # each option with the words it takes: argparse's nargs (None: one; "?", "*", "+", or a count)
    options = {o: action.nargs for action in parser._actions for o in action.option_strings if o.startswith("--")}
    OUT.write_text(json.dumps({"about": "every option of Megatron-LM's parse_args with its nargs "
                               "(record_megatron_options.py)", "provenance": provenance(),
                               "options": dict(sorted(options.items()))}, indent=0) + "\n")
    print(f"wrote {OUT}: {len(options)} options")


if __name__ == "__main__":
    main()
