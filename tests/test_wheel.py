"""mmfs as a user installs it: the wheel (`pip wheel .`, the C core compiled into it),
installed into a fresh virtual environment (not editable, nothing of this checkout on
the path). Its modules are exactly the tree's (a package folder missing from the wheel
fails here, not on a training node), each imports there (optional extras aside, each
named), the Megatron provider imports with numpy alone, and the README's tour runs
against the installed `mmfs` command, mounting for real."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from source_copy import copy_source

from mount_fixtures import HANG_GUARD, ROOT, force_unmount

# What an optional extra brings (pyproject's optional-dependencies): a module that
# imports one of these at its top may fail to import without it, and only so.
EXTRAS = {
    "torch": "torch",  # mmfs.adapters.torch
    "grain": "grain",  # mmfs.adapters.grain
    "boto3": "s3", "botocore": "s3", "pycurl": "s3",  # s3:// datasets
    "multistorageclient": "msc",  # msc:// datasets
    "tokenizers": "text", "sentencepiece": "sentencepiece", "tiktoken": "tiktoken",
    "zstandard": "preprocess", "pyarrow": "parquet",
}


def readme_sh_blocks() -> str:
    """README.md's fenced `sh` blocks, one script (as tests/test_docs.py runs them)."""
    return "\n".join(re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S))


def tree_modules() -> set[str]:
    """Every module of the checkout's mmfs/, and the compiled C core."""
    names = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "mmfs").rglob("*.py")}
    return {n.removesuffix(".__init__") for n in names} | {"mmfs._native"}


def _clean_env() -> dict:
    """The environment without this checkout on the path (nor this virtual environment)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _venv_python(venv: Path, code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code, *args], capture_output=True, text=True,
                          cwd=cwd, env=_clean_env(), timeout=HANG_GUARD)


def _build_and_install(top: Path) -> None:
    """`pip wheel` of a copy of the source into top/dist, and a plain install of it
    into the fresh virtual environment top/venv."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.fail("building the wheel needs a C compiler (cc); install gcc")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(top / "dist"), str(copy_source(top / "src"))], capture_output=True, text=True,
                           cwd=top, env=_clean_env(), timeout=HANG_GUARD)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel, = (top / "dist").glob("mmfs-*.whl")
    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=HANG_GUARD)
    # pip of this Python, run for the new environment (its own copy would be a download)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          str(wheel)], capture_output=True, text=True, cwd=top, env=_clean_env(),
                         timeout=HANG_GUARD)
    assert pip.returncode == 0, pip.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, the installed mmfs's files, a folder) after `pip wheel .` and a plain
    install of the wheel: built once per run, also when the module's tests are spread
    over pytest-xdist's workers (the first builds under a lock in the folder they share,
    the others take what it made)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    top = shared / "wheel"
    with open(shared / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (top / "installed").exists():
            shutil.rmtree(top, ignore_errors=True)
            top.mkdir()
            _build_and_install(top)
            (top / "installed").touch()
    venv = top / "venv"
    listed = _venv_python(venv, "import importlib.metadata as m, json; "
                          "print(json.dumps([str(f) for f in m.files('mmfs')]))", top)
    assert listed.returncode == 0, listed.stderr
    return venv, set(json.loads(listed.stdout)), top


def test_the_wheel_holds_exactly_the_trees_modules_the_c_core_and_the_report_scripts(installed):
    _, files, _ = installed
    modules = set()
    for f in files:
        path = Path(f)
        if path.parts[0] != "mmfs":
            continue
        if path.suffix == ".py":
            modules.add(".".join(path.with_suffix("").parts).removesuffix(".__init__"))
        elif path.suffix == ".so":
            modules.add(".".join(path.parts[:-1] + (path.name.split(".")[0],)))
    assert modules == tree_modules(), (sorted(modules - tree_modules()), sorted(tree_modules() - modules))
    assert {"mmfs/tools/report/charts.js", "mmfs/tools/report/page.js"} <= files
    assert any(f.startswith("mmfs/_native.") and f.endswith(".so") for f in files)
    assert not any(f.startswith(("tests/", "benchmarks/", "native/")) for f in files)


IMPORT_ALL = """
import importlib, json, sys
done, skipped, failed = [], {}, {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        done.append(name)
    except ModuleNotFoundError as exc:
        (skipped if (exc.name or "").split(".")[0] in EXTRAS else failed)[name] = exc.name or str(exc)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
import mmfs
print(json.dumps({"done": done, "skipped": skipped, "failed": failed, "from": mmfs.__file__}))
"""


def test_every_module_imports_from_the_installed_wheel(installed):
    venv, _, top = installed
    names = sorted(tree_modules())
    proc = _venv_python(venv, f"EXTRAS = {sorted(EXTRAS)!r}\n{IMPORT_ALL}", top, *names)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["from"].startswith(str(venv)), got["from"]  # the wheel's, not this checkout's
    assert got["failed"] == {}, got["failed"]
    # Each module left out names the extra it needs (torch, grain, ...) and nothing else.
    for name, missing in got["skipped"].items():
        assert missing.split(".")[0] in EXTRAS, (name, missing)
    assert len(got["done"]) + len(got["skipped"]) == len(names)
    assert {"mmfs.loader", "mmfs.adapters.megatron", "mmfs.adapters.megatron_copy", "mmfs.cli",
            "mmfs.mount.fuse", "mmfs._native"} <= set(got["done"])


def test_the_provider_imports_with_numpy_alone(installed):
    """Importing mmfs.adapters.megatron (what a Megatron job imports) loads no
    installed package but numpy: not cffi, PyYAML, the FUSE binding, torch."""
    venv, _, top = installed
    code = ("import sys, sysconfig, json, mmfs.adapters.megatron\n"
            "site = sysconfig.get_paths()['purelib']\n"
            "print(json.dumps(sorted({n.split('.')[0] for n, m in list(sys.modules.items())"
            " if (getattr(m, '__file__', None) or '').startswith(site)})))")
    proc = _venv_python(venv, code, top)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(json.loads(proc.stdout)) <= {"numpy", "mmfs"}, proc.stdout


def test_the_readme_tour_runs_against_the_installed_command(installed, tmp_path):
    """README.md's sh blocks (mount, look, unmount; the training stream; preprocess),
    run by the `mmfs` of the virtual environment on the demo corpus it builds."""
    venv, _, _ = installed
    work = tmp_path / "tour-work"
    work.mkdir()
    made = _venv_python(venv, "from pathlib import Path; from mmfs.tools.demo import build_data, config_text; "
                        "build_data(Path('demo-data')); Path('configs').mkdir(); Path('configs/demo.yaml')"
                        ".write_text(config_text(Path('configs/demo.yaml'), Path('demo-data')))", work)
    assert made.returncode == 0, made.stderr[-3000:]
    script = readme_sh_blocks()
    assert "mmfs mount configs/demo.yaml mnt" in script and "mmfs umount mnt" in script
    env = _clean_env()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    assert shutil.which("mmfs", path=env["PATH"]) == str(venv / "bin" / "mmfs")
    try:
        run = subprocess.run(["bash", "-eu", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                             timeout=HANG_GUARD)
    finally:
        force_unmount(work / "mnt")
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "mmfs: mounted configs/demo.yaml" in run.stdout and "mmfs: unmounted" in run.stdout
    assert not os.path.ismount(work / "mnt")
