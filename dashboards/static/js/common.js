// Shared helpers for every page. Untrusted strings (target names, command lines, frame names, error
// texts) only ever become text nodes or URL-encoded query values: nothing here writes HTML.
"use strict";

const IS = (() => {
  const SAFE_ATTRS = new Set(["class", "id", "title", "datetime", "colspan", "type", "value", "name",
                              "for", "placeholder", "role", "aria-label"]);

  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "href") node.setAttribute("href", safeHref(v));
      else if (SAFE_ATTRS.has(k) || k.startsWith("data-")) node.setAttribute(k, String(v));
      else throw new Error("attribute not allowed: " + k);
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return node;
  }

  // Only same-origin paths: a javascript: or data: URL from any source can never become a link.
  function safeHref(v) {
    const s = String(v);
    return s.startsWith("/") && !s.startsWith("//") ? s : "#";
  }

  function url(path, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
    }
    const s = q.toString();
    return s ? path + "?" + s : path;
  }

  // A slow endpoint with no free slot answers 429 at once (dashboards/limits.py): ask again, a few times,
  // after the Retry-After it names.
  async function getJSON(path, params, retries = 3) {
    const resp = await fetch(url(path, params), {headers: {Accept: "application/json"}});
    if (resp.status === 429 && retries > 0) {
      const wait = Math.min(Number(resp.headers.get("Retry-After")) || 2, 10);
      await new Promise((done) => setTimeout(done, wait * 1000));
      return getJSON(path, params, retries - 1);
    }
    const body = await resp.json().catch(() => ({error: "the answer was not JSON (HTTP " + resp.status + ")"}));
    if (!resp.ok) throw new Error(body.error || ("HTTP " + resp.status));
    return body;
  }

  function two(n) { return String(n).padStart(2, "0"); }

  function fmtTime(ts) {
    if (ts === null || ts === undefined) return "–";
    const d = new Date(ts * 1000);
    return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " +
      two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  function num(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    return Number(v).toFixed(digits === undefined ? 1 : digits).replace(/\.0+$/, "");
  }

  function replace(container, ...kids) {
    container.replaceChildren(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined));
  }

  function showError(container, err) {
    replace(container, el("p", {class: "errors"}, String(err && err.message ? err.message : err)));
  }

  // The regression banner: the same words as the server-rendered one in status.html.
  function banner(r) {
    const causes = el("ol", {class: "causes"},
      (r.causes || []).map((c) => el("li", {}, el("b", {}, c.label), ": ", c.evidence)));
    const fns = (r.functions || []).slice(0, 5);
    const grew = fns.length ? el("p", {}, "functions that grew: ", fns.map((f, i) => [
      el("code", {}, f.function), " (" + (f.baseline_share * 100).toFixed(0) + "% → " +
      (f.current_share * 100).toFixed(0) + "%)", i < fns.length - 1 ? ", " : ""])) : null;
    if (r.top_cause === "down") {
      return el("div", {class: "banner severity-" + r.severity + " down", "data-regression": r.id},
        el("strong", {}, r.target + " is down"), " since ", el("time", {datetime: r.opened_at}, fmtTime(r.opened_at)),
        ", " + r.open_seconds + " s: " + ((r.causes[0] || {}).evidence || "its process ended") + ".",
        el("p", {}, "It closes when a process of " + r.target + " answers again; ",
          el("a", {href: "/regressions/" + encodeURIComponent(r.id)}, "details")));
    }
    return el("div", {class: "banner severity-" + r.severity, "data-regression": r.id},
      el("strong", {}, "Latency regression on " + r.target), " (" + r.severity + ") since ",
      el("time", {datetime: r.opened_at}, fmtTime(r.opened_at)), ", " + r.open_seconds + " s: likely ",
      el("strong", {}, r.top_cause), causes, grew,
      el("p", {}, el("a", {href: r.flamegraph_url}, "differential flame graph"), " · ",
        el("a", {href: "/regressions/" + encodeURIComponent(r.id)}, "details")));
  }

  function noRegression(detector) {
    const names = Object.keys(detector || {}).sort();
    const states = names.map((n, i) => n + ": " + (detector[n] === "warmup" ? "learning its baseline" : detector[n]) +
      (i < names.length - 1 ? ", " : ""));
    return el("p", {class: "no-regression"}, "No open latency regression",
      names.length ? " (" + states.join("") + ")" : " (the detector has judged no window yet)", ".");
  }

  return {el, url, getJSON, fmtTime, num, replace, showError, banner, noRegression, safeHref};
})();
window.IS = IS;
