// The charts of mmfs report's page, drawn as SVG from the data charts.py writes (no
// library; inlined into the page by page.py before page.js). A chart is a title, a
// legend in HTML (it wraps on a narrow screen) and an SVG exactly as wide as its box,
// drawn again when the box's width changes. Every text goes in as textContent.
// Kinds: hbars (a pair of bars per series), stacked (a stacked bar per window, with
// bands), lines (over a log or linear x), bars (a group of bars per category), dots
// (a dot per category and series), ranges (a low..high bar per series).
const mmfsCharts = (function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const CHAR = 6.4;  // px: about the width of a character of the 11px axis font
  const PLOT_HEIGHT = 200;

  function svg(tag, attrs, parent, text) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function html(tag, cls, parent, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function tip(mark, text) {
    svg("title", {}, mark, text);
    return mark;
  }

  // -- scales and ticks ---------------------------------------------------------------------------

  // Ticks at 1, 2 or 5 times a power of ten, about `count` of them over [lo, hi];
  // whole numbers only where `whole` (counts: never a tick at 1.5 documents).
  function ticks(lo, hi, count, whole) {
    if (!(hi > lo)) return [lo];
    let step = Math.pow(10, Math.floor(Math.log10((hi - lo) / Math.max(count, 1))));
    for (const m of [1, 2, 5, 10]) {
      if ((hi - lo) / (step * m) <= count) { step *= m; break; }
    }
    if (whole) step = Math.max(1, Math.round(step));
    const out = [];
    for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) out.push(+(k * step).toPrecision(12));
    return out;
  }

  // [0, a tick at or above max]: the ticks of a share or count axis from zero.
  function fromZero(max, count, whole) {
    const t = ticks(0, max > 0 ? max : 1, count, whole);
    const step = t.length > 1 ? t[1] - t[0] : t[0] || 1;
    while (t[t.length - 1] < max) t.push(+(t[t.length - 1] + step).toPrecision(12));
    return t;
  }

  function linear(d0, d1, r0, r1) {
    const k = (r1 - r0) / ((d1 - d0) || 1);
    return v => r0 + (v - d0) * k;
  }

  function formatter(axis, step) {
    if (axis.format === "share") {
      const digits = Math.max(0, Math.ceil(-Math.log10(step * 100) - 1e-9));
      return v => (v * 100).toFixed(digits) + "%";
    }
    if (axis.log) return short;
    return v => v.toLocaleString("en-US");
  }

  function short(v) {
    for (const [unit, size] of [["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
      if (v >= size) return (v / size).toLocaleString("en-US", {maximumFractionDigits: 1}) + unit;
    }
    return v.toLocaleString("en-US");
  }

  function shareText(v) {
    return (v * 100).toLocaleString("en-US", {maximumFractionDigits: 2}) + "%";
  }

  // A label cut to `chars` characters (the whole of it in the mark's tooltip).
  function cut(text, chars) {
    return text.length <= chars ? text : text.slice(0, Math.max(1, chars - 1)) + "\u2026";
  }

  // Names that do not fit in `chars`: what they share at the start and the end left out
  // ("…01…" of "crawl-2024-01-english", "crawl-2024-02-english"), then cut.
  function shortNames(names, chars) {
    if (names.every(n => n.length <= chars)) return names;
    const own = names.filter(n => !n.startsWith("other ("));
    const first = own.reduce((a, b) => (a.length < b.length ? a : b), own[0] || "");
    let lead = 0, tail = 0;
    if (own.length > 1) {
      while (lead < first.length && own.every(n => n[lead] === first[lead])) lead++;
      while (tail < first.length - lead && own.every(n => n[n.length - 1 - tail] === first[first.length - 1 - tail])) {
        tail++;
      }
    }
    return names.map(n => {
      if (n.length <= chars || !own.includes(n) || lead + tail < 2) return cut(n, chars);
      return cut((lead ? "\u2026" : "") + n.slice(lead, n.length - tail) + (tail ? "\u2026" : ""), chars);
    });
  }

  // -- the frame of a chart: y axis on the left, x axis below --------------------------------------

  // A vertical chart: the y ticks (from zero) and the plot area; the caller draws the x axis.
  function frame(root, spec, width, yMax, above) {
    const yTicks = fromZero(yMax, 5, spec.y.format === "count");
    const yFormat = formatter(spec.y, yTicks.length > 1 ? yTicks[1] - yTicks[0] : 1);
    const left = 8 + CHAR * Math.max(...yTicks.map(t => yFormat(t).length));
    const top = 18 + above;
    const box = {left: left, top: top, width: Math.max(40, width - left - 10), height: PLOT_HEIGHT};
    const y = linear(0, yTicks[yTicks.length - 1], top + box.height, top);
    svg("text", {x: 0, y: 11, class: "axis-title"}, root, spec.y.title);
    for (const t of yTicks) {
      svg("line", {x1: left, x2: left + box.width, y1: y(t), y2: y(t), class: "grid"}, root);
      svg("text", {x: left - 4, y: y(t) + 4, "text-anchor": "end"}, root, yFormat(t));
    }
    svg("line", {x1: left, x2: left + box.width, y1: y(0), y2: y(0), class: "axis"}, root);
    box.y = y;
    return box;
  }

  function xTitle(root, box, title) {
    svg("text", {x: box.left + box.width / 2, y: box.top + box.height + 32, "text-anchor": "middle",
                 class: "axis-title"}, root, title);
  }

  // Tick labels under a linear (or log) x axis, none closer than their own width, none
  // past the chart's edges.
  function xTicksLinear(root, box, x, values, format) {
    let end = -Infinity;
    const right = box.left + box.width + 10;
    for (const v of values) {
      const text = format(v), at = x(v), half = text.length * CHAR / 2;
      const centre = Math.min(Math.max(at, half), right - half);
      if (centre - half < end + 6) continue;
      end = centre + half;
      svg("line", {x1: at, x2: at, y1: box.top + box.height, y2: box.top + box.height + 4, class: "axis"}, root);
      svg("text", {x: centre, y: box.top + box.height + 15, "text-anchor": "middle"}, root, text);
    }
  }

  // Labels of categories (one every k-th where they would crowd), centred on their band.
  function xTicksBands(root, box, categories, band, format) {
    const widest = Math.max(...categories.map(c => format(c).length)) * CHAR + 6;
    const every = Math.max(1, Math.ceil(widest / band));
    categories.forEach((c, i) => {
      if (i % every) return;
      svg("text", {x: box.left + band * (i + 0.5), y: box.top + box.height + 15, "text-anchor": "middle"}, root,
          format(c));
    });
  }

  // -- the kinds ------------------------------------------------------------------------------------

  function hbars(root, spec, width) {
    return horizontal(root, spec, width, 2, (g, row, x, top, rowHeight) => {
      const bar = (rowHeight - 4) / 2;
      spec.groups.forEach((group, k) => {
        const v = spec.values[row][k];
        tip(svg("rect", {x: x(0), y: top + 2 + k * bar, width: Math.max(0, x(v) - x(0)), height: bar - 1,
                         fill: spec.colors[row], "fill-opacity": k === 0 ? 0.45 : 1}, g),
            spec.series[row] + ": " + group + " " + shareText(v));
      });
      return spec.groups.length;
    });
  }

  function ranges(root, spec, width) {
    return horizontal(root, spec, width, 1, (g, row, x, top, rowHeight) => {
      const [lo, hi] = spec.values[row];
      tip(svg("rect", {x: x(lo) - 1, y: top + 3, width: Math.max(2, x(hi) - x(lo) + 2), height: rowHeight - 6,
                       fill: spec.colors[row]}, g),
          spec.series[row] + ": " + shareText(lo) + " to " + shareText(hi));
      return 1;
    });
  }

  // A row per series with its name on the left, x a share from zero.
  function horizontal(root, spec, width, perRow, drawRow) {
    const rowHeight = perRow === 2 ? 22 : 16;
    const labels = shortNames(spec.series, Math.floor(width * 0.35 / CHAR));
    const left = 8 + CHAR * Math.max(...labels.map(s => s.length));
    const max = Math.max(...spec.values.map(v => Math.max(...v)));
    const xTicks = fromZero(max, Math.max(2, Math.floor((width - left) / 70)), false);
    const format = formatter(spec.x, xTicks.length > 1 ? xTicks[1] - xTicks[0] : 1);
    const box = {left: left, top: 4, width: Math.max(40, width - left - 16), height: rowHeight * spec.series.length};
    const x = linear(0, xTicks[xTicks.length - 1], left, left + box.width);
    for (const t of xTicks) svg("line", {x1: x(t), x2: x(t), y1: box.top, y2: box.top + box.height, class: "grid"}, root);
    let marks = 0;
    spec.series.forEach((name, row) => {
      const top = box.top + row * rowHeight;
      tip(svg("text", {x: left - 4, y: top + rowHeight / 2 + 4, "text-anchor": "end"}, root, labels[row]), name);
      marks += drawRow(root, row, x, top, rowHeight);
    });
    svg("line", {x1: left, x2: left, y1: box.top, y2: box.top + box.height, class: "axis"}, root);
    xTicksLinear(root, box, x, xTicks, format);
    xTitle(root, box, spec.x.title);
    return {marks: marks, height: box.top + box.height + 40};
  }

  function stacked(root, spec, width) {
    const rows = placeBands(spec.bands || [], width);
    const box = frame(root, spec, width, 1, rows.count * 14);
    const lo = spec.windows[0][0], hi = spec.windows[spec.windows.length - 1][1];
    const x = linear(lo, hi, box.left, box.left + box.width);
    const gap = box.width / spec.windows.length > 4 ? 1 : 0;
    let marks = 0;
    spec.windows.forEach(([a, b], w) => {
      let base = 0;
      spec.values[w].forEach((v, k) => {
        if (v <= 0) return;
        tip(svg("rect", {x: x(a), y: box.y(base + v), width: Math.max(0.5, x(b) - x(a) - gap),
                         height: Math.max(0, box.y(base) - box.y(base + v)), fill: spec.colors[k]}, root),
            spec.series[k] + ": " + shareText(v) + " of " + spec.x.title + "s " + a.toLocaleString("en-US") +
            "\u2013" + (b - 1).toLocaleString("en-US"));
        base += v;
        marks++;
      });
    });
    const labels = [];
    rows.placed.forEach(({band, row}) => {
      const at = x(band.x);
      const rule = svg("line", {x1: at, x2: at, y1: 18 + row * 14, y2: box.top + box.height, stroke: "#111",
                                "stroke-width": band.kind === "phase" ? 2 : 1,
                                "stroke-dasharray": band.kind === "phase" ? "" : "4 3"}, root);
      tip(rule, band.label);
      const flip = at + 3 + band.label.length * CHAR > width;  // the label left of its rule at the right edge
      svg("text", {x: flip ? at - 3 : at + 3, y: 28 + row * 14, "text-anchor": flip ? "end" : "start"}, root,
          band.label);
      labels.push(band.label);
    });
    xTicksLinear(root, box, x, ticks(lo, hi, Math.max(2, Math.floor(box.width / 70)), true), formatter(spec.x));
    xTitle(root, box, spec.x.title);
    return {marks: marks, labels: labels, height: box.top + box.height + 40};

    // Each band's label in the first row where it does not run into the one before.
    function placeBands(bands, width) {
      const lo = spec.windows[0][0], hi = spec.windows[spec.windows.length - 1][1];
      const ends = [], placed = [];
      const at = linear(lo, hi, 0, width);
      bands.slice().sort((a, b) => a.x - b.x).forEach(band => {
        const start = at(band.x);
        let row = ends.findIndex(end => end < start);
        if (row < 0) { row = ends.length; ends.push(0); }
        ends[row] = start + band.label.length * CHAR + 10;
        placed.push({band: band, row: row});
      });
      return {count: ends.length, placed: placed};
    }
  }

  function lines(root, spec, width) {
    const all = spec.points.flat();
    const max = Math.max(...all.map(p => p[1]), 0);
    const box = frame(root, spec, width, max, 0);
    let lo = Math.min(...all.map(p => p[0]), Infinity), hi = Math.max(...all.map(p => p[0]), 0);
    if (!all.length) { lo = 1; hi = 10; }
    if (!(hi > lo)) { lo = lo / 2; hi = hi * 2 || 1; }
    const log = spec.x.log, f = log ? Math.log10 : (v => v);
    const scale = linear(f(lo), f(hi), box.left, box.left + box.width);
    const x = v => scale(f(v));
    let marks = 0;
    spec.points.forEach((points, k) => {
      if (!points.length) return;
      const d = points.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + "," + box.y(p[1]).toFixed(1)).join("");
      svg("path", {d: d, fill: "none", stroke: spec.colors[k], "stroke-width": 1.5}, root);
      for (const p of points) {
        tip(svg("circle", {cx: x(p[0]), cy: box.y(p[1]), r: 2.5, fill: spec.colors[k]}, root),
            spec.series[k] + ": " + shareText(p[1]) + " of documents near " + p[0].toLocaleString("en-US") +
            " tokens");
      }
      marks++;
    });
    const values = log ? powersOfTen(lo, hi) : ticks(lo, hi, Math.max(2, Math.floor(box.width / 70)), true);
    xTicksLinear(root, box, x, values, formatter(spec.x));
    xTitle(root, box, spec.x.title);
    return {marks: marks, height: box.top + box.height + 40};
  }

  function powersOfTen(lo, hi) {
    const out = [];
    for (let p = Math.ceil(Math.log10(lo) - 1e-9); Math.pow(10, p) <= hi * (1 + 1e-9); p++) out.push(Math.pow(10, p));
    return out.length ? out : [lo, hi];
  }

  // A group of bars (or of dots) per category, a bar (a dot) per series.
  function grouped(root, spec, width, dots) {
    const max = Math.max(...spec.values.map(v => Math.max(...v)), 0);
    const box = frame(root, spec, width, max, 0);
    const band = box.width / spec.categories.length;
    const inner = dots ? 0 : Math.max(0.5, (band * 0.85) / spec.series.length);
    let marks = 0;
    spec.categories.forEach((c, i) => {
      spec.values[i].forEach((v, k) => {
        const name = spec.series[k] + ": " + shareText(v) + " at " + spec.x.title + " " + c.toLocaleString("en-US");
        if (dots) {
          const r = Math.max(1.5, Math.min(4, band / 3));
          tip(svg("circle", {cx: box.left + band * (i + 0.5), cy: box.y(v), r: r, fill: spec.colors[k]}, root), name);
        } else {
          if (v <= 0) return;
          tip(svg("rect", {x: box.left + band * i + band * 0.075 + inner * k, y: box.y(v), width: inner,
                           height: Math.max(0, box.y(0) - box.y(v)), fill: spec.colors[k]}, root), name);
        }
        marks++;
      });
    });
    xTicksBands(root, box, spec.categories, band, formatter(spec.x));
    xTitle(root, box, spec.x.title);
    return {marks: marks, height: box.top + box.height + 40};
  }

  const KINDS = {
    hbars: hbars, ranges: ranges, stacked: stacked, lines: lines,
    bars: (root, spec, width) => grouped(root, spec, width, false),
    dots: (root, spec, width) => grouped(root, spec, width, true),
  };

  // Draw `spec` into `container`; what was drawn ({series, labels, marks, width}),
  // kept up to date when the box's width changes.
  function draw(container, spec) {
    container.textContent = "";
    html("div", "chart-title", container, spec.title);
    const legend = html("div", "legend", container);
    spec.series.forEach((name, k) => {
      const key = html("span", "key", legend);
      html("i", "", key).style.background = spec.colors[k];
      key.appendChild(document.createTextNode(name));
    });
    (spec.groups || []).forEach((group, k) => {
      const key = html("span", "key group", legend);
      const swatch = html("i", "", key);
      swatch.style.background = "#555";
      swatch.style.opacity = k === 0 ? 0.45 : 1;
      key.appendChild(document.createTextNode(group));
    });
    const plot = html("div", "plot", container);
    const drawn = {series: spec.series.slice(), labels: [], marks: 0, width: 0};
    function render() {
      const width = Math.floor(plot.clientWidth);
      if (width <= 0 || width === drawn.width) return;
      plot.textContent = "";
      const root = svg("svg", {width: width, height: 10, role: "img"}, plot);
      svg("title", {}, root, spec.title);
      const result = KINDS[spec.kind](root, spec, width);
      root.setAttribute("height", Math.ceil(result.height));
      Object.assign(drawn, {labels: result.labels || [], marks: result.marks, width: width});
    }
    render();
    if (window.ResizeObserver) new ResizeObserver(render).observe(plot);
    return drawn;
  }

  return {draw: draw, ticks: ticks};
})();
