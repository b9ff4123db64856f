"""Record the launch flags of Megatron-LM that can touch the data into
megatron_data_flags.json beside this file: the data group of arguments.py
(_add_data_args), the SFT group, and the flags made from the TrainingConfig and
ValidationConfig dataclasses (the training loop's batch sizes, lengths and
evaluations), for each version given. tests/test_megatron_flags.py checks that
mmfs/tools/megatron/flags.py says what it does with every one of them.

    python tests/reference/record_megatron_flags.py core_v0.19.0=LM_ROOT main@COMMIT=LM_ROOT_MAIN

LM_ROOT: a Megatron-LM checkout (or `git archive` of one; the committed file: main at
d98e8a64dd, 2026-08-22). Plain Python: the files
are parsed, nothing of Megatron is imported. Deterministic.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "megatron_data_flags.json"
GROUPS = ("_add_data_args", "_add_sft_args")
CONFIGS = ("TrainingConfig", "ValidationConfig")


def group_flags(arguments: Path) -> dict[str, list[str]]:
    tree = ast.parse(arguments.read_text())
    out = {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in GROUPS:
            out[fn.name] = [a.value for n in ast.walk(fn) if isinstance(n, ast.Call)
                            and getattr(n.func, "attr", "") == "add_argument"
                            for a in n.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
    return out


def dataclass_flags(config: Path) -> dict[str, list[str]]:
    """The flags ArgumentGroupFactory makes of each field: --name (a bool field that defaults to
    True: --no-name), or the field's argparse_meta arg_names."""
    tree = ast.parse(config.read_text())
    out = {}
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name in CONFIGS):
            continue
        flags = []
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            text = ast.unparse(stmt.value) if stmt.value is not None else ""
            if "init=False" in text:
                continue
            names = [n.value for n in ast.walk(stmt.value) if isinstance(n, ast.Constant)
                     and str(n.value).startswith("--")] if stmt.value is not None else []
            name = stmt.target.id.replace("_", "-")
            if not names:
                names = [f"--no-{name}" if ast.unparse(stmt.annotation) == "bool" and text == "True" else f"--{name}"]
            flags += names
        out[cls.name] = flags
    return out


def main() -> None:
    versions = {}
    for arg in sys.argv[1:]:
        version, root = arg.split("=", 1)
        root = Path(root)
        versions[version] = {**group_flags(root / "megatron/training/arguments.py"),
                             **dataclass_flags(root / "megatron/training/config/training_config.py")}
    OUT.write_text(json.dumps({"about": "Megatron-LM's flags that can touch the data, by group "
                               "(record_megatron_flags.py)", "versions": versions}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
