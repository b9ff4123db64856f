"""`mmfs report`'s page reads on any screen: in headless Chromium, a page of many
datasets with long names and a run in phases fit a 420 px window as a 1,400 px one
(no horizontal overflow of the document; every chart drawn, as wide as its box); the
counts are bars with whole-number ticks, each rank a dot per dataset, the mix a stacked
bar per window; plurals are right.

Chromium's window is at least 500 px wide, so the page is opened in an iframe of the
width asked for (a harness page copies the page's status out of it)."""

import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import yaml
from test_report_page import CHROMIUM, _chromium

from mmfs.cli import main
from mmfs.tools.demo import write_dataset
from mmfs.tools.report.charts import MAX_SERIES
from mmfs.tools.report.page import SCRIPTS
from mmfs.tools.report.words import plural

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `make test` installs Debian's chromium")
WIDTHS = (420, 1400)
HARNESS = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="{page}" style="width:{width}px;height:1600px;border:0;display:block"></iframe>
<script>
const f = document.getElementById("f");
function copy() {{
  const st = f.contentDocument && f.contentDocument.getElementById("mmfs-status");
  if (!st) {{ setTimeout(copy, 50); return; }}
  const out = document.createElement("pre");
  out.id = "copied";
  out.textContent = st.textContent;
  document.body.appendChild(out);
  const svg = document.createElement("div");
  svg.id = "charts";
  f.contentDocument.querySelectorAll("[data-chart]").forEach(c => svg.appendChild(c.cloneNode(true)));
  document.body.appendChild(svg);
}}
f.addEventListener("load", copy);
</script></body></html>
"""


@pytest.fixture(scope="module")
def wide_blend(tmp_path_factory):
    """25 datasets with long names (past MAX_SERIES: an "other" series), a training: block."""
    root = tmp_path_factory.mktemp("wide")
    rng = np.random.RandomState(3)
    datasets = []
    for k in range(25):
        name = f"common-crawl-snapshot-2024-{k:02d}-deduplicated-english"
        write_dataset(root / name, ["word " * int(rng.randint(5, 300)) for _ in range(60)])
        datasets.append({"path": name, "weight": float(1 + k % 7)})
    config = root / "wide.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": datasets, "split": "90,5,5", "samples": {"train": 1600, "valid": 96, "test": 96},
        "sequence_length": 128, "tokenizer": {"eod": 256, "vocab_size": 257}, "cache_dir": "cache",
        "training": {"data_parallel_size": 8, "micro_batch_size": 2, "global_batch_size": 32}}))
    page = root / "wide.html"
    assert main(["-q", "report", str(config), "-o", str(page), "--iterations", "1,7"]) == 0
    return page


@pytest.fixture(scope="module")
def phased(tmp_path_factory):
    from test_report_phases import write

    root = tmp_path_factory.mktemp("layout-phases")
    page = root / "phases.html"
    assert main(["-q", "report", write(root, "continue"), "-o", str(page), "--iterations", "1,12"]) == 0
    return page


class _ChartTexts(HTMLParser):
    """The texts of each chart's SVG, by chart name, and its marks by element."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[str, list[str]] = {}
        self.marks: dict[str, dict[str, int]] = {}
        self._chart = None
        self._in_text = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-chart" in a:
            self._chart = a["data-chart"]
            self.texts[self._chart], self.marks[self._chart] = [], {}
        elif self._chart and tag in ("rect", "circle", "path"):
            self.marks[self._chart][tag] = self.marks[self._chart].get(tag, 0) + 1
        self._in_text = tag == "text"

    def handle_endtag(self, tag):
        self._in_text = False

    def handle_data(self, data):
        if self._chart and self._in_text:
            self.texts[self._chart].append(data)


def _open_at(page, width: int, tmp_path):
    harness = page.parent / f"harness-{width}.html"
    harness.write_text(HARNESS.format(page=page.name, width=width))
    done = _chromium(f"file://{harness}", tmp_path, "--dump-dom", "--allow-file-access-from-files",
                     "--window-size=1500,1700")
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line and "source: file://" in line]
    assert console == []
    status = re.search(r'<pre id="copied">(.*?)</pre>', done.stdout, re.S)
    assert status, done.stdout[-2000:]
    charts = _ChartTexts()
    charts.feed(done.stdout[done.stdout.index('<div id="charts">'):])
    return json.loads(status.group(1).replace("&quot;", '"').replace("&amp;", "&")), charts


@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("which", ["wide_blend", "phased"])
def test_the_page_fits_the_window_and_draws_every_chart(which, width, request, tmp_path):
    status, charts = _open_at(request.getfixturevalue(which), width, tmp_path)
    assert status["errors"] == []
    assert status["window"] <= width and status["overflow"] <= 0
    assert len(status["charts"]) == 15 if which == "wide_blend" else 10
    for name, chart in status["charts"].items():
        assert chart["marks"] > 0 and 0 < chart["width"] <= status["window"], name
    if which == "wide_blend":
        assert len(status["charts"]["blend-train"]["series"]) == MAX_SERIES
        assert "other (6 datasets)" in status["charts"]["blend-train"]["series"]
    else:
        assert sorted(status["charts"]["mix-train"]["labels"]) == ["global batch 8", "phase 0", "phase 1", "phase 2"]


@needs_chromium
def test_counts_are_bars_with_whole_ticks_ranks_dots_the_mix_stacked(wide_blend, tmp_path):
    status, charts = _open_at(wide_blend, 1400, tmp_path)
    for split in ("train", "valid", "test"):
        assert charts.marks[f"cuts-{split}"].get("rect", 0) > 0  # bars
        assert charts.marks[f"mix-{split}"]["rect"] >= 20  # a stacked bar per window
        assert charts.marks[f"ranks-{split}"]["circle"] == 8 * MAX_SERIES  # a dot per rank and series
        for kind in ("cuts", "ranks", "mix"):
            ticks = [t for t in charts.texts[f"{kind}-{split}"] if re.fullmatch(r"[\d,.]+", t)]
            assert ticks and all(re.fullmatch(r"\d[\d,]*", t) for t in ticks), (kind, ticks)


def test_plurals():
    assert [plural(n, "sample") for n in (0, 1, 2, 2048)] == ["0 samples", "1 sample", "2 samples", "2,048 samples"]


def test_one_of_each_is_singular(tmp_path):
    from golden_cases import write_case_config

    page = tmp_path / "one.html"
    assert main(["-q", "report", str(write_case_config("p1_single_u16", tmp_path / "case")), "-o", str(page)]) == 0
    text = page.read_text()
    assert "1 dataset," in text
    assert not re.search(r"\b1 (samples|datasets|iterations|documents|tokens|phases)\b", text)


def test_the_scripts_inline_as_they_are():
    """The page's scripts go into <script> elements unchanged: nothing in them may end
    the element or open the HTML parser's comment-like state."""
    for path in SCRIPTS:
        text = open(path, encoding="utf-8").read().lower()
        assert "</script" not in text and "<!--" not in text, path
