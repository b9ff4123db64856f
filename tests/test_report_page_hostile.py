"""`mmfs report`'s page with training text a page must survive: HTML comments,
`</script>`, markup that runs script if parsed, NUL, invalid UTF-8, bidi controls,
line separators. Headless Chromium draws every chart and every sample row, logs no
error, runs none of the text, and the browser shows each piece's text as it is
(what `mmfs which --text` decodes). The config file's own name is hostile too."""

import json
from html.parser import HTMLParser

import numpy as np
import pytest
import yaml
from test_report_page import CHROMIUM, _chromium, _dom

from mmfs.cli import main
from mmfs.formats.writer import IndexedDatasetWriter

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `make test` installs Debian's chromium")

MARK = "data-injected"
PAYLOADS = [
    b"<!-- an HTML comment, as web-crawled text holds them -->",
    b"</script><script>document.body.setAttribute('" + MARK.encode() + b"', 'script')</script>",
    b"<img src=x onerror=\"document.body.setAttribute('" + MARK.encode() + b"', 'img')\">",
    b"<!--<script>", b"</SCRIPT  >", b"<![CDATA[ ]]>", b"&lt;&amp; \\u003c \\\\",
    b"NUL\x00NUL", b"bad UTF-8: \xff\xfe \xc3( \xe2\x82",
    "bidi: \u202eoverride\u202c \u200fmark \u2066isolate\u2069 \u2028line\u2029para".encode(),
    "\u05e9\u05dc\u05d5\u05dd and \u0645\u0631\u062d\u0628\u0627".encode(),
]
DOCUMENT = b" | ".join(PAYLOADS)


class _Tags(HTMLParser):
    """The elements of a dumped page (script text is not parsed as markup), each
    tag's attribute names."""

    def __init__(self) -> None:
        super().__init__()
        self.attributes: dict[str, set[str]] = {}

    def handle_starttag(self, tag, attrs):
        self.attributes.setdefault(tag, set()).update(name for name, _ in attrs)


def _write(prefix, documents: list[bytes]) -> None:
    writer = IndexedDatasetWriter(f"{prefix}.bin", dtype=np.uint16)
    for doc in documents:
        writer.add_item(np.append(np.frombuffer(doc, dtype=np.uint8).astype(np.uint16), np.uint16(256)))
        writer.end_document()
    writer.finalize(f"{prefix}.idx")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """One iteration of two samples, one of each dataset; every sample of `hostile`
    holds the whole payload document at least once (a sample is twice as long)."""
    root = tmp_path_factory.mktemp("hostile")
    _write(root / "hostile", [DOCUMENT] * 8)
    _write(root / "plain", [b"plain words of a second dataset " * 3] * 40)
    config = root / "a<!--b<script>&c.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": "hostile", "weight": 0.5}, {"path": "plain", "weight": 0.5}],
        "split": "100,0,0", "samples": {"train": 8, "valid": 0, "test": 0}, "sequence_length": 2 * len(DOCUMENT),
        "tokenizer": {"eod": 256, "vocab_size": 257}, "cache_dir": "cache",
        "training": {"data_parallel_size": 1, "micro_batch_size": 2, "global_batch_size": 2}}))
    page = root / "page.html"
    assert main(["-q", "report", str(config), "-o", str(page), "--iterations", "1,2"]) == 0
    done = _chromium(f"file://{page}#iteration=1&rank=0", root, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return config, page, done


def test_every_chart_and_row_is_drawn_with_no_error_and_no_script_run(hostile, capsys):
    config, page, done = hostile
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line and "source: file://" in line]
    assert console == []
    dom = _dom(done.stdout)
    status = json.loads(dom.status)
    assert status["errors"] == []
    assert sorted(status["charts"]) == sorted(f"{k}-train" for k in ("blend", "mix", "lengths", "cuts", "ranks"))
    for name, chart in status["charts"].items():
        assert chart["series"] == ["hostile", "plain"], name
    tags = _Tags()
    tags.feed(done.stdout)
    body = done.stdout[done.stdout.index("<body"):done.stdout.index('<script type="application/json"')]
    assert MARK not in tags.attributes["body"]  # the payloads' script set no attribute on <body>
    assert "img" not in tags.attributes  # and no markup of theirs became an element
    assert main(["which", str(config), "--iteration", "1", "--rank", "0", "--text", "--json"]) == 0
    expected = [p["text"] for mb in json.loads(capsys.readouterr().out)["ranks"][0]["microbatches"]
                for s in mb["samples"] for p in s["pieces"]]
    for c in ("0000", "202E", "200F", "2066", "2028"):  # shown as code points, not as themselves
        assert f'data-char="{c}"' in done.stdout and chr(int(c, 16)) not in body, c
    shown = [r["cells"][-1] for r in dom.rows]
    assert len(shown) == len(expected) and any("NUL" in t for t in expected)
    assert shown == expected


def test_the_title_is_the_config_name_as_text(hostile):
    _, _, done = hostile
    assert "<title>mmfs report: a&lt;!--b&lt;script&gt;&amp;c.yaml</title>" in done.stdout
