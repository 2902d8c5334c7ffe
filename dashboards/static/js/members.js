// The target page's "Processes" table: a family target's members by role, with their share of the family's CPU,
// off-CPU and GC over the last 15 minutes (/api/members). A single-process target shows nothing here.
"use strict";

(() => {
  const section = document.getElementById("target");
  const box = document.getElementById("members");
  if (!section || !box) return;
  const target = section.dataset.target;

  function share(v) {
    return v === null || v === undefined ? "not measured" : (100 * v).toFixed(0) + " %";
  }

  async function load() {
    try {
      const data = await IS.getJSON("/api/members", {target, minutes: 15});
      if (!data.members.length) {
        IS.replace(box, IS.el("p", {class: "meta"}, "one process: this target is not a family"));
        return;
      }
      const head = IS.el("tr", {}, ["process", "pids", "CPU", "off-CPU", "GC pause", "RSS", "not measured"]
        .map((h) => IS.el("th", {}, h)));
      const rows = data.members.map((m) => IS.el("tr", {"data-role": m.role},
        IS.el("td", {}, m.role), IS.el("td", {}, (m.pids || []).join(" ")),
        IS.el("td", {}, share(m.cpu_share)), IS.el("td", {}, share(m.offcpu_share)),
        IS.el("td", {}, share(m.gc_pause_share)),
        IS.el("td", {}, m.rss_bytes === null ? "not measured" : (m.rss_bytes / 2 ** 20).toFixed(0) + " MiB"),
        IS.el("td", {}, (m.errors || []).join("; "))));
      IS.replace(box, IS.el("p", {class: "meta"}, "last 15 minutes, " + data.windows + " windows"),
        IS.el("table", {class: "members"}, head, rows));
    } catch (err) {
      IS.showError(box, err);
    }
  }
  load();
  setInterval(load, 30000);
})();
