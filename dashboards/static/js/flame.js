// d3-flame-graph over /api/flamegraph/tree: click a frame to zoom, search to highlight, and in diff mode
// frames coloured by how much their own samples grew (red) or shrank (blue) against the baseline.
"use strict";

const Flame = (() => {
  function diffColor(d) {
    if (d.highlight) return "#E600E6";
    const delta = d.data.delta || 0;
    const own = Math.max(1, d.data.value);
    const strength = Math.min(1, Math.abs(delta) / own);
    const fade = Math.round(255 - 180 * strength);
    return delta > 0 ? "rgb(255," + fade + "," + fade + ")" : delta < 0 ? "rgb(" + fade + "," + fade + ",255)" : "rgb(235,235,235)";
  }

  // Plain substring matching: a search term is text, not a regular expression that could fail to compile.
  function match(d, term) {
    return Boolean(term) && String(d.data.name).toLowerCase().includes(String(term).toLowerCase());
  }

  function show(container, data, meta) {
    const width = Math.max(600, container.clientWidth || 960);
    const chart = flamegraph().width(width).cellHeight(18).transitionDuration(300).minFrameSize(2)
      .sort(true).title("").selfValue(false).setSearchMatch(match);
    if (data.baseline_total !== null && data.baseline_total !== undefined) chart.setColorMapper(diffColor);
    IS.replace(container);
    d3.select(container).datum(data.tree).call(chart);
    const search = document.getElementById("flame-search");
    if (search) {
      search.oninput = () => (search.value ? chart.search(search.value) : chart.clear());
      if (search.value) chart.search(search.value);
    }
    const reset = document.getElementById("flame-reset");
    if (reset) reset.onclick = () => chart.resetZoom();
    if (meta) {
      meta.textContent = data.total + " " + data.unit + (data.baseline_total !== null && data.baseline_total !== undefined
        ? " (baseline " + data.baseline_total + ", scaled to the same total)" : "") +
        (data.truncated ? " · truncated: the profile hit its size limits" : "") +
        Object.entries(data.range_cut || {}).map(([part, c]) => " · " + part + " read from " + IS.fmtTime(c.from) +
          " only (" + c.why + ")").join("");
    }
    window.infersightFlame = chart;
    container.dataset.drawn = "1";
    return chart;
  }

  async function load(container, params, meta) {
    try {
      const data = await IS.getJSON("/api/flamegraph/tree", params);
      if (!data.total) {
        IS.replace(container, IS.el("p", {class: "meta"}, "no " + params.kind + " samples in this range"));
        container.dataset.drawn = "empty";
        return null;
      }
      return show(container, data, meta);
    } catch (err) {
      IS.showError(container, err);
      container.dataset.drawn = "error";
      return null;
    }
  }

  return {show, load};
})();
window.Flame = Flame;
