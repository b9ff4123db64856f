"""The import graph of mmfs shows its layers: no circle, and no module imports
one of a higher layer (lazy imports inside functions count too)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mmfs"

# Lowest first; a module may import its own layer and the ones before it.
LAYERS = [
    ("mmfs", "mmfs._native", "mmfs.native", "mmfs.errors", "mmfs.processes"),
    ("mmfs.storage",),
    ("mmfs.formats",),
    ("mmfs.text",),  # tokenizers and the tokenizing pipeline (preprocess, text datasets)
    ("mmfs.config",),
    ("mmfs.megatron",),
    ("mmfs.mount", "mmfs.loader"),  # the loader reads what the mount serves
    ("mmfs.tools", "mmfs.adapters"),  # adapters: optional trainer interfaces over the loader
    ("mmfs.cli", "mmfs.__main__"),
]
# The loader runs in training processes: numpy, the standard library, the mount
# contract (plus the error base class) and its own modules, nothing that needs the C core
# for a mount point. Given a config instead, it serves the mount's files in its own
# process (issue 40 item 6): that one module, imported lazily, only then, brings the C
# core (LAZY_FOR_A_CONFIG; test_the_loader_imports_the_c_core_only_for_a_config).
LOADER_MAY_IMPORT = {"mmfs", "mmfs.errors", "mmfs.mount", "mmfs.mount.contract"}
LAZY_FOR_A_CONFIG = {"mmfs.mount.inprocess"}
LOADER = PACKAGE / "loader"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The modules `path` imports (absolute names; `from a import b` counts a.b
    when that is a module of the package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports(p) if m in files} - {name} for name, p in files.items()}


def layer(module: str) -> int | None:
    return next((i for i, names in enumerate(LAYERS) for n in names
                 if module == n or (n != "mmfs" and module.startswith(n + "."))), None)


def test_every_module_has_a_layer():
    assert [m for m in graph() if m != "mmfs.loader" and layer(m) is None] == []


def test_no_module_imports_a_higher_layer():
    wrong = [f"{m} ({layer(m)}) imports {d} ({layer(d)})" for m, deps in graph().items() if m != "mmfs.loader"
             for d in deps if layer(d) > layer(m)]
    assert wrong == []


def test_no_import_circle():
    g, state, circles = graph(), {}, []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "open"
        for d in sorted(g[m]):
            if state.get(d) == "open":
                circles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_the_loader_and_the_contract_need_neither_c_nor_the_rest_of_mmfs():
    g = graph()
    own = {module_name(p) for p in LOADER.rglob("*.py")}
    assert "mmfs.loader" in own and len(own) > 1
    for module in own:
        assert g[module] <= LOADER_MAY_IMPORT | LAZY_FOR_A_CONFIG | own, module
    loader = set().union(*(imports(p) for p in LOADER.rglob("*.py")))
    assert {m.split(".")[0] for m in loader} <= {"mmfs", "numpy", *sys.stdlib_module_names}
    contract = imports(PACKAGE / "mount" / "contract.py")
    assert {m.split(".")[0] for m in contract} <= set(sys.stdlib_module_names)


def top_level_imports(path: Path) -> set[str]:
    """The modules `path` imports when it is imported (not inside a function)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_loader_imports_the_c_core_only_for_a_config():
    """The in-process backend is imported inside a function only (the one that opens a
    config): a mount point's reader stays numpy-only. Checked in a fresh interpreter too."""
    for path in LOADER.rglob("*.py"):
        assert not top_level_imports(path) & LAZY_FOR_A_CONFIG, path
    import subprocess

    code = ("import sys, mmfs.loader, mmfs.adapters.megatron; "
            "print(sorted(m for m in sys.modules if m in ('mmfs.native', 'mmfs._native', 'mmfs.mount.inprocess', "
            "'mmfs.megatron')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent)
    assert out.stdout.strip() == "[]"
