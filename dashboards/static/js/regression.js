// One regression: its causes and evidence, the functions that grew, the differential flame graph, exports.
"use strict";

(async () => {
  const {el, replace, fmtTime} = IS;
  const root = document.getElementById("regression");
  const detail = document.getElementById("regression-detail");
  let r;
  try {
    r = await IS.getJSON("/api/regressions/" + encodeURIComponent(root.dataset.id));
  } catch (err) {
    return IS.showError(detail, err);
  }
  document.getElementById("regression-title").textContent = "Regression on " + r.target;
  replace(detail,
    el("p", {}, el("span", {class: "pill severity-" + r.severity}, r.severity), " opened ",
      el("time", {datetime: r.opened_at}, fmtTime(r.opened_at)), r.closed_at ? [" · closed ",
        el("time", {datetime: r.closed_at}, fmtTime(r.closed_at))] : " · still open", " · " + r.open_seconds + " s",
      " · score " + IS.num(r.score, 2), " · pid " + r.pid),
    // It followed a change to what the target runs (docs/changes.md): the change's before/after on the target page.
    r.change_id ? el("p", {class: "change"}, "After change ", el("code", {}, r.change_id), ": ",
      el("a", {href: "/targets/" + encodeURIComponent(r.target)}, "its diff and before/after report")) : null,
    el("h3", {}, "Causes, most likely first"),
    el("ol", {class: "causes"}, (r.causes || []).map((c) => el("li", {}, el("b", {}, c.label), " (weight " + IS.num(c.score, 2) +
      "): ", c.evidence))),
    el("h3", {}, "Functions whose share grew"),
    (r.functions || []).length ? el("table", {id: "functions"},
      el("tr", {}, el("th", {}, "function"), el("th", {}, "baseline"), el("th", {}, "during")),
      r.functions.map((f) => el("tr", {}, el("td", {}, el("code", {}, f.function)),
        el("td", {}, (f.baseline_share * 100).toFixed(1) + "%"), el("td", {}, (f.current_share * 100).toFixed(1) + "%")))) :
      el("p", {class: "meta"}, "no function shift measured"));

  const link = new URL(r.flamegraph_url, location.origin);
  const q = Object.fromEntries(link.searchParams.entries());
  const base = {target: q.target, kind: q.kind || "active", from: q.from, to: q.to};
  const exports = [["folded", "/api/flamegraph", "folded"], ["SVG", "/api/flamegraph", "svg"],
    ["speedscope", "/api/flamegraph", "speedscope"], ["pprof", "/api/flamegraph", "pprof"],
    ["diff SVG", "/api/flamegraph/diff", "svg"], ["diff folded", "/api/flamegraph/diff", "folded"],
    ["diff JSON (movers)", "/api/flamegraph/diff", "json"]];
  replace(document.getElementById("export-links"), exports.map(([label, path, format]) => el("li", {},
    el("a", {href: IS.url(path, path.endsWith("diff") ? {...q, format} : {...base, format})}, label))),
    el("li", {}, el("a", {href: IS.url("/flamegraph", q)}, "open in the flame graph viewer")));
  await Flame.load(document.getElementById("flame"), q, document.getElementById("flame-meta"));
})();
