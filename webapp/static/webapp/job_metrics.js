// The job page's metric curves: one line per metric against the job's step (from
// GET /api/jobs/<id>/metrics). How the job's slices ended is drawn apart, on the slice timeline
// (job_timeline.js), so a long job's curve stays readable.
(function () {
  "use strict";
  const chart = document.getElementById("metrics-chart");
  if (!chart || !window.Plotly) return;

  function draw(data) {
    // A legend entry is read as Plotly markup: the job names its metrics (plotly_text.js).
    const traces = Object.entries(data.metrics).map(([name, curve]) => ({
      name: window.clockqPlotText.plain(name),
      x: curve.points.map((p) => p[0]),
      y: curve.points.map((p) => p[1]),
      mode: "lines",
      type: "scatter",
    }));
    Plotly.react(chart, traces, {
      margin: { t: 10, r: 10, b: 40, l: 50 },
      xaxis: { title: { text: "step" } },
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
