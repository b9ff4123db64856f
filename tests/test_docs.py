"""The documentation stays true: README.md is short and links every page of docs/,
the fenced `sh` blocks of each page run (in order, in one shell, from a folder that
holds the demo corpus and its config, as after `make demo`) and leave nothing there
that git would show, and every `mmfs` command shown in any other block is one the
command line accepts."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mmfs.cli import build_parser
from mmfs.tools.demo import build_data, config_text
from mount_fixtures import ROOT, force_unmount

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.M | re.S)
SHELLS = {"sh", "", "shell", "bash", "console", "text"}


def blocks(page: Path) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block of a page."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text())]


def commands(body: str) -> list[str]:
    """The command lines of a shell block: comments dropped, continuations joined."""
    text = re.sub(r"\\\n\s*", " ", body)
    lines = (re.sub(r"(^|\s)#.*$", "", line).strip() for line in text.splitlines())
    return [line for line in lines if line]


def test_readme_is_short_and_links_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), f"README.md links a missing file: {target}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_between_pages_resolve(page):
    for target, anchor in re.findall(r"\]\(([^)#:\s]+\.md)(?:#([^)]*))?\)", page.read_text()):
        linked = (page.parent / target).resolve()
        assert linked.is_file(), f"{page.name} links a missing page: {target}"
        if anchor:
            headings = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                        for h in re.findall(r"^#+ (.*)$", linked.read_text(), re.M)}
            assert anchor in headings, f"{page.name}: no heading for #{anchor} in {target}"


def mmfs_argv(line: str) -> list[str] | None:
    """The arguments of an `mmfs ...` command line (None for any other command)."""
    first = line.split("|")[0].split("&&")[0].split("||")[0]
    try:
        words = shlex.split(first)
    except ValueError:
        return None
    return words[1:] if words and words[0] == "mmfs" else None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_mmfs_command_shown_parses(page):
    parser = build_parser()
    for info, body in blocks(page):
        if info not in SHELLS:
            continue
        for line in commands(body):
            argv = mmfs_argv(line)
            if argv is None:
                continue
            try:
                parser.parse_args(argv)
            except SystemExit as exc:  # argparse's way of refusing
                pytest.fail(f"{page.name}: `{line}` is not a valid mmfs command ({exc})")


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory):
    """A folder as the repository's after `make demo`: demo-data/ and configs/demo.yaml."""
    folder = tmp_path_factory.mktemp("docs")
    build_data(folder / "demo-data")
    (folder / "configs").mkdir()
    (folder / "configs" / "demo.yaml").write_text(
        config_text(Path("configs/demo.yaml"), Path("demo-data")))
    return folder


RUNNABLE = [(page, i) for page in PAGES for i, (info, _) in enumerate(blocks(page)) if info == "sh"]


@pytest.mark.parametrize("page", sorted({page for page, _ in RUNNABLE}), ids=lambda p: p.name)
def test_sh_blocks_run(page, demo_folder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for entry in demo_folder.iterdir():
        os.symlink(entry, work / entry.name)
    script = "\n".join(body for info, body in blocks(page) if info == "sh")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               PYTHONPATH=str(ROOT))
    try:
        run = subprocess.run(["bash", "-eu", "-c", script], cwd=work, env=env,
                             capture_output=True, text=True, timeout=240)
    finally:
        force_unmount(work / "mnt")
    assert run.returncode == 0, f"{page.name}: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    # Run in a checkout, the blocks leave nothing git would show: only folders it
    # ignores (tour/ holds the tours' own files) and empty ones (mnt after umount).
    ignored = {line.strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
               if line.startswith("/") and line.count("/") <= 2}
    left = sorted(e.name for e in work.iterdir() if e.name not in ignored and not os.path.islink(e)
                  and not (e.is_dir() and not any(e.iterdir())))
    assert left == [], f"{page.name} leaves {left} in the repository's folder: put a tour's files in tour/"


def test_the_object_storage_page_tries_a_bucket_on_this_machine():
    # Its sh blocks run above: a local S3-protocol server, a dataset uploaded, a mount.
    script = "\n".join(body for info, body in blocks(ROOT / "docs" / "object-storage.md") if info == "sh")
    assert "moto.server -H 127.0.0.1" in script and "upload_file" in script
    assert re.search(r"^mmfs mount \S+ mnt$", script, re.M) and "s3://" in script and "kill $SERVER" in script


@pytest.mark.parametrize("page", sorted({page for page, _ in RUNNABLE}), ids=lambda p: p.name)
def test_sh_blocks_reach_only_this_machine(page):
    script = "\n".join(body for info, body in blocks(page) if info == "sh")
    assert {host for host in re.findall(r"\w+://([^/:\s\"']+)", script) if "." in host} <= {"127.0.0.1"}
