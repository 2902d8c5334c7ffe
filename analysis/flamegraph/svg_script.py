"""The inline, static JavaScript of our SVG flame graphs: hover details, click to zoom, search."""

# Static text: no frame name or caller value is ever formatted into it; names reach the script only
# through the DOM (<title> text), so the script needs no escaping of its own.
SCRIPT = r"""
"use strict";
var details, searchbtn, unzoombtn, matchedtxt, svg, fgframes, searching = null, fontsize, fontwidth, xpad;
function init(evt) {
  svg = document.documentElement;
  details = document.getElementById("details").firstChild;
  searchbtn = document.getElementById("search");
  unzoombtn = document.getElementById("unzoom");
  matchedtxt = document.getElementById("matched");
  fontsize = parseFloat(svg.getAttribute("data-fontsize"));
  fontwidth = parseFloat(svg.getAttribute("data-fontwidth"));
  xpad = parseFloat(svg.getAttribute("data-xpad"));
  fgframes = [];
  var gs = document.getElementById("frames").getElementsByTagName("g");
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i], r = g.getElementsByTagName("rect")[0], t = g.getElementsByTagName("text")[0];
    var title = g.getElementsByTagName("title")[0].textContent;
    var f = {g: g, rect: r, text: t, title: title, name: frame_name(title),
             x: parseFloat(r.getAttribute("x")), w: parseFloat(r.getAttribute("width")),
             y: parseFloat(r.getAttribute("y")), fill: r.getAttribute("fill")};
    g.fgframe = f;
    fgframes.push(f);
  }
  document.getElementById("frames").addEventListener("click", function (e) {
    var g = find_group(e.target);
    if (g) { zoom(g.fgframe); }
  });
  document.getElementById("frames").addEventListener("mouseover", function (e) {
    var g = find_group(e.target);
    if (g) { details.nodeValue = g.fgframe.title; }
  });
  document.getElementById("frames").addEventListener("mouseout", function (e) {
    details.nodeValue = " ";
  });
  unzoombtn.addEventListener("click", unzoom);
  searchbtn.addEventListener("click", search_prompt);
  matchedtxt.addEventListener("click", reset_search);
  window.addEventListener("keydown", function (e) {
    if (e.keyCode === 114 || ((e.ctrlKey || e.metaKey) && e.keyCode === 70)) {
      e.preventDefault();
      search_prompt();
    } else if (e.keyCode === 27) {
      unzoom();
      reset_search();
    }
  });
  var params = new URLSearchParams(window.location.search);
  if (params.get("s")) { search(params.get("s")); }
}
function find_group(node) {
  while (node && node.parentNode) {
    if (node.fgframe) { return node; }
    if (node.id === "frames") { return null; }
    node = node.parentNode;
  }
  return null;
}
function frame_name(title) {
  // Titles are "NAME (details)"; names may hold parentheses of their own, so strip the last group only.
  var i = title.lastIndexOf(" (");
  return i < 0 ? title : title.substring(0, i);
}
function fit_text(f, x, w) {
  f.text.setAttribute("x", x + 3);
  var room = Math.floor((w - 6) / (fontsize * fontwidth));
  if (room < 3) { f.text.textContent = ""; return; }
  f.text.textContent = f.name.length <= room ? f.name : f.name.substring(0, room - 2) + "..";
}
function zoom(target) {
  var width = parseFloat(svg.getAttribute("width")) - 2 * xpad - parseFloat(svg.getAttribute("data-panel"));
  var scale = width / target.w;
  unzoombtn.classList.remove("hide");
  for (var i = 0; i < fgframes.length; i++) {
    var f = fgframes[i];
    var inside = f.x >= target.x - 0.0001 && f.x + f.w <= target.x + target.w + 0.0001;
    if (f.y > target.y && f.x <= target.x + 0.0001 && f.x + f.w >= target.x + target.w - 0.0001) {
      f.g.classList.remove("hide");
      f.g.classList.add("parent");
      f.rect.setAttribute("x", xpad);
      f.rect.setAttribute("width", width);
      fit_text(f, xpad, width);
    } else if (inside && f.y <= target.y) {
      var nx = xpad + (f.x - target.x) * scale, nw = f.w * scale;
      f.g.classList.remove("hide", "parent");
      f.rect.setAttribute("x", nx);
      f.rect.setAttribute("width", nw);
      fit_text(f, nx, nw);
    } else {
      f.g.classList.add("hide");
    }
  }
}
function unzoom() {
  unzoombtn.classList.add("hide");
  for (var i = 0; i < fgframes.length; i++) {
    var f = fgframes[i];
    f.g.classList.remove("hide", "parent");
    f.rect.setAttribute("x", f.x);
    f.rect.setAttribute("width", f.w);
    fit_text(f, f.x, f.w);
  }
}
function search_prompt() {
  if (searching) { reset_search(); return; }
  var term = prompt("Search for (regular expression):", "");
  if (term) { search(term); }
}
function reset_search() {
  searching = null;
  for (var i = 0; i < fgframes.length; i++) { fgframes[i].rect.setAttribute("fill", fgframes[i].fill); }
  matchedtxt.classList.add("hide");
  searchbtn.classList.remove("show");
}
function search(term) {
  var re;
  try { re = new RegExp(term); } catch (err) { alert("Not a regular expression: " + err.message); return; }
  reset_search();
  searching = term;
  var spans = [];
  for (var i = 0; i < fgframes.length; i++) {
    var f = fgframes[i];
    if (re.test(f.name)) {
      f.rect.setAttribute("fill", "rgb(230,0,230)");
      spans.push([f.x, f.x + f.w]);
    }
  }
  spans.sort(function (a, b) { return a[0] - b[0]; });
  // Nested matches (recursion) would count twice; add up the union of their spans instead.
  var covered = 0, end = -1;
  for (var j = 0; j < spans.length; j++) {
    var s = Math.max(spans[j][0], end);
    if (spans[j][1] > s) { covered += spans[j][1] - s; }
    end = Math.max(end, spans[j][1]);
  }
  var width = parseFloat(svg.getAttribute("width")) - 2 * xpad - parseFloat(svg.getAttribute("data-panel"));
  matchedtxt.firstChild.nodeValue = "Matched: " + (100 * covered / width).toFixed(1) + "%";
  matchedtxt.classList.remove("hide");
  searchbtn.classList.add("show");
}
"""
