// Draws one precomputed frame of a halluc_lab.book.interactive explorer as SVG (see interactive.py).
// The Python side replaces __ROOT_ID__ with the output's id; all data sits in the JSON <script>.
(function () {
  var root = document.getElementById("__ROOT_ID__");
  if (!root || root.getAttribute("data-ready")) return;
  root.setAttribute("data-ready", "1");
  var D = JSON.parse(root.querySelector("script.hl-data").textContent);
  var S = D.static || {};
  var inputs = root.querySelectorAll("input.hl-slider");
  var outputs = root.querySelectorAll("output.hl-value");
  var figure = root.querySelector(".hl-figure");
  var caption = root.querySelector(".hl-caption");
  var NS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

  function el(tag, attrs, parent, text) {
    var node = document.createElementNS(NS, tag);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  // Charts are drawn for the column's width (at most 640 px, at least 300 px), so their text stays
  // 11 px on a phone; the SVG also scales down with its viewBox if the column is narrower still.
  function width() {
    var w = figure.clientWidth || root.clientWidth || 640;
    return Math.max(300, Math.min(640, Math.floor(w)));
  }
  function svg(w, h) {
    figure.innerHTML = "";
    return el("svg", {width: w, height: h, viewBox: "0 0 " + w + " " + h, role: "img",
                      "aria-label": D.title || D.kind, style: "max-width:100%;height:auto",
                      "font-size": 11, fill: "currentColor"}, figure);
  }
  function fmt(v) {
    if (v === null) return "";
    var a = Math.abs(v);
    return a !== 0 && (a < 0.01 || a >= 1e4) ? v.toExponential(1) : (+v.toFixed(2)).toString();
  }
  // An axis label's "x^y" is drawn as x with y raised and smaller ("p^τ": p to the τ), as in TeX.
  function label(parent, attrs, text) {
    var node = el("text", attrs, parent);
    String(text).split(/\^([^\s^]+)/).forEach(function (part, i) {
      var raised = {"baseline-shift": "super", "font-size": "75%"};
      if (part) el("tspan", i % 2 ? raised : {}, node, part);
    });
    return node;
  }
  function axisLabels(s, w, h, m) {
    var midX = m.l + (w - m.l - m.r) / 2, midY = m.t + (h - m.t - m.b) / 2;
    if (S.xlabel) label(s, {x: midX, y: h - 4, "text-anchor": "middle"}, S.xlabel);
    if (S.ylabel) label(s, {x: 12, y: midY, "text-anchor": "middle",
                            transform: "rotate(-90 12 " + midY + ")"}, S.ylabel);
  }
  function yTicks(s, m, w, h, lo, hi) {
    for (var i = 0; i <= 4; i++) {
      var v = lo + (hi - lo) * i / 4, y = h - m.b - (h - m.t - m.b) * i / 4;
      el("line", {x1: m.l - 4, x2: w - m.r, y1: y, y2: y, stroke: "#999", "stroke-opacity": i ? 0.25 : 1}, s);
      el("text", {x: m.l - 6, y: y + 4, "text-anchor": "end"}, s, fmt(v));
    }
  }

  function bars(frame) {
    var n = S.labels.length, w = width(), h = 300, bw = (w - 66) / n;
    var longest = Math.max.apply(null, S.labels.map(function (t) { return String(t).length; }));
    var tilt = n > 12 || longest * 6.5 > bw;  // labels that would overlap are turned 45 degrees
    var m = {l: 56, r: 10, t: 18, b: tilt ? Math.min(110, 30 + longest * 5) : 44}, s = svg(w, h);
    yTicks(s, m, w, h, 0, S.ymax);
    for (var i = 0; i < n; i++) {
      var v = frame.h[i], bh = (h - m.t - m.b) * Math.min(v / S.ymax, 1), x = m.l + i * bw;
      var on = !frame.on || frame.on[i];
      el("rect", {x: x + bw * 0.1, width: bw * 0.8, y: h - m.b - bh, height: bh,
                  fill: on ? PALETTE[0] : "#c7c7c7", "class": on ? "hl-bar hl-on" : "hl-bar"}, s);
      if (n <= 24 && bw >= 30)  // a value only where the bar is wide enough to hold it
        el("text", {x: x + bw / 2, y: h - m.b - bh - 3, "text-anchor": "middle", "font-size": 9}, s,
           fmt(v));
      var tx = x + bw / 2, ty = h - m.b + 14;
      var turned = {x: tx, y: ty, "text-anchor": "end",
                    transform: "rotate(-45 " + tx + " " + ty + ")"};
      el("text", tilt ? turned : {x: tx, y: ty, "text-anchor": "middle"}, s, S.labels[i]);
    }
    axisLabels(s, w, h, m);
  }

  function colour(t) {  // viridis, five stops
    var c = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    t = Math.max(0, Math.min(1, t)) * 4;
    var i = Math.min(3, Math.floor(t)), f = t - i, out = [];
    for (var k = 0; k < 3; k++) out.push(Math.round(c[i][k] + (c[i + 1][k] - c[i][k]) * f));
    return {fill: "rgb(" + out.join(",") + ")", text: t > 2.6 ? "#000" : "#fff"};
  }
  function heatmap(frame) {
    var R = S.rows.length, C = S.cols.length, m = {l: 70, r: 10, t: 10, b: 60};
    var cell = Math.max(6, Math.min(40, Math.floor((width() - m.l - m.r) / Math.max(R, C))));
    var w = m.l + C * cell + m.r, h = m.t + R * cell + m.b, s = svg(w, h);
    for (var r = 0; r < R; r++) {
      el("text", {x: m.l - 4, y: m.t + r * cell + cell / 2 + 4, "text-anchor": "end"}, s, S.rows[r]);
      for (var c = 0; c < C; c++) {
        var v = frame[r][c], x = m.l + c * cell, y = m.t + r * cell;
        var col = v === null ? {fill: "none", text: "#000"} : colour((v - S.vmin) / (S.vmax - S.vmin));
        el("rect", {x: x, y: y, width: cell - 1, height: cell - 1, fill: col.fill, stroke: v === null ? "#ccc" : "none",
                    "class": "hl-cell"}, s);
        if (S.values && v !== null && cell >= 22)
          el("text", {x: x + cell / 2, y: y + cell / 2 + 3, "text-anchor": "middle", "font-size": 9, fill: col.text}, s, fmt(v));
      }
    }
    for (var c2 = 0; c2 < C; c2++) {
      var tx = m.l + c2 * cell + cell / 2, ty = m.t + R * cell + 12;
      el("text", {x: tx, y: ty, "text-anchor": "end", transform: "rotate(-45 " + tx + " " + ty + ")"}, s, S.cols[c2]);
    }
    axisLabels(s, w, h, m);
  }

  function lines(frame) {
    var w = width(), h = 300, m = {l: 56, r: w < 480 ? 80 : 110, t: 12, b: 40}, s = svg(w, h);
    var x0 = Math.min.apply(null, S.x), x1 = Math.max.apply(null, S.x), lo = S.ylim[0], hi = S.ylim[1];
    var px = function (x) { return m.l + (w - m.l - m.r) * (x - x0) / ((x1 - x0) || 1); };
    var py = function (y) { return h - m.b - (h - m.t - m.b) * (y - lo) / (hi - lo); };
    yTicks(s, m, w, h, lo, hi);
    for (var i = 0; i <= 4; i++) {
      var xv = x0 + (x1 - x0) * i / 4;
      el("text", {x: px(xv), y: h - m.b + 14, "text-anchor": "middle"}, s, fmt(xv));
    }
    frame.forEach(function (ys, k) {
      var pts = ys.map(function (y, j) { return px(S.x[j]) + "," + py(y); }).join(" ");
      el("polyline", {points: pts, fill: "none", stroke: PALETTE[k % PALETTE.length], "stroke-width": 2, "class": "hl-line"}, s);
      el("text", {x: w - m.r + 6, y: m.t + 14 * (k + 1), fill: PALETTE[k % PALETTE.length]}, s, S.series[k]);
    });
    axisLabels(s, w, h, m);
  }

  function images(frame) {
    figure.innerHTML = "";
    var img = document.createElement("img");
    img.src = frame;
    img.alt = D.title || "figure";
    img.style.maxWidth = "100%";
    figure.appendChild(img);
  }

  // A caption's `spans` are shown as code, as Markdown would show them; the rest stays text.
  function showCaption(text) {
    caption.textContent = "";
    String(text).split("`").forEach(function (part, i) {
      if (!part) return;
      if (i % 2) {
        var code = document.createElement("code");
        code.textContent = part;
        caption.appendChild(code);
      } else {
        caption.appendChild(document.createTextNode(part));
      }
    });
  }

  var draw = {bars: bars, heatmap: heatmap, lines: lines, images: images}[D.kind];
  function update() {
    var k = 0;
    for (var i = 0; i < inputs.length; i++) {
      k = k * D.shape[i] + (+inputs[i].value);
      outputs[i].textContent = D.controls[i].labels[+inputs[i].value];
    }
    draw(D.frames[k]);
    showCaption(D.captions ? D.captions[k] : "");
    root.setAttribute("data-frame", k);
  }
  for (var i = 0; i < inputs.length; i++) inputs[i].addEventListener("input", update);
  var drawnFor = width();
  window.addEventListener("resize", function () {
    if (width() !== drawnFor) { drawnFor = width(); update(); }
  });
  update();
})();
