// The job page's metric curves: one line per metric against the job's step, a grey dotted line
// at each slice end where the job made way for another, a red one where an RT job preempted it
// (from GET /api/jobs/<id>/metrics).
(function () {
  "use strict";
  const chart = document.getElementById("metrics-chart");
  if (!chart || !window.Plotly) return;

  function draw(data) {
    const traces = Object.entries(data.metrics).map(([name, curve]) => ({
      name: name,
      x: curve.points.map((p) => p[0]),
      y: curve.points.map((p) => p[1]),
      mode: "lines",
      type: "scatter",
    }));
    const shapes = data.slice_ends
      .filter((end) => end.outcome === "yielded")
      .map((end) => ({
        type: "line", xref: "x", yref: "paper", x0: end.step, x1: end.step, y0: 0, y1: 1,
        line: { width: 1, dash: "dot", color: end.preempted ? "#d62728" : "#999" },
      }));
    Plotly.react(chart, traces, {
      margin: { t: 10, r: 10, b: 40, l: 50 },
      xaxis: { title: { text: "step" } },
      shapes: shapes,
      legend: { orientation: "h" },
    }, { displaylogo: false, responsive: true });
  }

  function refresh() {
    fetch(chart.dataset.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then(draw)
      .catch(() => {});
  }
  refresh();
  setInterval(refresh, 10000);
})();
