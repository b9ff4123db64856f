"""`mmfs report`'s page in a real browser: headless Chromium (Debian's `chromium`,
installed by `make test`) opens the file with no network (a network namespace of
its own when the tests run as root), and the tests check what it rendered: no
JavaScript errors, every chart with one series per dataset, the sample browser
against `mmfs which --text`, a screenshot that is not blank. One page and one
rendering are shared by the tests; a run in phases has one page and rendering more."""

import json
import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser

import numpy as np
import pytest
import yaml

from mmfs.cli import main
from mmfs.tools.demo import write_dataset

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `make test` installs Debian's chromium "
                                                         "package (apt-get); this machine has none")
ITERATION, RANK = 9, 2
WORDS = "mix blend token epoch sample rank shard window weight share corpus document length".split()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A byte-level blend of two datasets with a training: block, and its page."""
    root = tmp_path_factory.mktemp("report-page")
    rng = np.random.RandomState(7)
    for name, mean in (("code", 60), ("prose", 25)):
        texts = [" ".join(rng.choice(WORDS, size=1 + rng.poisson(mean))) + "." for _ in range(300)]
        write_dataset(root / name, texts)
    config = root / "blend.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": "code", "weight": 0.6}, {"path": "prose", "weight": 0.4}],
        "split": "90,10,0", "samples": {"train": 640, "valid": 40, "test": 0}, "sequence_length": 64,
        "tokenizer": {"eod": 256, "vocab_size": 257}, "cache_dir": "cache",
        "training": {"data_parallel_size": 4, "micro_batch_size": 2, "global_batch_size": 16}}))
    html = root / "report.html"
    assert main(["report", str(config), "-o", str(html), "--iterations", f"1,{ITERATION},40"]) == 0
    return config, html


def _chromium(url: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=20000", *args, url]
    if os.geteuid() == 0 and shutil.which("unshare"):
        cmd = ["unshare", "--net", *cmd]  # no route out: only a loopback that is down
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def rendered(page, tmp_path_factory):
    """The page's DOM once rendered, and what the browser logged."""
    _, html = page
    done = _chromium(f"file://{html}#iteration={ITERATION}&rank={RANK}", tmp_path_factory.mktemp("chromium"),
                     "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


class _Dom(HTMLParser):
    """The status block and the sample browser's rows of a dumped page (a character the
    page shows as its code point, <span class='ctl' data-char='HEX'>, read as itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.status = ""
        self.rows: list[dict] = []
        self._in = None
        self._cell: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "pre" and a.get("id") == "mmfs-status":
            self._in = "status"
        elif tag == "tr" and "data-sample" in a:
            self.rows.append({"sample": int(a["data-sample"]), "cells": []})
        elif tag == "td" and self.rows:
            self._in = "cell"
            self._cell = []
        elif tag == "span" and self._in == "cell" and "data-char" in a:
            self._cell.append(chr(int(a["data-char"], 16)))
            self._in = "code point"

    def handle_endtag(self, tag):
        if tag == "td" and self._in == "cell":
            self.rows[-1]["cells"].append("".join(self._cell))
            self._in = None
        elif tag == "span" and self._in == "code point":
            self._in = "cell"
        elif tag == "pre" and self._in == "status":
            self._in = None

    def handle_data(self, data):
        if self._in == "status":
            self.status += data
        elif self._in == "cell":
            self._cell.append(data)


def _dom(text: str) -> _Dom:
    dom = _Dom()
    dom.feed(text)
    return dom


def test_no_javascript_errors_and_every_chart_has_a_series_per_dataset(rendered):
    dom_text, log = rendered
    console = [line for line in log.splitlines() if ":CONSOLE" in line and "source: file://" in line]
    assert not [line for line in console if "Uncaught" in line or "rror" in line], console
    status = json.loads(_dom(dom_text).status)
    assert status["errors"] == []
    kinds = ("blend", "mix", "lengths", "cuts", "ranks")
    assert sorted(status["charts"]) == sorted(f"{k}-{s}" for k in kinds for s in ("train", "valid"))
    for name, chart in status["charts"].items():
        assert chart["series"] == ["code", "prose"], name


def test_sample_browser_shows_what_which_says(page, rendered, capsys):
    config, _ = page
    assert main(["which", str(config), "--iteration", str(ITERATION), "--rank", str(RANK), "--text", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    rows = []
    for mb in expected["ranks"][0]["microbatches"]:
        for s in mb["samples"]:
            for k, p in enumerate(s["pieces"]):
                rows.append((s["sample"], [str(mb["microbatch"]) if k == 0 else "", str(s["sample"]) if k == 0 else "",
                                           s["dataset"] if k == 0 else "", str(p["sequence"]), str(p["document"]),
                                           "..".join(map(str, p["sample_tokens"])),
                                           "..".join(map(str, p["sequence_tokens"])), p["text"]]))
    shown = [(r["sample"], r["cells"]) for r in _dom(rendered[0]).rows]
    assert shown == rows
    assert len({s for s, _ in rows}) == 4  # 2 micro-batches of 2 samples per rank and iteration


def test_a_run_in_phases_renders_a_series_per_dataset_and_its_phases(tmp_path_factory):
    """A restart run of three phases (a dataset added, one dropped): the train charts
    have one series per dataset of the whole run, the mix marks each phase, and a
    table per phase follows."""
    from test_report_phases import NAMES, write

    root = tmp_path_factory.mktemp("report-phases")
    html = root / "phases.html"
    assert main(["-q", "report", write(root, "restart"), "-o", str(html), "--iterations", "1,12,30"]) == 0
    done = _chromium(f"file://{html}", root, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line and "source: file://" in line]
    assert not [line for line in console if "Uncaught" in line or "rror" in line], console
    status = json.loads(_dom(done.stdout).status)
    assert status["errors"] == []
    for kind in ("blend", "mix", "lengths", "cuts", "ranks"):
        assert status["charts"][f"{kind}-train"]["series"] == NAMES, kind
        assert status["charts"][f"{kind}-valid"]["series"] == NAMES[:2], kind  # the first phase's blend
    assert sorted(status["charts"]["mix-train"]["labels"]) == ["global batch 8", "phase 0", "phase 1", "phase 2"]
    assert done.stdout.count("<h3 class=\"phase\"") == 3
    assert "iteration 1: consumed_samples 0..8, phase 0, rank 0" in done.stdout  # the browser's first iteration


def test_screenshot_is_not_blank(page, tmp_path):
    _, html = page
    shot = tmp_path / "page.png"
    done = _chromium(f"file://{html}", tmp_path, f"--screenshot={shot}", "--window-size=1200,1600",
                     "--hide-scrollbars")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    raw = zlib.decompress(b"".join(_chunks(shot.read_bytes(), b"IDAT")))
    assert len(set(raw)) > 50  # a blank page compresses to a few distinct byte values


def _chunks(data: bytes, kind: bytes):
    pos = 8
    while pos < len(data):
        size, k = struct.unpack(">I4s", data[pos:pos + 8])
        if k == kind:
            yield data[pos + 8:pos + 8 + size]
        pos += 12 + size
