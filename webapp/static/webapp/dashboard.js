// The staff dashboard (/dashboard): polls /dashboard/data and redraws its charts in place with
// Plotly.react. plotly.js is the plotly wheel's own bundle, served by clockq as a static file.
(function () {
  "use strict";

  // Every name, reason and username a chart shows goes through these (plotly_text.js): Plotly
  // would read markup in them.
  const plain = window.clockqPlotText.plain;
  const hoverLines = window.clockqPlotText.lines;

  const config = JSON.parse(document.getElementById("dashboard-config").textContent);
  const minutesSelect = document.getElementById("dash-minutes");
  const timelineSelect = document.getElementById("dash-timeline");
  const statusLine = document.getElementById("dash-status");
  const tilesBox = document.getElementById("dash-tiles");
  const LIVE_KEEP = 720; // live samples kept in the page (an hour at one per 5 s)
  const PROMOTIONS_ROW = "promotions";

  const plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  const baseLayout = {
    margin: { l: 56, r: 16, t: 8, b: 36 },
    paper_bgcolor: "#fff",
    plot_bgcolor: "#fff",
    font: { family: "system-ui, sans-serif", size: 12 },
    legend: { orientation: "h", y: -0.18 },
    hovermode: "closest",
  };

  // Live samples since the page loaded: the per-minute rollup ends a minute or more ago.
  let live = [];
  let refreshes = 0;
  let timer = null;

  function layout(extra) {
    return Object.assign({}, baseLayout, extra);
  }

  function colourOf(tiers) {
    const colours = {};
    tiers.forEach((t) => (colours[t.code] = t.colour));
    return (code) => colours[code] || "#57606a";
  }

  function formatMs(ms) {
    if (ms === null || ms === undefined) return "best effort";
    if (ms < 1000) return ms + " ms";
    if (ms < 60000) return ms / 1000 + " s";
    if (ms < 3600000) return ms / 60000 + " min";
    return ms / 3600000 + " h";
  }

  function seconds(value) {
    return value === null || value === undefined ? "–" : value < 1 ? Math.round(value * 1000) + " ms" : value.toFixed(1) + " s";
  }

  function percent(value) {
    return value === null || value === undefined ? "–" : (100 * value).toFixed(1) + " %";
  }

  // The window the picker chose, up to now.
  function timeRange(data) {
    return [data.window.since, data.now];
  }

  // The 5 s samples when the server has some for this window (the last hour), else null: the
  // charts then draw the minute series.
  function fineOf(data) {
    return data.fine && data.fine.available && data.fine.t.length ? data.fine : null;
  }

  // Why there are no 5 s samples to draw, or null.
  function noFineBecause(data) {
    if (data.fine === null) return "5 s samples cover the last hour: pick 15 min or 1 h";
    if (!data.fine.available) return "no 5 s samples: " + data.fine.reason;
    if (!data.fine.t.length) return "no 5 s sample yet: beat's task \"clockq: queue sample\" has not run";
    return null;
  }

  function emptyNote(text) {
    return [{ text: plain(text), xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { color: "#57606a" } }];
  }

  // --- tiles -------------------------------------------------------------------------------

  function renderTiles(data) {
    const colour = colourOf(data.tiers);
    const tiles = data.tiers.map((t) => ({
      colour: colour(t.code),
      figure: data.live.queued[t.code] + " / " + data.live.running[t.code],
      label: t.code + " waiting / running · target " + formatMs(t.wait_target_ms),
    }));
    const gpus = data.live.gpus;
    const utils = (gpus || []).map((g) => g.util).filter((u) => u !== null);
    tiles.push({
      figure: gpus === null ? "broker away" : utils.length ? percent(utils.reduce((a, b) => a + b, 0) / utils.length) : "–",
      label: (gpus ? gpus.length : 0) + " GPU(s) reporting · mean utilisation now",
    });
    const overall = data.kpis && data.kpis.rates ? data.kpis.rates.all : null;
    tiles.push({ figure: overall ? percent(overall.on_time) : "–", label: "on time (KPI window)" });
    tiles.push({ figure: overall ? percent(overall.timed_out) : "–", label: "timed out (KPI window)" });
    tiles.push({
      figure: String(data.timeline.promotions.length),
      label:
        "promotions in the timeline · " +
        (data.kpis ? data.kpis.promotions + " in the KPI window · " : "") +
        data.live.promoted_waiting +
        " promoted, waiting",
      colour: "#bf8700",
    });
    tilesBox.replaceChildren(
      ...tiles.map((tile) => {
        const box = document.createElement("div");
        box.className = "tile";
        if (tile.colour) box.style.setProperty("--colour", tile.colour);
        const figure = document.createElement("div");
        figure.className = "figure";
        figure.textContent = tile.figure;
        const label = document.createElement("div");
        label.className = "label";
        label.textContent = tile.label;
        box.append(figure, label);
        return box;
      })
    );
  }

  // --- per-minute charts -------------------------------------------------------------------

  // Jobs waiting per tier: the 5 s samples and the count now, or per minute (the rollup's deepest
  // sample) and the page's live samples since it loaded.
  function queueSeries(data, code) {
    const fine = fineOf(data);
    if (fine) {
      const x = fine.t.slice();
      const y = fine.queued[code].slice();
      if (!x.length || x[x.length - 1] < data.now) {
        x.push(data.now);
        y.push(data.live.queued[code] || 0);
      }
      return { x: x, y: y };
    }
    const kpis = data.kpis;
    const firstLive = live.length ? live[0].t : null;
    const x = [];
    const y = [];
    if (kpis) {
      kpis.minutes.forEach((minute, i) => {
        if (firstLive === null || minute < firstLive) {
          x.push(minute);
          y.push(kpis.queue_depth[code] ? kpis.queue_depth[code][i] : 0);
        }
      });
    }
    live.forEach((sample) => {
      x.push(sample.t);
      y.push(sample.queued[code] || 0);
    });
    return { x: x, y: y };
  }

  function renderQueue(data) {
    const colour = colourOf(data.tiers);
    const traces = data.tiers.map((t) => {
      const series = queueSeries(data, t.code);
      return {
        type: "scatter",
        mode: "lines+markers",
        line: { shape: "hv", color: colour(t.code), width: 2 },
        marker: { size: 4 },
        name: t.code,
        x: series.x,
        y: series.y,
      };
    });
    Plotly.react(
      "chart-queue",
      traces,
      layout({ uirevision: "queue-" + minutesSelect.value, xaxis: { type: "date", range: timeRange(data) }, yaxis: { title: { text: "jobs waiting" }, rangemode: "tozero" } }),
      plotConfig
    );
  }

  // The longest wait of a job not started yet, per tier, every 5 s; each tier's target dashed.
  function renderOldest(data) {
    const colour = colourOf(data.tiers);
    const fine = fineOf(data);
    const traces = [];
    if (fine) {
      data.tiers.forEach((t) => {
        traces.push({
          type: "scatter",
          mode: "lines",
          line: { shape: "hv", color: colour(t.code), width: 2 },
          name: t.code,
          legendgroup: t.code,
          x: fine.t,
          // On a log axis 0 has no place: nothing waits there, so no line.
          y: fine.oldest_wait_s[t.code].map((v) => (v > 0 ? v : null)),
          hovertemplate: t.code + ": %{y:.1f} s<extra>target " + formatMs(t.wait_target_ms) + "</extra>",
        });
        if (t.wait_target_ms) {
          traces.push({
            type: "scatter",
            mode: "lines",
            line: { color: colour(t.code), width: 1, dash: "dash" },
            name: t.code + " target " + formatMs(t.wait_target_ms),
            legendgroup: t.code,
            showlegend: false,
            x: timeRange(data),
            y: [t.wait_target_ms / 1000, t.wait_target_ms / 1000],
            hoverinfo: "skip",
          });
        }
      });
    }
    const note = noFineBecause(data);
    Plotly.react(
      "chart-oldest",
      traces,
      layout({
        uirevision: "oldest-" + minutesSelect.value,
        xaxis: { type: "date", range: timeRange(data) },
        yaxis: { title: { text: "longest wait (s)" }, type: "log" },
        annotations: note ? emptyNote(note) : [],
      }),
      plotConfig
    );
  }

  function renderWaits(data) {
    const colour = colourOf(data.tiers);
    const waits = data.kpis ? data.kpis.waits : null;
    const bounds = config.waitBucketsMs.map((ms) => ms / 1000);
    const traces = [];
    const targets = { x: [], y: [], text: [], color: [] };
    data.tiers.forEach((t) => {
      const tier = waits ? waits[t.code] : null;
      if (!tier || !tier.started) return;
      let seen = 0;
      const y = bounds.map((_, i) => {
        seen += tier.counts[i];
        return (100 * seen) / tier.started;
      });
      traces.push({
        type: "scatter",
        mode: "lines",
        line: { shape: "hv", color: colour(t.code), width: 2 },
        name: t.code + " (" + tier.started + " started)",
        x: bounds,
        y: y,
        hovertemplate: t.code + ": %{y:.1f}% waited ≤ %{x} s<extra>mean " + seconds(tier.mean_s) + ", p95 " + seconds(tier.p95_s) + "</extra>",
      });
      if (t.wait_target_ms) {
        targets.x.push(t.wait_target_ms / 1000);
        targets.y.push(tier.within_target === null ? null : 100 * tier.within_target);
        targets.text.push(t.code + " target " + formatMs(t.wait_target_ms) + ": " + percent(tier.within_target) + " within");
        targets.color.push(colour(t.code));
      }
    });
    if (targets.x.length) {
      traces.push({
        type: "scatter",
        mode: "markers",
        name: "target",
        x: targets.x,
        y: targets.y,
        text: targets.text,
        hovertemplate: "%{text}<extra></extra>",
        marker: { symbol: "diamond", size: 12, color: targets.color, line: { color: "#1b1f24", width: 1.5 } },
      });
    }
    Plotly.react(
      "chart-waits",
      traces,
      layout({
        uirevision: "waits",
        xaxis: { type: "log", title: { text: "wait from submission to first start (s)" } },
        yaxis: { title: { text: "% of starts" }, range: [0, 102] },
        legend: { x: 0.01, y: 0.98, bgcolor: "rgba(255,255,255,0.85)" },
        annotations: traces.length ? [] : emptyNote(data.kpis ? "no job started in the window" : "waiting for the first KPI rollup"),
      }),
      plotConfig
    );
  }

  // Per GPU: busy (slice time / capacity, from the rollup) and NVML utilisation (from the rollup,
  // then the live samples) in the GPU's own colour.
  function renderGpus(data) {
    const kpis = data.kpis;
    const firstLive = live.length ? live[0].t : null;
    const gpus = {};
    const gpuOf = (worker, index) =>
      (gpus[worker] = gpus[worker] || { index: index, busy: { x: [], y: [] }, util: { x: [], y: [] } });
    (kpis ? kpis.gpus : []).forEach((gpu) => {
      const series = gpuOf(gpu.worker, gpu.gpu);
      kpis.minutes.forEach((minute, i) => {
        series.busy.x.push(minute);
        series.busy.y.push(gpu.busy[i] === null ? null : 100 * gpu.busy[i]);
        if (firstLive === null || minute < firstLive) {
          series.util.x.push(minute);
          series.util.y.push(gpu.util[i] === null ? null : 100 * gpu.util[i]);
        }
      });
    });
    live.forEach((sample) => {
      (sample.gpus || []).forEach((gpu) => {
        const series = gpuOf(gpu.worker, gpu.gpu);
        series.util.x.push(sample.t);
        series.util.y.push(gpu.util === null ? null : 100 * gpu.util);
      });
    });
    const palette = ["#0969da", "#8250df", "#1a7f37", "#bf3989", "#9a6700", "#1b7c83", "#cf222e", "#57606a"];
    const traces = [];
    Object.keys(gpus)
      .sort((a, b) => gpus[a].index - gpus[b].index || (a < b ? -1 : 1))
      .forEach((worker, n) => {
        const colour = palette[n % palette.length];
        const name = plain("GPU " + gpus[worker].index + " · " + worker);
        const line = (series, label, dash) => ({
          type: "scatter",
          mode: "lines+markers",
          marker: { size: 4 },
          name: name + " " + label,
          legendgroup: worker,
          x: series.x,
          y: series.y,
          connectgaps: false,
          line: { color: colour, dash: dash, width: 2 },
          // The trace's name, not the name pasted in: a template reads %{...} in it as a field.
          hovertemplate: "%{fullData.name}: %{y:.0f}%<extra></extra>",
        });
        if (gpus[worker].busy.x.length) traces.push(line(gpus[worker].busy, "busy", "solid"));
        if (gpus[worker].util.x.length) traces.push(line(gpus[worker].util, "utilisation", "dot"));
      });
    Plotly.react(
      "chart-gpus",
      traces,
      layout({
        uirevision: "gpus-" + minutesSelect.value,
        xaxis: { type: "date", range: timeRange(data) },
        yaxis: { title: { text: "% of the GPU" }, range: [0, 105] },
        annotations: traces.length ? [] : emptyNote("no GPU has reported yet"),
      }),
      plotConfig
    );
  }

  function renderRates(data) {
    const rates = data.kpis ? data.kpis.rates : null;
    const codes = data.tiers.map((t) => t.code).concat(["all"]);
    const judged = codes.map((c) => (rates && rates[c] ? rates[c].judged : 0));
    const share = (key) => codes.map((c) => (rates && rates[c] && rates[c][key] !== null ? 100 * rates[c][key] : null));
    const label = codes.map((c, i) => c + " (" + judged[i] + ")");
    const traces = [
      { type: "bar", name: "on time", x: label, y: share("on_time"), marker: { color: "#1a7f37" } },
      { type: "bar", name: "timed out", x: label, y: share("timed_out"), marker: { color: "#cf222e" } },
    ].map((trace) => Object.assign(trace, { hovertemplate: "%{x}: %{y:.1f}%<extra>" + trace.name + "</extra>" }));
    Plotly.react(
      "chart-rates",
      traces,
      layout({
        uirevision: "rates",
        barmode: "group",
        yaxis: { title: { text: "% of jobs ended" }, range: [0, 105] },
        annotations: rates ? [] : emptyNote("waiting for the first KPI rollup"),
      }),
      plotConfig
    );
  }

  // --- load index, forecasts and the control state ---------------------------------------

  const controlBox = document.getElementById("dash-control");

  function flag(text, kind) {
    const span = document.createElement("span");
    span.className = "flag" + (kind ? " " + kind : "");
    span.textContent = text;
    return span;
  }

  function renderControl(load) {
    const parts = [];
    const state = load.control;
    const latest = load.latest;
    if (latest) {
      parts.push(
        flag(
          "forecast " + percent(latest.value) + " by " + latest.model + " · " + Math.round(latest.age_s) + " s ago",
          latest.stale ? "stale" : ""
        )
      );
    }
    if (state) {
      parts.push(flag("admission " + (state.admission_open ? "open" : "closed"), state.admission_open ? "" : "closed"));
      parts.push(flag("prefetch " + (state.prefetch_on ? "on" : "off")));
      parts.push(flag("desired GPU workers " + (state.desired_workers === null ? "–" : state.desired_workers)));
      if (state.forced) parts.push(flag("forced by " + state.forced_by, "forced"));
      const reason = document.createElement("div");
      reason.textContent = state.reason || "";
      parts.push(reason);
    }
    if (latest && latest.reason) {
      const why = document.createElement("div");
      why.textContent = "model: " + latest.reason;
      parts.push(why);
    }
    if (!parts.length) parts.push(document.createTextNode("no forecast yet: the control state is at its defaults"));
    controlBox.replaceChildren(...parts);
  }

  // The control thresholds are lines named in the legend, not labels on the lines: two thresholds
  // a few points apart (reopen < 75 %, scale out > 70 %) would put their labels on each other.
  function thresholdTraces(t, range) {
    return [
      [t.close_above, "#cf222e", "close admission > "],
      [t.reopen_below, "#bf8700", "reopen < "],
      [t.scale_out_above, "#8250df", "scale out > "],
      [t.prefetch_below, "#1a7f37", "prefetch < "],
    ].map(([y, colour, text]) => ({
      type: "scatter",
      mode: "lines",
      name: text + percent(y),
      x: range,
      y: [y, y],
      line: { color: colour, width: 1, dash: "dash" },
      hovertemplate: text + percent(y) + "<extra></extra>",
    }));
  }

  function renderLoad(data) {
    const load = data.load;
    const fine = fineOf(data);
    renderControl(load);
    const start = timeRange(data)[0];
    const end = load.latest ? (load.latest.t > data.now ? load.latest.t : data.now) : data.now;
    const traces = [
      {
        type: "scatter",
        mode: "lines",
        name: fine ? "load index (per minute)" : "load index",
        x: load.samples.map((s) => s.t),
        y: load.samples.map((s) => s.load),
        line: { color: "#1f77b4", width: fine ? 1.5 : 2 },
        hovertemplate: "%{x}: %{y:.2f}<extra>load</extra>",
      },
      {
        type: "scatter",
        mode: "lines+markers",
        name: "forecast (at its target time)",
        x: load.forecasts.map((f) => f.t),
        y: load.forecasts.map((f) => f.value),
        text: load.forecasts.map((f) => plain(f.model + ", made " + f.made.slice(11, 19))),
        line: { color: "#9467bd", dash: "dot" },
        marker: { size: 4 },
        hovertemplate: "%{x}: %{y:.2f} (%{text})<extra>forecast</extra>",
      },
    ];
    if (fine) {
      traces.unshift({
        type: "scatter",
        mode: "lines",
        name: "load index (5 s)",
        x: fine.t,
        y: fine.load_index,
        line: { color: "#0a3069", shape: "hv", width: 2 },
        hovertemplate: "%{x}: %{y:.2f}<extra>load, 5 s</extra>",
      });
    }
    const empty = !load.samples.length && !load.forecasts.length && !(fine && fine.t.length);
    Plotly.react(
      "chart-load",
      traces.concat(thresholdTraces(load.thresholds, [start, end])),
      layout({
        uirevision: "load-" + minutesSelect.value,
        xaxis: { type: "date", range: [start, end] },
        yaxis: { title: { text: "load index" }, rangemode: "tozero" },
        legend: { orientation: "v", x: 1.01, y: 1, xanchor: "left", yanchor: "top" },
        margin: { l: 56, r: 8, t: 8, b: 36 },
        annotations: empty ? emptyNote("no load sample in the window yet") : [],
      }),
      plotConfig
    );
  }

  // --- the slice timeline ------------------------------------------------------------------

  function renderTimeline(data) {
    const colour = colourOf(data.tiers);
    const tl = data.timeline;
    const rowOf = {};
    // A row's name is a tick label, which Plotly reads as markup too.
    tl.workers.forEach((w) => (rowOf[w.worker] = plain(w.gpu === null ? w.worker : "GPU " + w.gpu + " · " + w.worker)));
    const row = (worker) => rowOf[worker] || plain(worker);
    const rows = [PROMOTIONS_ROW].concat(tl.workers.map((w) => row(w.worker)));
    const byTier = {};
    tl.bars.forEach((bar) => (byTier[bar.tier] = byTier[bar.tier] || []).push(bar));
    const hover = (b) =>
      "#" + b.job + " " + plain(b.name) + "<br>" + b.tier + (b.ran_in !== b.tier ? " (ran in " + b.ran_in + ")" : "") +
      " · " + b.outcome + (b.preempted ? ", preempted by RT or HP" : "") + "<br>" + b.ms + " ms · " + b.slices + " slice(s)";
    const traces = data.tiers
      .filter((t) => byTier[t.code])
      .map((t) => {
        const bars = byTier[t.code];
        return {
          type: "bar",
          orientation: "h",
          name: t.code,
          y: bars.map((b) => row(b.worker)),
          base: bars.map((b) => b.start),
          x: bars.map((b) => b.ms),
          text: bars.map(hover),
          textposition: "none",
          hovertemplate: "%{text}<extra></extra>",
          marker: {
            color: colour(t.code),
            opacity: bars.map((b) => (b.outcome === "running" ? 0.55 : 1)),
            line: {
              color: bars.map((b) => (b.promoted ? "#bf8700" : b.preempted ? "#1b1f24" : "#ffffff")),
              width: bars.map((b) => (b.promoted || b.preempted ? 2.5 : 0.6)),
            },
          },
        };
      });
    const overlay = (name, points, marker, text) => ({
      type: "scatter",
      mode: "markers",
      name: name,
      x: points.map((p) => p.x),
      y: points.map((p) => p.y),
      text: points.map((p) => hoverLines(text(p))),
      hovertemplate: "%{text}<extra></extra>",
      marker: marker,
      cliponaxis: false,
    });
    traces.push(
      overlay(
        "switch",
        tl.switches.map((s) => ({ x: s.at, y: row(s.worker), s: s })),
        { symbol: "line-ns-open", size: 18, color: "#1b1f24", line: { width: 1.5 } },
        (p) => "switch #" + p.s.from_job + " → #" + p.s.to_job + " (after " + p.s.after + ")"
      ),
      overlay(
        "preempted (RT, HP)",
        tl.bars.filter((b) => b.preempted).map((b) => ({ x: b.end, y: row(b.worker), b: b })),
        { symbol: "x", size: 11, color: "#d62728", line: { width: 1, color: "#1b1f24" } },
        (p) => "#" + p.b.job + " " + p.b.name + " preempted by a waiting RT or HP job"
      ),
      overlay(
        "promoted slice",
        tl.bars.filter((b) => b.promoted).map((b) => ({ x: b.start, y: row(b.worker), b: b })),
        { symbol: "star", size: 14, color: "#ffd33d", line: { width: 1, color: "#bf8700" } },
        (p) => "#" + p.b.job + " " + p.b.name + ": a " + p.b.tier + " job's slice in " + p.b.ran_in
      ),
      overlay(
        "promotion",
        tl.promotions.map((p) => ({ x: p.at, y: PROMOTIONS_ROW, p: p })),
        { symbol: "triangle-up", size: 13, color: tl.promotions.map((p) => colour(p.tier)), line: { width: 1, color: "#bf8700" } },
        (p) => "#" + p.p.job + " " + p.p.name + ": " + p.p.reason + " (" + p.p.actor + ")"
      )
    );
    const height = 90 + 46 * rows.length;
    document.getElementById("chart-timeline").style.height = height + "px";
    Plotly.react(
      "chart-timeline",
      traces,
      layout({
        height: height,
        uirevision: "timeline-" + timelineSelect.value,
        barmode: "overlay",
        bargap: 0.25,
        margin: { l: 190, r: 16, t: 8, b: 36 },
        xaxis: { type: "date", range: [tl.since, tl.until] },
        yaxis: { type: "category", categoryorder: "array", categoryarray: rows, range: [rows.length - 0.5, -0.5] },
        legend: { orientation: "h", y: -0.12 },
        annotations: tl.bars.length
          ? tl.truncated
            ? [{ text: "the newest slices only", xref: "paper", yref: "paper", x: 0, y: 1.02, showarrow: false, xanchor: "left" }]
            : []
          : emptyNote("no slice ran in the window"),
      }),
      plotConfig
    );
  }

  // --- polling -----------------------------------------------------------------------------

  function remember(data) {
    const t = data.now;
    live.push({ t: t, queued: data.live.queued, gpus: data.live.gpus });
    live = live.slice(-LIVE_KEEP).filter((sample) => sample.t >= data.window.since);
  }

  function render(data) {
    remember(data);
    renderTiles(data);
    renderQueue(data);
    renderOldest(data);
    renderWaits(data);
    renderGpus(data);
    renderRates(data);
    renderLoad(data);
    renderTimeline(data);
  }

  function windowQuery() {
    return new URLSearchParams({ minutes: minutesSelect.value, timeline_s: timelineSelect.value });
  }

  // The pickers' choice goes into the page's own URL, so that a link shows the same windows.
  function rememberInUrl() {
    history.replaceState(null, "", location.pathname + "?" + windowQuery());
  }

  async function refresh() {
    clearTimeout(timer);
    const query = windowQuery();
    try {
      const response = await fetch(config.dataUrl + "?" + query, {
        headers: { Accept: "application/json" },
        credentials: "same-origin",
      });
      const type = response.headers.get("content-type") || "";
      if (!type.includes("application/json")) throw new Error("signed out? reload the page to log in again");
      if (!response.ok) throw new Error("the server answered " + response.status);
      const data = await response.json();
      render(data);
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      statusLine.classList.remove("error");
      statusLine.textContent = "updated " + data.now.slice(11, 19) + " UTC · every " + config.pollMs / 1000 + " s";
    } catch (error) {
      statusLine.classList.add("error");
      statusLine.textContent = "not updated: " + error.message;
    } finally {
      timer = setTimeout(refresh, config.pollMs);
    }
  }

  minutesSelect.addEventListener("change", () => {
    rememberInUrl();
    refresh();
  });
  timelineSelect.addEventListener("change", () => {
    rememberInUrl();
    refresh();
  });
  refresh();
})();
