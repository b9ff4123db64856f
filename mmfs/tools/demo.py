"""`make demo`: build a small corpus from text that ships with Python, mount
it, look at a sample from the shell, write the mount's report page, unmount. No
download.

Two byte-level datasets (token = byte value 0..255, EOD = 256, vocabulary 257,
so uint16 on disk), one document per piece of text, EOD appended:
  code   the source of the standard library's top-level modules, one per file
  prose  the docstrings of those modules, their classes and functions

    python -m mmfs.tools.demo [--data-dir demo-data] [--config configs/demo.yaml] [--screenshot PNG]

--screenshot (with Debian's chromium, `make browser`) also takes the page's picture:
`make report-png` makes docs/report.png so.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from mmfs.mount.contract import (
    KEY_MICROBATCH_NAME_WIDTH,
    KEY_NAME_WIDTH,
    KEY_PATH,
    KEY_RANK_NAME_WIDTH,
    KEY_SPLITS,
    KEY_TRAINING,
    MANIFEST,
    REPORT,
    XATTR_DATASET,
    XATTR_PIECES,
    XATTR_SAMPLES,
    file_name,
    rank_dir,
)
from mmfs.mount.report_file import BEING_MADE
from mmfs.processes import mmfs_command

EOD = 256
SAMPLE = 42
SHOT = (1000, 1250)  # px: docs/report.png
REPORT_WAIT = 300  # s: the mount makes the demo's page in a few


def stdlib_files() -> list[Path]:
    """The standard library's top-level .py files, in a stable order."""
    return [Path(p) for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))]


def docstrings(source: str) -> list[str]:
    """Docstrings of a module and of every class and function in it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                out.append(doc)
    return out


def write_dataset(prefix: Path, texts: list[str]) -> None:
    from mmfs.formats.writer import IndexedDatasetWriter

    writer = IndexedDatasetWriter(str(prefix) + ".bin", dtype=np.uint16)
    for text in texts:
        tokens = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
        writer.add_item(np.append(tokens, np.uint16(EOD)))
        writer.end_document()
    writer.finalize(str(prefix) + ".idx")


def build_data(data_dir: Path) -> dict[str, list[str]]:
    """Write the two datasets; return what each document is (for provenance)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    code, code_names, prose, prose_names = [], [], [], []
    for path in stdlib_files():
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        code.append(source)
        code_names.append(path.name)
        for i, doc in enumerate(docstrings(source)):
            prose.append(doc)
            prose_names.append(f"{path.name} docstring {i}")
    write_dataset(data_dir / "stdlib_code", code)
    write_dataset(data_dir / "stdlib_prose", prose)
    names = {"code": code_names, "prose": prose_names}
    (data_dir / "documents.json").write_text(json.dumps(names, indent=1))
    return names


def config_text(config: Path, data_dir: Path) -> str:
    rel = os.path.relpath(data_dir.resolve(), config.parent.resolve())
    return textwrap.dedent(f"""\
        # The corpus `make demo` builds (python -m mmfs.tools.demo): byte-level tokens of the
        # Python standard library's own files (token = byte, EOD = 256), no download.
        datasets:
          - path: {rel}/stdlib_code
            name: code
            weight: 0.7
          - path: {rel}/stdlib_prose
            name: prose
            weight: 0.3
        split: "80,10,10"         # valid and test hold enough of both datasets for their samples
        samples:
          train: 2000
          valid: 40
          test: 40
        sequence_length: 512
        seed: 1234
        tokenizer: {{eod: {EOD}, pad: null, vocab_size: 257}}
        cache_dir: {rel}/cache
        training:                 # the stream as Megatron's data loader hands it out
          data_parallel_size: 4
          micro_batch_size: 2
          global_batch_size: 16
        """)


def decode(tokens: np.ndarray) -> str:
    """Tokens back to text; EOD shown as a marker line."""
    out = bytearray()
    for t in tokens.tolist():
        out += b"\n<|eod|>\n" if t == EOD else bytes([t]) if t < 256 else b"?"
    return out.decode("utf-8", errors="replace")


def shell(cmd: str, cwd: Path | None = None) -> None:
    print(f"\n$ {cmd}", flush=True)
    subprocess.run(cmd, shell=True, cwd=cwd, check=False)


def mmfs_cli(*args: str) -> subprocess.CompletedProcess:
    if args[0] != "-q":
        print(f"\n$ mmfs {' '.join(args)}", flush=True)
    return subprocess.run(mmfs_command(*args), text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmfs.tools.demo", description="mmfs demo")
    parser.add_argument("--data-dir", default="demo-data", help="where the datasets go")
    parser.add_argument("--config", default="configs/demo.yaml", help="the config to write")
    parser.add_argument("--mountpoint", help="default: a new temporary directory")
    parser.add_argument("--screenshot", metavar="PNG", help="also take a picture of the report page "
                        f"({SHOT[0]}x{SHOT[1]}, headless Chromium), as docs/report.png is made")
    args = parser.parse_args(argv)
    data_dir, config = Path(args.data_dir), Path(args.config)

    print(f"== building two byte-level datasets from the Python standard library into {data_dir}/")
    names = build_data(data_dir)
    print(f"   code: {len(names['code'])} documents (one per module), "
          f"prose: {len(names['prose'])} documents (docstrings)")
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(config_text(config, data_dir))
    print(f"== wrote the blend config {config}:")
    print(textwrap.indent(config.read_text(), "   "))

    tmp = Path(tempfile.mkdtemp(prefix="mmfs-demo-"))
    mnt = Path(args.mountpoint) if args.mountpoint else tmp / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    print(f"$ mmfs mount {config} {mnt}", flush=True)
    log = tmp / "daemon.log"
    if mmfs_cli("-q", "mount", str(config), str(mnt), "--log", str(log)).returncode != 0:
        return 2
    print(f"mmfs: mounted (the daemon logs to {log})")
    os.stat(mnt / REPORT)  # the mount starts making its report page, in the background
    page = (data_dir / "report.html").resolve()
    try:
        # A sample cut from several documents shows provenance best.
        info = json.loads((mnt / MANIFEST).read_text())
        samples = mnt / info[KEY_SPLITS]["train"][KEY_PATH]
        width = info[KEY_SPLITS]["train"][KEY_NAME_WIDTH]
        index = next((i for i in range(SAMPLE, SAMPLE + 200) if len(os.getxattr(
            samples / file_name(i, width), XATTR_PIECES).split()) >= 3), SAMPLE)
        sample = samples / file_name(index, width)
        shell(f"ls -l {mnt}")
        shell(f"ls {mnt}/samples | head -5")
        shell(f"head -c 400 {mnt / MANIFEST}; echo ...")
        shell(f"hexdump -C {sample} | head -8")
        tokens = np.fromfile(sample, dtype=np.uint16)
        print(f"\n== sample {index} decoded back to text ({len(tokens)} tokens):")
        print(textwrap.indent(decode(tokens), "   | ", lambda line: True))
        dataset = os.getxattr(sample, XATTR_DATASET).decode()
        pieces = os.getxattr(sample, XATTR_PIECES).decode()
        if shutil.which("getfattr"):
            shell(f"getfattr -d {sample}")
        else:
            print(f"\n$ getfattr -d {sample}   # (from Python: os.getxattr)")
            print(f'{XATTR_DATASET}="{dataset}"\n{XATTR_PIECES}="{pieces}"')
        print(f"\n== where sample {index} comes from (sequence:offset:length pieces of {dataset}):")
        for piece in pieces.split():
            seq, off, length = map(int, piece.split(":"))
            print(f"   sequence {seq} = {names[dataset][seq]}: tokens {off}..{off + length}")
        t = info[KEY_TRAINING]
        rank1 = mnt / rank_dir("train", 1, t[KEY_RANK_NAME_WIDTH]).lstrip("/")
        batch = rank1 / file_name(2, t[KEY_MICROBATCH_NAME_WIDTH]["train"])
        print("\n== what data-parallel rank 1 of 4 reads (micro-batches of 2 samples, Megatron's sampler):")
        shell(f"ls {rank1.parent}; ls -l {rank1} | head -4")
        print(f'\n$ getfattr -n {XATTR_SAMPLES} {batch}\n{XATTR_SAMPLES}="'
              f'{os.getxattr(batch, XATTR_SAMPLES).decode()}"')
        mmfs_cli("which", str(mnt), "--iteration", "2", "--rank", "1")
        copy_report(mnt, page)
    finally:
        # Unmount before printing anything: a closed stdout must not leave a mount.
        mmfs_cli("-q", "umount", str(mnt))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n$ mmfs umount {mnt}\nmmfs: unmounted {mnt}")
    print(f"\n== the training mix as one page (the same as `mmfs report {config} -o FILE.html` writes; "
          "it opens from disk, no network):")
    print(f"   open {page}")
    if args.screenshot:
        screenshot(page, Path(args.screenshot))
        print(f"   its picture: {args.screenshot}")
    return 0


def copy_report(mnt: Path, page: Path) -> None:
    """MOUNT/report.html, once the mount has made it, copied to `page`."""
    deadline = time.monotonic() + REPORT_WAIT
    while (data := (mnt / REPORT).read_bytes()) == BEING_MADE:  # the kernel is told when the page replaces it
        if time.monotonic() > deadline:
            raise SystemExit(f"mmfs demo: {mnt / REPORT} was not made in {REPORT_WAIT} s (see the daemon log)")
        time.sleep(0.1)
    print(f"\n$ cp {mnt / REPORT} {page}", flush=True)
    page.write_bytes(data)


def screenshot(page: Path, png: Path) -> None:
    """The top of the page in headless Chromium (no network: the page fetches nothing)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("mmfs demo: --screenshot needs Debian's chromium package (make browser)")
    with tempfile.TemporaryDirectory(prefix="mmfs-shot-") as profile:
        done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                               f"--window-size={SHOT[0]},{SHOT[1]}", f"--screenshot={png.resolve()}", page.as_uri()],
                              capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not png.is_file():
        raise SystemExit(f"mmfs demo: chromium took no picture: {done.stderr[-500:]}")


if __name__ == "__main__":
    sys.exit(main())
