"""The page of `mmfs report`: one self-contained HTML file (every script and style
inside; it opens from disk with no network or server) of the figures of
mmfs.tools.report.command. The charts are Vega-Lite, built with Altair and shown by the
Vega bundle vl-convert ships, inlined (the optional extra `mmfs[report]`); the
tables, the warnings and the sample browser are plain HTML and a little script.

A chart has one series per dataset, up to MAX_SERIES; past that the datasets of
least weight are drawn as one "other" series (the tables keep every dataset).
The mix chart marks `bands`: where each segment of the batch-size schedule starts
and, in a run in phases, where each phase starts; such a run's train section also
has a table per phase (weights, realised shares, draws, positions)."""

from __future__ import annotations

import html
import json
import math
import os
import re
import stat
from typing import Any

from mmfs.errors import MmfsError

MAX_SERIES = 20
FOLD_AFTER = 12  # warnings and table rows shown before the rest fold away
INSTALL = "pip install 'mmfs[report]'"
PAGE_SCRIPT = os.path.join(os.path.dirname(__file__), "page.js")


class ReportExtraMissing(MmfsError):
    """The plotting libraries of `mmfs[report]` are not installed."""


def _libraries():
    try:
        import altair as alt
        import vl_convert
    except ImportError as exc:
        raise ReportExtraMissing(f"mmfs report: the page needs the report extra ({exc.name} is missing): "
                                 f"{INSTALL}") from None
    return alt, vl_convert


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
    data = page(figs).encode("utf-8")
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


def page(figs: dict[str, Any]) -> str:
    """The whole page, as text."""
    alt, vl_convert = _libraries()
    from altair.vegalite import SCHEMA_VERSION

    bundle = vega_bundle(vl_convert, "_".join(SCHEMA_VERSION.split(".")[:2]))
    charts: dict[str, Any] = {}
    sections = []
    for split, s in figs["splits"].items():
        for kind, chart in _split_charts(alt, split, s).items():
            charts[f"{kind}-{split}"] = chart.to_dict(validate=False)
        sections.append(_split_html(split, s))
    with open(PAGE_SCRIPT, encoding="utf-8") as f:
        script = f.read()
    payload = {"charts": charts, "browser": figs.get("browser") or {"iterations": []}}
    title = f"mmfs report: {os.path.basename(figs['config'])}"
    return "\n".join([
        "<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style>",
        "<script>window.mmfsErrors = []; window.addEventListener('error', e => window.mmfsErrors.push("
        "String(e.message)));</script>",
        f"<script>{_script_text(bundle)}</script>", "</head><body>",
        f"<h1>{html.escape(title)}</h1>", _summary_html(figs), _warnings_html(figs["warnings"]),
        *sections, _browser_html(figs.get("browser")),
        f"<script type='application/json' id='mmfs-data'>{json_block(payload)}</script>",
        f"<script>{_script_text(script)}</script>", "</body></html>", ""])


def vega_bundle(vl_convert, vl_version: str) -> str:
    """The Vega, Vega-Lite and vega-embed scripts in one bundle. vl-convert makes it
    in some seconds, the same each time: it is kept in the per-user cache folder,
    named by vl-convert's version and Vega-Lite's."""
    from importlib.metadata import version

    from mmfs.storage.settings import default_cache_dir

    path = os.path.join(default_cache_dir(), "report", f"vega-{version('vl-convert-python')}-{vl_version}.js")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        pass
    bundle = vl_convert.javascript_bundle(vl_version=vl_version)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(bundle)
        os.replace(tmp, path)
    except OSError:  # a read-only home: made again next time
        pass
    return bundle


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


def _script_text(text: str) -> str:
    """Text safe inside a <script> element: no closing tag, no comment opener (escaped
    as a string or a regular expression reads them the same)."""
    return re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE).replace("<!--", "<\\!--")


# -- charts -----------------------------------------------------------------------------------------


def series_names(rows: list[dict[str, Any]]) -> dict[str, str]:
    """dataset -> the series it is drawn in: itself, or "other (N datasets)" past MAX_SERIES."""
    if len(rows) <= MAX_SERIES:
        return {r["dataset"]: r["dataset"] for r in rows}
    by_weight = sorted(rows, key=lambda r: -r["weight"])
    other = f"other ({len(rows) - MAX_SERIES + 1} datasets)"
    keep = {r["dataset"] for r in by_weight[:MAX_SERIES - 1]}
    return {r["dataset"]: r["dataset"] if r["dataset"] in keep else other for r in rows}


def _by_series(rows: list[dict[str, Any]], series: dict[str, str], values) -> dict[str, list[float]]:
    """values(row) summed element by element over the datasets of each series."""
    out: dict[str, list[float]] = {}
    for r in rows:
        v, acc = values(r), out.setdefault(series[r["dataset"]], [])
        acc.extend([0] * (len(v) - len(acc)))
        for k, x in enumerate(v):
            acc[k] += x
    return out


def _split_charts(alt, split: str, s: dict[str, Any]) -> dict[str, Any]:
    rows = s["datasets"]
    series = series_names(rows)
    order = list(dict.fromkeys(series.values()))
    color = alt.Color("dataset:N", sort=order, title="dataset")
    width = 640

    blend = []
    for measure, key in (("weight", "weight"), ("realised share", "share")):
        summed = _by_series(rows, series, lambda r, key=key: [r[key]])
        blend += [{"dataset": d, "measure": measure, "value": v[0]} for d, v in summed.items()]
    charts = {"blend": alt.Chart(alt.Data(values=blend)).mark_bar().encode(
        x=alt.X("dataset:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30)),
        xOffset=alt.XOffset("measure:N", sort=["weight", "realised share"]),
        y=alt.Y("value:Q", title="share of samples"), color=color,
        opacity=alt.Opacity("measure:N", sort=["weight", "realised share"], scale=alt.Scale(range=[0.45, 1]),
                            legend=None),
        tooltip=["dataset:N", "measure:N", alt.Tooltip("value:Q", format=".4f")],
    ).properties(width=width, height=220, title=f"{split}: weight (lighter) and realised share")}

    by_iteration = s["run"]["axis"] == "iteration"
    x_field, x_title = ("first_iteration", "iteration") if by_iteration else ("first_sample", "sample")
    mix = []
    for w, counts in zip(s["mix"]["windows"], s["mix"]["counts"]):
        total = max(sum(counts), 1)
        per: dict[str, float] = {}
        for r, c in zip(rows, counts):
            per[series[r["dataset"]]] = per.get(series[r["dataset"]], 0.0) + c / total
        mix += [{"x": w[x_field], "dataset": d, "share": v} for d, v in per.items()]
    area = alt.Chart(alt.Data(values=mix)).mark_area().encode(
        x=alt.X("x:Q", title=x_title, scale=alt.Scale(nice=False, zero=False)),
        y=alt.Y("share:Q", stack="normalize", title="share of the window"),
        color=color, tooltip=["dataset:N", alt.Tooltip("x:Q", title=x_title), alt.Tooltip("share:Q", format=".3f")])
    layers = [area]
    for kind, style, y in (("batch_size", {"strokeDash": [4, 3]}, 0), ("phase", {"strokeWidth": 2}, 240)):
        bands = [{"x": b[x_field], "label": b["label"]} for b in s["mix"]["bands"]
                 if b["kind"] == kind and x_field in b]
        if bands:  # a rule where each starts, labelled (batch sizes at the top, phases at the bottom)
            marks = alt.Chart(alt.Data(values=bands))
            layers += [marks.mark_rule(color="black", **style).encode(x="x:Q"),
                       marks.mark_text(align="left", dx=3, dy=-6 if y == 0 else -3, baseline="bottom").encode(
                           x="x:Q", y=alt.value(y), text="label:N")]
    charts["mix"] = alt.layer(*layers).properties(width=width, height=240,
                                                  title=f"{split}: the mix over the run, per window of {x_title}s")

    lengths = []
    edges = max((r["lengths"]["edges"] for r in rows), key=len)
    for d, hist in _by_series(rows, series, lambda r: r["lengths"]["histogram"]).items():
        lengths += [{"dataset": d, "length": e, "share": c / max(sum(hist), 1)} for e, c in zip(edges, hist) if c]
    charts["lengths"] = alt.Chart(alt.Data(values=lengths)).mark_line(point=True).encode(
        x=alt.X("length:Q", scale=alt.Scale(type="log"), title="document length (tokens, bins of 2^0.5)"),
        y=alt.Y("share:Q", title="share of documents"), color=color, tooltip=["dataset:N", "length:Q"],
    ).properties(width=width, height=220, title=f"{split}: document lengths")

    cuts = []
    for d, counts in _by_series(rows, series, lambda r: r["documents_per_sample"]).items():
        cuts += [{"dataset": d, "documents": k, "share": c / max(sum(counts), 1)} for k, c in enumerate(counts) if c]
    charts["cuts"] = alt.Chart(alt.Data(values=cuts)).mark_line(point=True).encode(
        x=alt.X("documents:Q", title="documents in a sample"), y=alt.Y("share:Q", title="share of samples"),
        color=color, tooltip=["dataset:N", "documents:Q"],
    ).properties(width=width, height=200, title=f"{split}: how samples cut documents")

    ranks = s.get("ranks")
    if ranks and ranks.get("counts"):
        per_rank = []
        for rank, counts in enumerate(ranks["counts"]):
            total = max(sum(counts), 1)
            per: dict[str, float] = {}
            for r, c in zip(rows, counts):
                per[series[r["dataset"]]] = per.get(series[r["dataset"]], 0.0) + c / total
            per_rank += [{"rank": rank, "dataset": d, "share": v} for d, v in per.items()]
        charts["ranks"] = alt.Chart(alt.Data(values=per_rank)).mark_line(point=True).encode(
            x=alt.X("rank:O", title="data-parallel rank"), y=alt.Y("share:Q", title="share of the rank's samples"),
            color=color, tooltip=["dataset:N", "rank:O", alt.Tooltip("share:Q", format=".4f")],
        ).properties(width=width, height=200, title=f"{split}: each rank's shares")
    elif ranks:
        spread = [{"dataset": series[r["dataset"]], "low": lo, "high": hi}
                  for r, lo, hi in zip(rows, ranks["share_min"], ranks["share_max"])]
        charts["ranks"] = alt.Chart(alt.Data(values=spread)).mark_rule(strokeWidth=6).encode(
            x=alt.X("dataset:N", sort=order), y=alt.Y("min(low):Q", title="share over the ranks"),
            y2="max(high):Q", color=color,
        ).properties(width=width, height=200, title=f"{split}: the spread of each dataset's share over the ranks")
    return charts


# -- HTML around them ---------------------------------------------------------------------------------


def _summary_html(figs: dict[str, Any]) -> str:
    t = figs.get("training") or {}
    layout = (f"data_parallel_size {t['data_parallel_size']}, micro_batch_size {t['micro_batch_size']}, "
              f"{t['dataloader_type']} sampler") if t else "no training: block (the mix is shown by sample)"
    return (f"<p class='summary' title='{html.escape(figs['config'])}'>{len(figs['datasets'])} datasets, "
            f"{figs['tokens_per_sample']:,} tokens per sample; {html.escape(layout)}.</p>")


def _warnings_html(warnings: list[dict[str, Any]]) -> str:
    if not warnings:
        return "<section id='warnings'><h2>Warnings</h2><p class='none'>none</p></section>"
    items = [f"<li class='warning' data-kind='{html.escape(w['kind'])}'>{html.escape(w['message'])}</li>"
             for w in warnings]
    more = "" if len(items) <= FOLD_AFTER else \
        f"<details><summary>{len(items) - FOLD_AFTER} more</summary><ul>{''.join(items[FOLD_AFTER:])}</ul></details>"
    return (f"<section id='warnings'><h2>Warnings ({len(warnings)})</h2><ul>{''.join(items[:FOLD_AFTER])}</ul>"
            f"{more}</section>")


COLUMNS = [("dataset", "dataset", "{}"), ("weight", "weight", "{:.4f}"), ("share", "realised share", "{:.4f}"),
           ("samples", "samples", "{:,}"), ("tokens", "tokens", "{:,}"), ("documents", "documents", "{:,}"),
           ("epochs", "epochs", "{:.3f}"), ("epochs_in_index", "epochs in its document index", "{}"),
           ("mid_document_share", "samples ending mid-document", "{:.1%}")]


def _split_html(split: str, s: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt.format(r[key]))}</td>" for key, _, fmt in COLUMNS)
                   + "</tr>" for r in s["datasets"])
    run = s["run"]
    extent = (f"{run['iterations']:,} iterations, {run['samples']:,} samples" if run["axis"] == "iteration"
              else f"{run['samples']:,} samples")
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in run["notes"])
    kinds = ["blend", "mix", "lengths", "cuts"] + (["ranks"] if s.get("ranks") else [])
    charts = "".join(f"<div class='chart' id='chart-{k}-{split}' data-chart='{k}-{split}'></div>" for k in kinds)
    table = f"<table class='blend'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if len(s["datasets"]) > FOLD_AFTER:
        table = f"<details><summary>every dataset ({len(s['datasets']):,})</summary>{table}</details>"
    phases = s.get("phases")
    what = s["top_level"] if phases is None else \
        f"{len(phases['phases'])} phases ({phases['phase_mode']}; weights averaged over the run)"
    return (f"<section class='split' id='split-{split}'><h2>{split}: {what} of "
            f"{s['samples']:,} samples; the run reads {extent}</h2>{notes}{table}{charts}"
            f"{'' if phases is None else _phases_html(phases)}</section>")


PHASE_COLUMNS = [("name", "dataset", "{}"), ("normalized_weight", "weight", "{:.4f}"),
                 ("share", "realised share", "{:.4f}"), ("draws", "samples drawn", "{:,}"),
                 ("position_before", "position at its start", "{:,}"), ("position_after", "at its end", "{:,}"),
                 ("left", "samples left", "{:,}")]


def _phases_html(phases: dict[str, Any]) -> str:
    """A table per phase: what mmfs.json's `phases` section says of it."""
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in PHASE_COLUMNS)
    out = []
    for p in phases["phases"]:
        where = f"sample {p['start_sample']:,}" if p["first_iteration"] is None else \
            f"iteration {p['first_iteration']:,} (sample {p['start_sample']:,})"
        body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt.format(r[key]))}</td>" for key, _, fmt in PHASE_COLUMNS)
                       + "</tr>" for r in p["datasets"])
        table = f"<table class='phase'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        if len(p["datasets"]) > FOLD_AFTER:
            table = f"<details><summary>every dataset ({len(p['datasets']):,})</summary>{table}</details>"
        again = "" if p["served_before"] is None else f"; {p['served_before']:,} of them served earlier in the run"
        out.append(f"<h3 class='phase' data-phase='{p['phase']}'>phase {p['phase']}: from {where}, "
                   f"{p['samples']:,} samples{again}</h3>{table}")
    note = f"<p class='note'>{html.escape(phases['note'])}</p>" if phases.get("note") else ""
    return f"<div class='phases'>{note}{''.join(out)}</div>"


def _browser_html(browser: dict[str, Any] | None) -> str:
    if not browser or not browser.get("iterations"):
        why = (browser or {}).get("note") or "no iterations"
        return f"<section id='browser'><h2>Samples</h2><p class='note'>{html.escape(why)}</p></section>"
    note = f"<p class='note'>{html.escape(browser['note'])}</p>" if browser.get("note") else ""
    return ("<section id='browser'><h2>Samples by iteration and rank</h2>" + note +
            "<label>iteration <select id='iteration'></select></label> "
            "<label>rank <select id='rank'></select></label><div id='samples'></div></section>")


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1100px; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 90%; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.warning { color: #8a4b00; } .note { color: #555; font-size: 90%; }
.chart { margin: 0.8em 0; }
pre.text { white-space: pre-wrap; background: #f6f6f6; padding: 4px; max-height: 12em; overflow: auto; margin: 0; }
table.samples td { text-align: left; vertical-align: top; }
"""
