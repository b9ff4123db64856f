// The script of mmfs report's page (inlined into it by page.py, after charts.js):
// draws the charts, fills the sample browser, and says when it is done in
// <body data-rendered> and #mmfs-status (what a headless browser waits for and reads).
// Every text of the figures goes in with textContent, never as markup.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("mmfs-data").textContent);

  function element(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function plural(n, noun) {
    return n.toLocaleString("en-US") + " " + noun + (n === 1 ? "" : "s");
  }

  // Characters that print nothing, or that would reorder the text around them (C0 and C1
  // controls but tab and newline, direction marks and overrides, zero widths, lone
  // surrogates): shown as their code point in a box, so the text reads as it is.
  const UNSEEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]/u;

  function showText(parent, text) {
    let run = "";
    for (const c of text) {  // by code point: a lone surrogate is one
      if (!UNSEEN.test(c)) { run += c; continue; }
      if (run) parent.appendChild(document.createTextNode(run));
      run = "";
      const code = c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
      const mark = element("span", "U+" + code, "ctl");
      mark.dataset.char = code;
      parent.appendChild(mark);
    }
    if (run) parent.appendChild(document.createTextNode(run));
  }

  // -- the sample browser: #iteration=I&rank=R in the address picks one ------------------------
  const browser = data.browser;
  const pickIteration = document.getElementById("iteration");
  const pickRank = document.getElementById("rank");

  function showSamples() {
    const it = browser.iterations.find(i => String(i.iteration) === pickIteration.value);
    const rank = it.ranks.find(r => String(r.rank) === pickRank.value) || it.ranks[0];
    const out = document.getElementById("samples");
    out.textContent = "";
    const samples = rank.microbatches.reduce((n, mb) => n + mb.samples.length, 0);
    out.appendChild(element("p", "iteration " + it.iteration + ": consumed_samples " + it.consumed_samples[0] +
      ".." + it.consumed_samples[1] + (it.phases ? ", phase " + it.phases.join(" and ") : "") + ", rank " +
      rank.rank + ": " + plural(samples, "sample"), "note"));
    const table = element("table", undefined, "samples");
    const head = element("tr", undefined, "head");
    const columns = ["micro-batch", "sample", "dataset", "sequence", "document", "tokens of the sample",
                     "tokens of the sequence"];
    columns.concat(browser.text ? ["text"] : []).forEach(h => head.appendChild(element("th", h)));
    table.appendChild(head);
    rank.microbatches.forEach(mb => mb.samples.forEach(s => s.pieces.forEach((p, k) => {
      const row = element("tr");
      row.dataset.sample = s.sample;
      row.dataset.piece = k;
      [k ? "" : mb.microbatch, k ? "" : s.sample, k ? "" : s.dataset, p.sequence, p.document,
       p.sample_tokens.join(".."), p.sequence_tokens.join("..")].forEach((v, c) => {
        const cell = element("td", String(v));
        cell.dataset.label = columns[c];  // its heading, where a narrow screen shows no header row
        row.appendChild(cell);
      });
      if (browser.text) {
        const cell = element("td", undefined, "text");
        const pre = element("pre", undefined, "text");
        pre.dir = "ltr";
        showText(pre, p.text);
        if (p.text_cut) pre.appendChild(element("span", " [...]", "cut"));
        cell.appendChild(pre);
        row.appendChild(cell);
      }
      table.appendChild(row);
    })));
    const box = element("div", undefined, "scroll");
    box.appendChild(table);
    out.appendChild(box);
  }

  if (pickIteration && browser.iterations.length) {
    browser.iterations.forEach(i => pickIteration.appendChild(new Option(String(i.iteration), String(i.iteration))));
    browser.iterations[0].ranks.forEach(r => pickRank.appendChild(new Option(String(r.rank), String(r.rank))));
    const wanted = new URLSearchParams(location.hash.slice(1));
    if (wanted.has("iteration")) pickIteration.value = wanted.get("iteration");
    if (wanted.has("rank")) pickRank.value = wanted.get("rank");
    if (!pickIteration.value) pickIteration.selectedIndex = 0;
    if (!pickRank.value) pickRank.selectedIndex = 0;
    pickIteration.addEventListener("change", showSamples);
    pickRank.addEventListener("change", showSamples);
    showSamples();
  }

  // -- the charts ------------------------------------------------------------------------------------
  const status = {charts: {}, errors: window.mmfsErrors};
  for (const [name, spec] of Object.entries(data.charts)) {
    try {
      status.charts[name] = mmfsCharts.draw(document.querySelector("[data-chart='" + name + "']"), spec);
    } catch (err) {
      window.mmfsErrors.push(name + ": " + err);
    }
  }
  // How far the page runs past the window's right edge (0: it fits). Measured now: the
  // page keeps room for a scroll bar (STYLE), so no box changes width after drawing.
  status.overflow = document.documentElement.scrollWidth - document.documentElement.clientWidth;
  status.window = document.documentElement.clientWidth;
  const pre = element("pre", JSON.stringify(status));
  pre.id = "mmfs-status";
  pre.hidden = true;
  document.body.appendChild(pre);
  document.body.dataset.rendered = "yes";
})();
