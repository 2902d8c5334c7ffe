// The flame graph viewer: any target, stack kind and range, optionally as a diff against an earlier span.
"use strict";

(async () => {
  const {el, replace} = IS;
  const form = document.getElementById("flame-form");
  const container = document.getElementById("flame");
  const params = new URLSearchParams(location.search);

  function exportsFor(q) {
    const box = document.getElementById("flame-exports");
    const base = {target: q.target, kind: q.kind, from: q.from, to: q.to};
    const links = ["folded", "svg", "speedscope", "pprof"].map((f) =>
      el("a", {href: IS.url("/api/flamegraph", {...base, format: f})}, f));
    if (q.baseline_from) {
      for (const f of ["svg", "folded", "json"]) {
        links.push(el("a", {href: IS.url("/api/flamegraph/diff", {...base, baseline_from: q.baseline_from,
          baseline_to: q.baseline_to, format: f})}, "diff " + f));
      }
    }
    replace(box, "exports: ", links.map((a, i) => [a, i < links.length - 1 ? " · " : ""]));
  }

  function query() {
    const minutes = Number(form.minutes.value);
    const now = Date.now() / 1000;
    const q = {target: form.target.value, kind: form.kind.value, from: Math.floor(now - minutes * 60),
               to: Math.ceil(now)};
    if (form.diff.checked) {
      const ago = Number(form.ago.value) * 60;
      q.baseline_from = q.from - ago;
      q.baseline_to = q.to - ago;
    }
    return q;
  }

  async function draw(q) {
    exportsFor(q);
    await Flame.load(container, q, document.getElementById("flame-meta"));
  }

  try {
    const targets = await IS.getJSON("/api/targets");
    replace(form.target, targets.map((t) => el("option", {value: t.name}, t.name)));
    if (!targets.length) return replace(container, el("p", {class: "meta"}, "no profiles stored yet"));
  } catch (err) {
    return IS.showError(container, err);
  }
  for (const key of ["target", "kind", "minutes"]) {
    if (params.get(key)) form[key].value = params.get(key);
  }
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    draw(query());
  });
  // Links from other pages may name an exact range (from/to, and a baseline for a diff).
  const q = query();
  for (const key of ["from", "to", "baseline_from", "baseline_to"]) {
    if (params.get(key)) q[key] = params.get(key);
  }
  if (params.get("baseline_from")) form.diff.checked = true;
  draw(q);
})();
