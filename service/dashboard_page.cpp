#include "service/dashboard_page.hpp"

namespace dpactor {

// The page's elements that tests read: #loss and #accuracy canvases carry
// data-points (points drawn), #devices rows data-device, #timeline items.
std::string_view dashboard_page() {
  static constexpr std::string_view page = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dpactor</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:22px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0 12px 0 0} header span{font-size:14px;opacity:.9} header b{font-weight:600}
#state.running{color:#6fdc8c} #state.stopped{color:#ffb3b3}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:14px;padding:14px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 12px}
h2{font-size:14px;margin:0 0 8px;color:#4a5468;font-weight:600}
canvas{width:100%;height:200px;display:block}
table{border-collapse:collapse;width:100%;font-size:13px} td,th{padding:4px 6px;text-align:left;border-bottom:1px solid #eef0f3}
.bar{height:10px;background:#4c7bd9;border-radius:2px}
ul{margin:0;padding:0;list-style:none;font-size:13px;max-height:220px;overflow:auto} li{margin:2px 0;padding-left:8px;border-left:3px solid #dde1e7}
li.fault{border-color:#b3261e} li.recovery{border-color:#1e7b34} li.membership{border-color:#4c7bd9}
li.fault{color:#b3261e;font-weight:600} li.recovery{color:#1e7b34} li.membership{font-weight:600} li.checkpoint,li.epoch{color:#6b7487}
.legend{font-size:12px;color:#4a5468} .legend i{display:inline-block;width:10px;height:3px;margin:0 4px 3px 10px;vertical-align:middle}
</style></head><body>
<header><h1>dpactor</h1>
<span>run <b id="state">connecting</b></span><span>step <b id="step">0</b></span>
<span>samples/s <b id="sps">-</b></span><span>generation <b id="generation">-</b></span>
<span>lr <b id="lr">-</b></span><span>committed sequence <b id="committed">-</b></span>
<span>checkpoint <b id="checkpoint">none</b></span></header>
<main>
<section><h2>Loss</h2><div class="legend"><i style="background:#4c7bd9"></i>train<i style="background:#d9534f"></i>test</div><canvas id="loss" data-points="0"></canvas></section>
<section><h2>Accuracy</h2><div class="legend"><i style="background:#4c7bd9"></i>train<i style="background:#d9534f"></i>test</div><canvas id="accuracy" data-points="0"></canvas></section>
<section><h2>Samples per second</h2><canvas id="throughput" data-points="0"></canvas></section>
<section><h2>Devices</h2><table id="devices"><thead><tr><th>device</th><th>share of the batch</th><th></th><th>samples/s</th></tr></thead><tbody></tbody></table></section>
<section id="workers-section" hidden><h2>Logical workers (async)</h2><table id="workers"><thead><tr><th>worker</th><th>rounds contributed</th><th>dropped as stale</th><th>mean staleness</th><th>inner steps a round</th><th>samples/s</th></tr></thead><tbody></tbody></table></section>
<section><h2>Timeline</h2><ul id="timeline"></ul></section>
</main>
<script>
"use strict";
const $ = id => document.getElementById(id);
const series = {trainLoss: [], testLoss: [], trainAcc: [], testAcc: [], sps: []};
const maxPoints = 2000;
function push(list, x, y) {
  if (!Number.isFinite(y)) return;
  list.push([x, y]);
  if (list.length > maxPoints) list.splice(0, list.length - maxPoints);
}
function draw(canvas, lines) {
  const dpr = window.devicePixelRatio || 1, w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d"); g.scale(dpr, dpr); g.clearRect(0, 0, w, h);
  const pts = lines.flatMap(l => l.data);
  canvas.dataset.points = pts.length;
  if (pts.length === 0) return;
  let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  let y0 = Math.min(0, ...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) y1 = y0 + 1;
  const L = 44, B = 18, sx = x => L + (x - x0) / (x1 - x0) * (w - L - 8), sy = y => h - B - (y - y0) / (y1 - y0) * (h - B - 8);
  g.strokeStyle = "#dde1e7"; g.fillStyle = "#4a5468"; g.font = "11px sans-serif"; g.lineWidth = 1;
  for (let i = 0; i <= 4; ++i) {
    const y = y0 + (y1 - y0) * i / 4;
    g.beginPath(); g.moveTo(L, sy(y)); g.lineTo(w - 8, sy(y)); g.stroke();
    g.fillText(y.toPrecision(3), 2, sy(y) + 4);
  }
  g.fillText("step " + x0, L, h - 4); g.fillText("step " + x1, w - 70, h - 4);
  for (const l of lines) {
    if (l.data.length === 0) continue;
    g.strokeStyle = l.color; g.fillStyle = l.color; g.lineWidth = 1.6; g.beginPath();
    l.data.forEach((p, i) => i ? g.lineTo(sx(p[0]), sy(p[1])) : g.moveTo(sx(p[0]), sy(p[1])));
    g.stroke();
    if (l.dots) for (const p of l.data) { g.beginPath(); g.arc(sx(p[0]), sy(p[1]), 3, 0, 7); g.fill(); }
  }
}
function redraw() {
  draw($("loss"), [{data: series.trainLoss, color: "#4c7bd9"}, {data: series.testLoss, color: "#d9534f", dots: true}]);
  draw($("accuracy"), [{data: series.trainAcc, color: "#4c7bd9"}, {data: series.testAcc, color: "#d9534f", dots: true}]);
  draw($("throughput"), [{data: series.sps, color: "#2f9e6e"}]);
}
let pending = false;
function later() { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; redraw(); }); } }
function devices(names, shares, rates) {
  const body = $("devices").tBodies[0];
  body.replaceChildren(...names.map((n, i) => {
    const tr = document.createElement("tr"); tr.dataset.device = n;
    const share = shares && shares[i] !== undefined ? shares[i] : 1 / names.length;
    const rate = rates && rates[i] !== undefined ? rates[i] : 0;
    tr.innerHTML = "<td></td><td><div class=bar></div></td><td></td><td></td>";
    tr.cells[0].textContent = n;
    tr.cells[1].firstChild.style.width = (100 * share).toFixed(1) + "%";
    tr.cells[2].textContent = (100 * share).toFixed(1) + "%";
    tr.cells[3].textContent = rate ? Math.round(rate).toLocaleString() : "-";
    return tr;
  }));
}
function workers(list) {
  $("workers-section").hidden = false;
  $("workers").tBodies[0].replaceChildren(...list.map((w, k) => {
    const tr = document.createElement("tr"); tr.dataset.worker = k;
    tr.innerHTML = "<td></td><td></td><td></td><td></td><td></td><td></td>";
    [k, w.contributed, w.dropped, w.mean_staleness.toFixed(2), w.inner_steps,
     w.samples_per_s ? Math.round(w.samples_per_s).toLocaleString() : "-"].forEach((v, i) => tr.cells[i].textContent = v);
    return tr;
  }));
}
let members = [];
function note(kind, text) {
  const li = document.createElement("li"); li.className = kind; li.textContent = text;
  const list = $("timeline"); list.prepend(li);
  while (list.children.length > 200) list.lastChild.remove();
}
const handlers = {
  step(e) {
    $("step").textContent = e.step; $("lr").textContent = e.lr.toPrecision(3);
    $("sps").textContent = Math.round(e.samples_per_s).toLocaleString(); $("generation").textContent = e.generation;
    push(series.trainLoss, e.step, e.loss); push(series.trainAcc, e.step, e.accuracy); push(series.sps, e.step, e.samples_per_s);
    if (members.length === e.shares.length) devices(members, e.shares, e.throughput);
    if (e.workers) workers(e.workers);
    if (e.cuts > 0) note("cut", "step " + e.step + ": " + e.cuts + " cut" + (e.cuts > 1 ? "s" : ""));
  },
  epoch(e) {
    if (e.test_loss !== null) { push(series.testLoss, e.step, e.test_loss); push(series.testAcc, e.step, e.test_accuracy); }
  },
  membership(e) {
    members = e.members; devices(members);
    $("generation").textContent = e.generation;
    const fault = / (failed|hung|lost|exited)/.test(e.reason);
    note(fault ? "fault" : "membership", "step " + e.step + ": generation " + e.generation + ", " + e.members.join(", ") + " (" + e.reason + ")");
  },
  recovery(e) { note("recovery", "step " + e.step + ": recovered in " + e.recovery_ms.toFixed(1) + " ms"); },
  checkpoint(e) {
    $("checkpoint").textContent = "step " + e.step;
    if (e.committed_sequence !== undefined) $("committed").textContent = e.committed_sequence;
    note("checkpoint", "step " + e.step + ": checkpoint");
  },
};
async function status() {
  try {
    const s = await (await fetch("/status")).json();
    $("state").textContent = s.running ? "running" : "stopped"; $("state").className = s.running ? "running" : "stopped";
    if (s.checkpoint) { $("checkpoint").textContent = "step " + s.checkpoint.step + ", " + s.checkpoint.age_s.toFixed(0) + " s ago";
      if (s.checkpoint.committed_sequence !== null) $("committed").textContent = s.checkpoint.committed_sequence; }
    if (members.length === 0 && s.members.length) { members = s.members.map(m => m.name); devices(members, s.members.map(m => m.share), s.members.map(m => m.samples_per_s)); }
  } catch (err) { $("state").textContent = "unreachable"; $("state").className = "stopped"; }
}
const source = new EventSource("/events");
for (const kind of Object.keys(handlers))
  source.addEventListener(kind, m => { handlers[kind](JSON.parse(m.data)); later(); });
status(); setInterval(status, 2000);
window.addEventListener("resize", later);
</script></body></html>
)html";
  return page;
}

}  // namespace dpactor
