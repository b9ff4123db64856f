"""The page of `mmfs report`: one self-contained HTML file (every script and style
inside; it opens from disk with no network or server) of the figures of
mmfs.tools.report.command. The charts are SVG that the page's own script draws
(charts.js, from the data charts.py makes; no library), each as wide as its box;
the tables, the warnings and the sample browser are plain HTML, laid out to read on
a phone's screen as on a desktop's (a table scrolls in its own box).

The figures reach the page as one JSON block (json_block: no text of a sample can end
it) and the script puts every string in with textContent, never as markup. In a run
in phases the train section also has a table per phase (weights, realised shares,
draws, positions)."""

from __future__ import annotations

import html
import json
import math
import os
import re
import stat
from typing import Any

from mmfs.errors import MmfsError
from mmfs.tools.report.charts import series_colors, split_charts
from mmfs.tools.report.words import plural

FOLD_AFTER = 12  # warnings and table rows shown before the rest fold away
HERE = os.path.dirname(__file__)
SCRIPTS = [os.path.join(HERE, "charts.js"), os.path.join(HERE, "page.js")]  # inlined, in this order


class ReportOutputError(MmfsError):
    """`mmfs report -o FILE` names a place a page cannot be written to."""


def check_output(path: str) -> str:
    """The file the page goes to (a symlink followed), refused in one line before the
    figures are made when it cannot take a page: an existing directory or special file
    (the page is written beside it and renamed over it, which would replace a device
    such as /dev/null), or a folder that is missing or not writable."""
    if not path:
        raise ReportOutputError("mmfs report -o: an empty file name; give FILE.html")
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise ReportOutputError(f"{path}: cannot be looked at ({exc.strerror}); give -o another FILE.html") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ReportOutputError(f"{path}: is a directory; give -o a file name, such as "
                                f"{os.path.join(path, 'report.html')}")
    if mode is not None and not stat.S_ISREG(mode):
        raise ReportOutputError(f"{path}: is not a regular file (a device, FIFO or socket); give -o FILE.html")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise ReportOutputError(f"{path}: the folder {folder} does not exist; create it or give -o another path")
    if not os.access(folder, os.W_OK):
        raise ReportOutputError(f"{path}: the folder {folder} is not writable (read-only or no permission); "
                                "give -o another path")
    return target


def write_page(figs: dict[str, Any], path: str) -> int:
    target = check_output(path)
    data = page_bytes(figs)
    tmp = f"{target}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except OSError as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise ReportOutputError(f"{path}: cannot write the page ({exc.strerror}); give -o another path") from None
    return len(data)


def page_bytes(figs: dict[str, Any]) -> bytes:
    """The page as the file holds it (UTF-8; a name that is no text, such as a file name's
    undecodable byte, shown as its escape)."""
    return page(figs).encode("utf-8", "backslashreplace")


def page(figs: dict[str, Any]) -> str:
    """The whole page, as text."""
    colors = series_colors(figs["splits"])
    charts: dict[str, Any] = {}
    sections = []
    for split, s in figs["splits"].items():
        for kind, chart in split_charts(split, s, colors).items():
            charts[f"{kind}-{split}"] = chart
        sections.append(_split_html(split, s))
    scripts = []
    for path in SCRIPTS:
        with open(path, encoding="utf-8") as f:
            scripts.append(f"<script>{f.read()}</script>")
    payload = {"charts": charts, "browser": figs.get("browser") or {"iterations": []}}
    title = f"mmfs report: {os.path.basename(figs['config'])}"
    return "\n".join([
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style>",
        "<script>window.mmfsErrors = []; window.addEventListener('error', e => window.mmfsErrors.push("
        "String(e.message)));</script>", "</head><body>",
        f"<h1>{html.escape(title)}</h1>", _summary_html(figs), _warnings_html(figs["warnings"]),
        *sections, _browser_html(figs.get("browser")),
        f"<script type='application/json' id='mmfs-data'>{json_block(payload)}</script>",
        *scripts, "</body></html>", ""])


# What may not stand as itself in the page's JSON block: `<` (it could open `</script>` or
# `<!--`, which change how the HTML parser reads a script element), `>` and `&` (for
# good measure), U+2028/9 (line ends to older JavaScript) and lone surrogates (no UTF-8
# for them). Each is written as a \uXXXX escape: the same string to JSON.parse.
_NOT_IN_BLOCK = re.compile("[<>&\u2028\u2029\ud800-\udfff]")


def json_block(value: Any) -> str:
    """`value` as the text of a <script type='application/json'> element: JSON that
    JSON.parse reads back as it was, whatever strings it holds (non-finite numbers,
    which JSON has not, as null)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:  # NaN or infinity somewhere
        text = json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return _NOT_IN_BLOCK.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# -- HTML around them ---------------------------------------------------------------------------------


def _summary_html(figs: dict[str, Any]) -> str:
    t = figs.get("training") or {}
    layout = (f"data_parallel_size {t['data_parallel_size']}, micro_batch_size {t['micro_batch_size']}, "
              f"{t['dataloader_type']} sampler") if t else "no training: block (the mix is shown by sample)"
    return (f"<p class='summary' title='{html.escape(figs['config'])}'>{plural(len(figs['datasets']), 'dataset')}, "
            f"{plural(figs['tokens_per_sample'], 'token')} per sample; {html.escape(layout)}.</p>")


def _warnings_html(warnings: list[dict[str, Any]]) -> str:
    if not warnings:
        return "<section id='warnings'><h2>Warnings</h2><p class='none'>none</p></section>"
    items = [f"<li class='warning' data-kind='{html.escape(w['kind'])}'>{html.escape(w['message'])}</li>"
             for w in warnings]
    more = "" if len(items) <= FOLD_AFTER else \
        f"<details><summary>{len(items) - FOLD_AFTER} more</summary><ul>{''.join(items[FOLD_AFTER:])}</ul></details>"
    return (f"<section id='warnings'><h2>Warnings ({len(warnings)})</h2><ul>{''.join(items[:FOLD_AFTER])}</ul>"
            f"{more}</section>")


def _table(cls: str, columns: list[tuple[str, str, str]], rows: list[dict[str, Any]]) -> str:
    """A table in a box of its own that scrolls sideways when the screen is narrower;
    folded away past FOLD_AFTER rows."""
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt.format(r[key]))}</td>" for key, _, fmt in columns)
                   + "</tr>" for r in rows)
    table = (f"<div class='scroll'><table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
             "</table></div>")
    if len(rows) > FOLD_AFTER:
        table = f"<details><summary>every dataset ({len(rows):,})</summary>{table}</details>"
    return table


COLUMNS = [("dataset", "dataset", "{}"), ("weight", "weight", "{:.4f}"), ("share", "realised share", "{:.4f}"),
           ("samples", "samples", "{:,}"), ("tokens", "tokens", "{:,}"), ("documents", "documents", "{:,}"),
           ("epochs", "epochs", "{:.3f}"), ("epochs_in_index", "epochs in its document index", "{}"),
           ("mid_document_share", "samples ending mid-document", "{:.1%}")]


def _split_html(split: str, s: dict[str, Any]) -> str:
    run = s["run"]
    extent = (f"{plural(run['iterations'], 'iteration')}, {plural(run['samples'], 'sample')}"
              if run["axis"] == "iteration" else plural(run["samples"], "sample"))
    rounding = [s["rounding"]["note"]] if s.get("rounding") else []
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in rounding + run["notes"])
    kinds = ["blend", "mix", "lengths", "cuts"] + (["ranks"] if s.get("ranks") else [])
    charts = "".join(f"<div class='chart' id='chart-{k}-{split}' data-chart='{k}-{split}'></div>" for k in kinds)
    phases = s.get("phases")
    what = s["top_level"] if phases is None else \
        f"{len(phases['phases'])} phases ({phases['phase_mode']}; weights averaged over the run)"
    return (f"<section class='split' id='split-{split}'><h2>{split}: {what} of "
            f"{plural(s['samples'], 'sample')}; the run reads {extent}</h2>{notes}"
            f"{_table('blend', COLUMNS, s['datasets'])}{charts}"
            f"{'' if phases is None else _phases_html(phases)}</section>")


PHASE_COLUMNS = [("name", "dataset", "{}"), ("normalized_weight", "weight", "{:.4f}"),
                 ("share", "realised share", "{:.4f}"), ("draws", "samples drawn", "{:,}"),
                 ("position_before", "position at its start", "{:,}"), ("position_after", "at its end", "{:,}"),
                 ("left", "samples left", "{:,}")]


def _phases_html(phases: dict[str, Any]) -> str:
    """A table per phase: what mmfs.json's `phases` section says of it."""
    out = []
    for p in phases["phases"]:
        where = f"sample {p['start_sample']:,}" if p["first_iteration"] is None else \
            f"iteration {p['first_iteration']:,} (sample {p['start_sample']:,})"
        again = "" if p["served_before"] is None else f"; {p['served_before']:,} of them served earlier in the run"
        out.append(f"<h3 class='phase' data-phase='{p['phase']}'>phase {p['phase']}: from {where}, "
                   f"{plural(p['samples'], 'sample')}{again}</h3>{_table('phase', PHASE_COLUMNS, p['datasets'])}")
    note = f"<p class='note'>{html.escape(phases['note'])}</p>" if phases.get("note") else ""
    return f"<div class='phases'>{note}{''.join(out)}</div>"


def _browser_html(browser: dict[str, Any] | None) -> str:
    if not browser or not browser.get("iterations"):
        why = (browser or {}).get("note") or "no iterations"
        return f"<section id='browser'><h2>Samples</h2><p class='note'>{html.escape(why)}</p></section>"
    note = f"<p class='note'>{html.escape(browser['note'])}</p>" if browser.get("note") else ""
    return ("<section id='browser'><h2>Samples by iteration and rank</h2>" + note +
            "<p><label>iteration <select id='iteration'></select></label> "
            "<label>rank <select id='rank'></select></label></p><div id='samples'></div>"
            "<p class='note'>Characters that do not print (NUL and other controls, direction marks, "
            "zero widths) are shown as their code point, <span class='ctl'>U+202E</span>.</p></section>")


# Narrow screens first: nothing is wider than the window; a table scrolls in its own box.
STYLE = """
html { overflow-y: scroll; }  /* room for a scroll bar from the start: no chart is drawn for a wider box */
body { font-family: sans-serif; margin: 0 auto; padding: 0.5em 1em 2em; color: #222; max-width: 1100px;
       overflow-wrap: anywhere; line-height: 1.35; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; } h3 { font-size: 1em; }
.scroll { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1em; }
table { border-collapse: collapse; font-size: 90%; overflow-wrap: normal; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.warning { color: #8a4b00; } .note { color: #555; font-size: 90%; }
.chart { margin: 1.2em 0 1.6em; }
.chart-title { font-weight: bold; font-size: 95%; margin-bottom: 0.2em; }
.legend { display: flex; flex-wrap: wrap; gap: 0.1em 1em; font-size: 85%; margin-bottom: 0.3em; }
.legend .key { white-space: nowrap; } .legend .key.group { color: #555; }
.legend i { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; vertical-align: -0.05em; }
.plot { width: 100%; } .plot svg { display: block; }
.plot text { font: 11px sans-serif; fill: #333; } .plot .axis-title { fill: #555; }
.plot .grid { stroke: #e4e4e4; } .plot .axis { stroke: #888; }
pre.text { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f6f6; padding: 4px; max-height: 12em;
           overflow: auto; margin: 0; min-width: 14em; unicode-bidi: isolate; }
span.ctl { font-size: 75%; color: #a40000; border: 1px solid #d9a0a0; border-radius: 2px; padding: 0 1px; }
table.samples td { text-align: left; vertical-align: top; }
@media (max-width: 700px) {  /* the sample browser: a block per piece, its text as wide as the screen */
  table.samples, table.samples tbody, table.samples tr { display: block; }
  table.samples tr.head { display: none; }
  table.samples tr { border-top: 1px solid #ccc; padding: 0.3em 0; }
  table.samples td { display: inline-block; border: 0; padding: 0 0.8em 0.2em 0; }
  table.samples td:empty { display: none; }
  table.samples td::before { content: attr(data-label) ": "; color: #777; }
  table.samples td.text { display: block; padding-right: 0; } table.samples td.text::before { content: none; }
}
"""
