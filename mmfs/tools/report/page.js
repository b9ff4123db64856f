// The script of mmfs report's page (inlined into it by page.py): draws the
// Vega-Lite charts, fills the sample browser, and says when it is done in
// <body data-rendered> and #mmfs-status (what a headless browser waits for).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("mmfs-data").textContent);

  function element(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
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
    out.appendChild(element("p", "iteration " + it.iteration + ": consumed_samples " + it.consumed_samples[0] +
      ".." + it.consumed_samples[1] + (it.phases ? ", phase " + it.phases.join(" and ") : "") + ", rank " + rank.rank,
      "note"));
    const table = element("table", undefined, "samples");
    const head = element("tr");
    ["micro-batch", "sample", "dataset", "sequence", "document", "tokens of the sample", "tokens of the sequence",
     browser.text ? "text" : ""].forEach(h => head.appendChild(element("th", h)));
    table.appendChild(head);
    rank.microbatches.forEach(mb => mb.samples.forEach(s => s.pieces.forEach((p, k) => {
      const row = element("tr");
      row.dataset.sample = s.sample;
      row.dataset.piece = k;
      [k ? "" : mb.microbatch, k ? "" : s.sample, k ? "" : s.dataset, p.sequence, p.document,
       p.sample_tokens.join(".."), p.sequence_tokens.join("..")].forEach(v => row.appendChild(element("td", String(v))));
      if (browser.text) {
        const cell = element("td");
        cell.appendChild(element("pre", p.text + (p.text_cut ? " [...]" : ""), "text"));
        row.appendChild(cell);
      }
      table.appendChild(row);
    })));
    out.appendChild(table);
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
  const drawn = Object.entries(data.charts).map(([name, spec]) => {
    const target = document.querySelector("[data-chart='" + name + "']");
    return vegaEmbed(target, spec, {renderer: "svg", actions: false}).then(result => {
      const legend = target.querySelectorAll(".role-legend-label text");
      const labels = target.querySelectorAll(".mark-text.role-mark text");  // text marks: the mix chart's bands
      status.charts[name] = {series: Array.from(legend, t => t.textContent),
                             labels: Array.from(labels, t => t.textContent)};
      return result;
    }).catch(err => { window.mmfsErrors.push(name + ": " + err); });
  });
  Promise.all(drawn).then(() => {
    const pre = element("pre", JSON.stringify(status));
    pre.id = "mmfs-status";
    pre.hidden = true;
    document.body.appendChild(pre);
    document.body.dataset.rendered = "yes";
  });
})();
