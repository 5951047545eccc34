// The job page's slice timeline: one thin bar of the job's slices against time, each span coloured
// by how it ended (continued, completed, yielded, preempted, lost, failed). The page embeds the
// spans (webapp/job_page.py, `slice_timeline`): at most a few hundred, neighbouring slices merged
// beyond that, so a job with 10,000 slices draws as fast as one with 20.
(function () {
  "use strict";
  const chart = document.getElementById("slice-timeline");
  const source = document.getElementById("slice-timeline-data");
  if (!chart || !source || !window.Plotly) return;
  const data = JSON.parse(source.textContent);
  const time = window.clockqTime;
  const stamp = (ms) => (time ? time.format(new Date(data.t0 + ms), "ms") : new Date(data.t0 + ms).toISOString());

  function hover(span) {
    const [start, end, , slices, tally] = span;
    const counts = data.kinds.map((kind, i) => (tally[i] ? tally[i] + " " + kind : "")).filter(Boolean);
    const what = slices === 1 ? "1 slice, " + counts[0].replace(/^1 /, "") : slices + " slices: " + counts.join(", ");
    return what + "<br>" + stamp(start) + " to " + stamp(end);
  }

  const traces = data.kinds
    .map((kind, index) => {
      const spans = data.spans.filter((span) => span[2] === index);
      return {
        type: "bar",
        orientation: "h",
        name: kind,
        y: spans.map(() => "slices"),
        base: spans.map((span) => stamp(span[0])),
        x: spans.map((span) => Math.max(span[1] - span[0], 1)),
        text: spans.map(hover),
        textposition: "none",
        hovertemplate: "%{text}<extra></extra>",
        // The outline keeps a slice of a few ms visible on an axis of hours.
        marker: { color: data.colours[index], line: { color: data.colours[index], width: 1 } },
      };
    })
    .filter((trace) => trace.x.length);

  Plotly.react(chart, traces, {
    margin: { t: 30, r: 10, b: 40, l: 10 },
    barmode: "overlay",
    bargap: 0.2,
    xaxis: {
      type: "date",
      tickformat: "%H:%M:%S",
      title: { text: "from " + stamp(0).slice(0, 19) + (time ? " (" + time.zone + ")" : "") },
    },
    yaxis: { visible: false },
    legend: { orientation: "h", x: 0, y: 1, yanchor: "bottom" },
    showlegend: true,
  }, { displaylogo: false, responsive: true });
})();
