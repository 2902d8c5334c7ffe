// The regression list: every stored episode, newest first, from /api/regressions.
"use strict";

(() => {
  const {el, replace, fmtTime} = IS;
  const table = document.getElementById("regression-list");
  const openOnly = document.getElementById("open-only");

  async function load() {
    const head = table.querySelector("tr");
    try {
      const found = await IS.getJSON("/api/regressions", {limit: 200, open: openOnly.checked ? 1 : null});
      replace(table.tBodies[0] || table, head, found.length ? found.map((r) => el("tr", {class: r.closed_at ? "closed" : "open"},
        el("td", {}, el("a", {href: "/regressions/" + encodeURIComponent(r.id)}, fmtTime(r.opened_at))),
        el("td", {}, r.closed_at ? fmtTime(r.closed_at) : "open"), el("td", {}, r.target),
        el("td", {}, r.severity), el("td", {}, r.top_cause), el("td", {}, r.open_seconds + " s"))) :
        el("tr", {}, el("td", {colspan: 6}, "no regression stored")));
    } catch (err) {
      replace(table.tBodies[0] || table, head, el("tr", {}, el("td", {colspan: 6, class: "errors"}, err.message)));
    }
  }

  openOnly.addEventListener("change", load);
  load();
  setInterval(load, 10000);
})();
