// A target's charts: uPlot over /api/series, one shared time axis (zoom one, zoom all), regressions shaded,
// refreshed live while not zoomed.
"use strict";

(() => {
  const {el, replace, num, fmtTime} = IS;
  const root = document.getElementById("target");
  const target = root.dataset.target;
  const REFRESH_MS = 1000 * Math.max(5, Number(root.dataset.interval || 5));
  const CHARTS = [
    {id: "latency", title: "Latency (ms)", series: [["p50_ms", "p50", "#1f77b4"], ["p95_ms", "p95", "#9467bd"],
      ["p99_ms", "p99", "#d62728"], ["p99_max_ms", "worst p99", "#ff9896"]], band: true},
    {id: "rate", title: "Requests per second", series: [["request_rate", "requests/s", "#2ca02c"]]},
    {id: "syscalls", title: "System calls per second", series: [["syscalls_per_s", "syscalls/s", "#8c564b"]]},
    {id: "offcpu", title: "Off-CPU (s/s, summed over threads)", series: [["offcpu_per_s", "off-CPU", "#7f7f7f"]]},
    {id: "gc", title: "GC", series: [["gc_pause_ms_per_s", "pause ms/s", "#e377c2"],
      ["gc_collections_per_s", "collections/s", "#bcbd22"]]},
    {id: "tcp", title: "TCP retransmits per second", series: [["tcp_retransmits_per_s", "retransmits/s", "#17becf"]]},
    {id: "runqueue", title: "Run-queue wait (ms/s)", series: [["runqueue_ms_per_s", "run-queue", "#ff7f0e"]]},
    {id: "cpu", title: "CPU (cores)", series: [["cpu_cores", "cores", "#1f77b4"]]},
    {id: "rss", title: "Resident memory (MiB)", series: [["rss_mb", "RSS MiB", "#9467bd"]]},
  ];
  // The page picks the range that holds the stored data (a fresh agent's minutes fill the charts); ?range= wins.
  let range = new URLSearchParams(location.search).get("range") || root.dataset.range || "1h";
  let charts = [];
  let regressions = [];
  let changes = [];
  let zoomed = false;
  let syncing = false;

  function shade(u) {
    const ctx = u.ctx;
    const {left, top, width, height} = u.bbox;
    ctx.save();
    ctx.fillStyle = "rgba(214, 39, 40, 0.12)";
    for (const r of regressions) {
      const x0 = Math.max(left, u.valToPos(r.opened_at, "x", true));
      const x1 = Math.min(left + width, u.valToPos(r.closed_at || Date.now() / 1000, "x", true));
      if (x1 > x0) ctx.fillRect(x0, top, x1 - x0, height);
    }
    // A change to what the target runs (docs/changes.md): a dashed line and a Δ; its diff is listed below the charts.
    ctx.strokeStyle = "#444";
    ctx.fillStyle = "#444";
    ctx.setLineDash([3, 3]);
    for (const c of changes) {
      const x = u.valToPos(c.at, "x", true);
      if (x < left || x > left + width) continue;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.fillText("Δ", x + 2, top + 10);
    }
    ctx.restore();
  }

  let kindChart = null;
  const KIND_COLORS = ["#d62728", "#8c564b", "#17becf", "#1f77b4", "#2ca02c", "#bcbd22", "#9467bd", "#ff7f0e", "#7f7f7f"];

  function syncZoom(u) {
    if (syncing) return;
    syncing = true;
    const {min, max} = u.scales.x;
    for (const other of [...charts, kindChart]) {
      if (other && other !== u) other.setScale("x", {min, max});
    }
    syncing = false;
  }

  // Off-CPU by wait kind comes from the stored kernel stacks (its own endpoint, up to 24 h).
  async function loadKinds() {
    let box = document.getElementById("chart-offcpu-kinds");
    if (!box) {
      box = el("div", {class: "chart", id: "chart-offcpu-kinds"});
      document.getElementById("charts").append(box);
    }
    if (kindChart) { kindChart.destroy(); kindChart = null; }
    try {
      const data = await IS.getJSON("/api/offcpu", {target, range, points: 60});
      const names = Object.keys(data.kinds);
      if (!names.length) return replace(box, el("p", {class: "meta"}, "no off-CPU kernel stacks in this range"));
      replace(box);
      kindChart = new uPlot({
        title: "Off-CPU by wait kind (s/s)", width: charts.length ? charts[0].width : 500, height: 220,
        series: [{}, ...names.map((n, i) => ({label: (data.labels || {})[n] || n, stroke: KIND_COLORS[i % KIND_COLORS.length],
                                               width: 1.5}))],
        cursor: {sync: {key: "infersight-" + target}, drag: {x: true, y: false}},
        scales: {x: {time: true}},
        hooks: {drawClear: [shade], setScale: [(u, key) => { if (key === "x") syncZoom(u); }],
                setSelect: [() => { zoomed = true; }]},
      }, [data.t, ...names.map((n) => data.kinds[n])], box);
      window.infersightKindChart = kindChart;
    } catch (err) {
      replace(box, el("p", {class: "meta"}, "Off-CPU by wait kind: " + err.message));
    }
  }

  function build(data) {
    const width = Math.max(320, Math.min(560, (document.getElementById("charts").clientWidth - 24) / 2));
    replace(document.getElementById("charts"));
    charts = CHARTS.map((spec) => {
      const box = el("div", {class: "chart", id: "chart-" + spec.id});
      document.getElementById("charts").append(box);
      const series = [{}];
      const columns = [data.t];
      for (const [key, label, color] of spec.series) {
        series.push({label, stroke: color, width: 1.5, spanGaps: false});
        columns.push(data.series[key]);
      }
      const bands = [];
      if (spec.band) {
        for (const [p, label] of [["p99", "expected p99"], ["p50", "expected p50"]]) {
          const v = (data.expected_ms || {})[p];
          series.push({label, stroke: "#555", dash: [6, 4], width: 1});
          columns.push(data.t.map(() => (v === undefined ? null : v)));
        }
        bands.push({series: [series.length - 2, series.length - 1], fill: "rgba(80, 80, 80, 0.08)"});
      }
      const opts = {
        title: spec.title, width, height: 220, series, bands,
        cursor: {sync: {key: "infersight-" + target}, drag: {x: true, y: false}},
        scales: {x: {time: true}},
        hooks: {
          drawClear: [shade],
          setScale: [(u, key) => { if (key === "x") syncZoom(u); }],
          setSelect: [() => { zoomed = true; }],
        },
      };
      return new uPlot(opts, columns, box);
    });
    window.infersightCharts = charts;
  }

  function update(data) {
    regressions = data.regressions;
    const points = data.t.length;
    document.getElementById("series-meta").textContent = points + " points, one per " +
      num(data.step, 0) + " s, " + fmtTime(data.from) + " → " + fmtTime(data.to);
    if (!charts.length) return build(data);
    CHARTS.forEach((spec, i) => {
      const columns = [data.t, ...spec.series.map(([key]) => data.series[key])];
      if (spec.band) {
        for (const p of ["p99", "p50"]) {
          const v = (data.expected_ms || {})[p];
          columns.push(data.t.map(() => (v === undefined ? null : v)));
        }
      }
      charts[i].setData(columns);
    });
  }

  function listRegressions() {
    const list = document.getElementById("target-regressions");
    replace(list, regressions.length ? regressions.map((r) => el("li", {},
      el("a", {href: "/regressions/" + encodeURIComponent(r.id)}, fmtTime(r.opened_at)), " → ",
      r.closed_at ? fmtTime(r.closed_at) : "open", " · " + r.severity + " · likely " + r.top_cause)) :
      el("li", {class: "meta"}, "none"));
  }

  // A change's before/after report (/api/changes/ID/report), shown under it on click.
  async function showReport(id, box) {
    replace(box, el("p", {class: "meta"}, "computing…"));
    try {
      const r = await IS.getJSON("/api/changes/" + encodeURIComponent(id) + "/report");
      const fmt = (v, unit) => (v === null ? "–" : unit === "s" ? num(v * 1000, 2) + " ms" :
        unit === "s/s" ? num(v * 1000, 2) + " ms/s" : num(v, 3) + " " + unit);
      replace(box, el("p", {}, "verdict: ", el("b", {}, r.verdict), r.reason ? " · " + r.reason : ""),
        el("table", {class: "change-report"}, el("tr", {}, ["figure", "before", "after", "after/before (95% CI)",
          "verdict"].map((h) => el("th", {}, h))),
          r.rows.map((x) => el("tr", {}, el("td", {}, x.figure), el("td", {}, fmt(x.before, x.unit)),
            el("td", {}, fmt(x.after, x.unit)),
            el("td", {}, x.ratio === null ? "–" : num(x.ratio, 3) + " (" + num(x.ratio_low, 3) + ".." +
              num(x.ratio_high, 3) + ")"),
            el("td", {}, x.verdict || "not judged: " + x.reason)))));
    } catch (err) {
      IS.showError(box, err);
    }
  }

  let listed = null;

  function listChanges() {
    const list = document.getElementById("target-changes");
    // Redrawn only when the changes in range differ: a refresh must not close a report someone opened.
    const key = changes.map((c) => c.id).join("\n");
    if (key === listed) return;
    listed = key;
    replace(list, changes.length ? changes.map((c) => {
      const box = el("div", {class: "change-report-box"});
      const button = el("button", {type: "button", class: "change-report-button"}, "before/after");
      button.addEventListener("click", () => showReport(c.id, box));
      return el("li", {"data-change": c.id, title: c.diff.map((d) => d.part + ": " + d.before + " → " +
        d.after).join("\n")}, fmtTime(c.at) + " · pid " + c.pid + " · ", button,
        el("ul", {}, c.diff.map((d) => el("li", {}, el("b", {}, d.part), ": " + d.before + " → " + d.after))), box);
    }) : el("li", {class: "meta"}, "none"));
  }

  async function loadChanges(data) {
    try {
      changes = (await IS.getJSON("/api/changes", {target, since: data.from, until: data.to, limit: 100})).changes;
    } catch (err) {
      changes = [];
    }
    listChanges();
  }

  async function load() {
    const started = performance.now();
    try {
      const data = await IS.getJSON("/api/series", {target, range, points: 600});
      await loadChanges(data);
      update(data);
      listRegressions();
      await loadKinds();
      root.dataset.renderMs = String(Math.round(performance.now() - started));
      root.dataset.loaded = range;
    } catch (err) {
      IS.showError(document.getElementById("charts"), err);
    }
  }

  for (const b of document.querySelectorAll("button.range")) {
    b.addEventListener("click", () => {
      range = b.dataset.range;
      zoomed = false;
      delete root.dataset.loaded;
      for (const c of charts) c.destroy();
      charts = [];
      replace(document.getElementById("charts"));
      load();
    });
  }
  document.getElementById("reset-zoom").addEventListener("click", () => {
    zoomed = false;
    load();
  });
  setInterval(() => { if (!zoomed) load(); }, REFRESH_MS);
  load();
})();
