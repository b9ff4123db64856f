"""The charts of `mmfs report`'s page, as the data its script draws (charts.js: SVG,
no library): per split,

    blend    each dataset's weight against its realised share (a pair of bars per dataset)
    mix      each window of the run as a bar stacked by dataset, with where each segment
             of the batch-size schedule and each phase starts (`bands`)
    lengths  each dataset's document lengths (a line over a log axis)
    cuts     how many documents a sample holds (a group of bars per count)
    ranks    each rank's share of each dataset (a dot per rank and dataset), or, past
             the size kept per rank, each dataset's spread over the ranks

A chart has one series per dataset, up to MAX_SERIES; past that the datasets of
least weight are drawn as one "other" series (the tables keep every dataset). A
dataset has one colour on the whole page."""

from __future__ import annotations

from typing import Any

MAX_SERIES = 20
# Tableau 20 (dark, then light); "other" is grey.
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#1f77b4", "#a0cbe8", "#ffbe7d", "#8cd17d", "#ff9d9a", "#86bcb6", "#f1ce63",
           "#d4a6c8", "#fabfd2", "#d7b5a6", "#79706e"]
OTHER = "#bab0ac"
DIGITS = 5  # significant digits of a share in the page's data


def series_names(rows: list[dict[str, Any]]) -> dict[str, str]:
    """dataset -> the series it is drawn in: itself, or "other (N datasets)" past MAX_SERIES."""
    if len(rows) <= MAX_SERIES:
        return {r["dataset"]: r["dataset"] for r in rows}
    by_weight = sorted(rows, key=lambda r: -r["weight"])
    other = f"other ({len(rows) - MAX_SERIES + 1} datasets)"
    keep = {r["dataset"] for r in by_weight[:MAX_SERIES - 1]}
    return {r["dataset"]: r["dataset"] if r["dataset"] in keep else other for r in rows}


def series_colors(splits: dict[str, dict[str, Any]]) -> dict[str, str]:
    """A colour per series name of the page, in order of first appearance."""
    colors: dict[str, str] = {}
    for s in splits.values():
        for name in dict.fromkeys(series_names(s["datasets"]).values()):
            if name not in colors:
                own = [n for n in colors if not _is_other(n)]
                colors[name] = OTHER if _is_other(name) else PALETTE[len(own) % len(PALETTE)]
    return colors


def _is_other(name: str) -> bool:
    return name.startswith("other (")


def _share(v: float) -> float:
    return float(f"{v:.{DIGITS}g}")


def _by_series(rows: list[dict[str, Any]], series: dict[str, str], values) -> dict[str, list[float]]:
    """values(row) summed element by element over the datasets of each series."""
    out: dict[str, list[float]] = {}
    for r in rows:
        v, acc = values(r), out.setdefault(series[r["dataset"]], [])
        acc.extend([0] * (len(v) - len(acc)))
        for k, x in enumerate(v):
            acc[k] += x
    return out


def _shares_of(counts: list[int], rows: list[dict[str, Any]], series: dict[str, str], order: list[str]) -> list:
    """Counts per dataset -> each series' share of their total, in `order`."""
    total = max(sum(counts), 1)
    per = dict.fromkeys(order, 0.0)
    for r, c in zip(rows, counts):
        per[series[r["dataset"]]] += c / total
    return [_share(v) for v in per.values()]


def split_charts(split: str, s: dict[str, Any], colors: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The charts of one split (figures of mmfs.tools.report.command._split), by kind."""
    rows = s["datasets"]
    series = series_names(rows)
    order = list(dict.fromkeys(series.values()))
    base = {"series": order, "colors": [colors[n] for n in order]}
    charts: dict[str, dict[str, Any]] = {}

    summed = {key: _by_series(rows, series, lambda r, key=key: [r[key]]) for key in ("weight", "share")}
    charts["blend"] = {**base, "kind": "hbars", "title": f"{split}: weight and realised share of each dataset",
                       "groups": ["weight", "realised share"],
                       "values": [[_share(summed["weight"][n][0]), _share(summed["share"][n][0])] for n in order],
                       "x": {"title": "share of samples", "format": "share"}}

    by_iteration = s["run"]["axis"] == "iteration"
    first, unit = ("first_iteration", "iteration") if by_iteration else ("first_sample", "sample")
    windows = s["mix"]["windows"]
    ends = [w["last_iteration"] + 1 for w in windows] if by_iteration else [w["end_sample"] for w in windows]
    bands = [{"x": b[first], "label": b["label"], "kind": b["kind"]} for b in s["mix"]["bands"] if first in b]
    charts["mix"] = {**base, "kind": "stacked", "title": f"{split}: the mix over the run, per window of {unit}s",
                     "windows": [[w[first], e] for w, e in zip(windows, ends)],
                     "values": [_shares_of(c, rows, series, order) for c in s["mix"]["counts"]], "bands": bands,
                     "x": {"title": unit, "format": "count"}, "y": {"title": "share of the window", "format": "share"}}

    edges = max((r["lengths"]["edges"] for r in rows), key=len)
    hists = _by_series(rows, series, lambda r: r["lengths"]["histogram"])
    charts["lengths"] = {**base, "kind": "lines", "title": f"{split}: document lengths",
                         "points": [[[e, _share(c / max(sum(hists[n]), 1))] for e, c in zip(edges, hists[n]) if c]
                                    for n in order],
                         "x": {"title": "document length (tokens, bins of a factor √2)", "format": "count",
                               "log": True},
                         "y": {"title": "share of documents", "format": "share"}}

    cuts = _by_series(rows, series, lambda r: r["documents_per_sample"])
    most = max((len(v) for v in cuts.values()), default=1)
    charts["cuts"] = {**base, "kind": "bars", "title": f"{split}: documents in a sample",
                      "categories": list(range(1, max(most, 2))),
                      "values": [[_share(cuts[n][k] / max(sum(cuts[n]), 1)) if k < len(cuts[n]) else 0.0
                                  for n in order] for k in range(1, max(most, 2))],
                      "x": {"title": "documents in a sample", "format": "count"},
                      "y": {"title": "share of samples", "format": "share"}}

    ranks = s.get("ranks")
    if ranks and ranks.get("counts"):
        charts["ranks"] = {**base, "kind": "dots", "title": f"{split}: each rank's share of each dataset",
                           "categories": list(range(len(ranks["counts"]))),
                           "values": [_shares_of(c, rows, series, order) for c in ranks["counts"]],
                           "x": {"title": "data-parallel rank", "format": "count"},
                           "y": {"title": "share of the rank's samples", "format": "share"}}
    elif ranks:
        low, high = {}, {}
        for r, lo, hi in zip(rows, ranks["share_min"], ranks["share_max"]):
            n = series[r["dataset"]]
            low[n], high[n] = min(low.get(n, lo), lo), max(high.get(n, hi), hi)
        charts["ranks"] = {**base, "kind": "ranges",
                           "title": f"{split}: each dataset's share, lowest to highest over the ranks",
                           "values": [[_share(low[n]), _share(high[n])] for n in order],
                           "x": {"title": "share of a rank's samples", "format": "share"}}
    return charts
