// The overview, live: polls /api/overview and redraws the regression banner, the target cards and the
// sources table without a reload.
"use strict";

(() => {
  const {el, replace, num, fmtTime} = IS;
  const section = document.getElementById("overview");
  const every = 1000 * Number(section.dataset.interval || 5);

  function band(value, expected) {
    if (expected === undefined || expected === null) return el("span", {class: "meta"}, " (no expected band yet)");
    const over = value !== null && value !== undefined && value > expected;
    return el("span", {class: over ? "over-band" : "in-band"}, " (expected " + num(expected, 1) + ")");
  }

  function sparkline(spark) {
    const width = 240, height = 40;
    const svg = d3.create("svg").attr("class", "sparkline").attr("width", width).attr("height", height)
      .attr("viewBox", "0 0 " + width + " " + height);
    if (!spark || !spark.t.length) return svg.node();
    const pts = spark.t.map((t, i) => [t, spark.p99_ms[i]]);
    const x = d3.scaleLinear().domain(d3.extent(spark.t)).range([2, width - 2]);
    const y = d3.scaleLinear().domain([0, d3.max(pts, (p) => p[1]) || 1]).range([height - 2, 2]);
    const line = d3.line().defined((p) => p[1] !== null).x((p) => x(p[0])).y((p) => y(p[1]));
    svg.append("path").attr("class", "spark-p99").attr("d", line(pts));
    svg.append("title").text("p99 latency over the last hour (ms)");
    return svg.node();
  }

  function card(t) {
    const exp = t.expected_ms || {};
    const slug = t.status.replace(/[^a-z]+/g, "-");
    return el("article", {class: "card status-" + slug, "data-target": t.name},
      el("h3", {}, el("a", {href: "/targets/" + encodeURIComponent(t.name)}, t.name), " ",
        el("span", {class: "pill status-" + slug}, t.status)),
      el("p", {}, "p50 ", el("b", {}, num(t.p50_ms, 1)), " ms", band(t.p50_ms, exp.p50),
        " · p99 ", el("b", {class: "p99"}, num(t.p99_ms, 1)), " ms", band(t.p99_ms, exp.p99)),
      el("p", {}, num(t.request_rate, 2), " requests/s · pid ", t.pid === null ? "–" : String(t.pid),
        t.members ? " · " + t.members + " processes" : "", t.detail ? " · " + t.detail : ""),
      sparkline(t.sparkline),
      Object.keys(t.errors || {}).length ? el("ul", {class: "errors"},
        Object.entries(t.errors).map(([src, err]) => el("li", {}, src + ": " + err))) : null,
      (t.problems || []).length ? el("ul", {class: "errors problems"},
        t.problems.map((p) => el("li", {}, p))) : null,
      el("p", {class: "links"}, el("a", {href: "/targets/" + encodeURIComponent(t.name)}, "charts"), " · ",
        el("a", {href: IS.url("/flamegraph", {target: t.name})}, "flame graph")));
  }

  function sourceRow(s) {
    return el("tr", {class: "state-" + s.state}, el("td", {}, s.source), el("td", {}, s.state),
      el("td", {}, s.reason || ""), el("td", {}, s.lost_events ?? ""), el("td", {}, s.failed_stacks ?? ""),
      el("td", {}, s.error_count ?? ""));
  }

  function render(data) {
    const banners = document.getElementById("regressions");
    replace(banners, data.regressions.length ? data.regressions.map(IS.banner) : IS.noRegression(data.detector));
    const cards = document.getElementById("target-cards");
    replace(cards, data.targets.length ? data.targets.map(card) : el("p", {}, "no target found yet"));
    const table = document.getElementById("sources");
    if (table) {
      const head = table.querySelector("tr");
      replace(table.tBodies[0] || table, head, data.sources.map(sourceRow));
    }
    document.getElementById("overview-updated").textContent = "updated " + fmtTime(data.now);
    document.getElementById("agent-meta").textContent = "up " + data.uptime_seconds + " s · " +
      data.windows_written + " windows · " + data.late_ticks + " late ticks · " + data.dropped_windows + " dropped";
  }

  async function poll() {
    try {
      render(await IS.getJSON("/api/overview"));
    } catch (err) {
      document.getElementById("overview-updated").textContent = "update failed: " + err.message;
    }
    setTimeout(poll, every);
  }

  poll();
})();
