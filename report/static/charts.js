/* Draftsmith charts: the one copy of the chart code that the web dashboard serves and that
 * `report.html` inlines (see README.md beside this file for why it lives here).
 *
 * A classic script, not an ES module, so the report can inline it inside a plain <script> and open
 * from disk. It needs uPlot (vendor/uPlot.iife.min.js) loaded first and defines window.DraftsmithCharts;
 * bar_charts.js, loaded after it, adds the bar charts to that object.
 *
 * Every chart is a <figure> with a caption, the chart (role="img" with a text summary) and the same
 * numbers as a table under "Data": canvas charts are invisible to screen readers, tables are not.
 * Inputs are read defensively: report.json gains keys over time and older reports lack some, so a
 * missing value draws an empty chart with a note instead of throwing.
 */
(function (global) {
  "use strict";

  // Okabe-Ito: distinguishable with the common colour-vision deficiencies, 3:1 or more against white.
  const PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#8B6A00", "#3F7FBF", "#000000"];
  const HEIGHT = 240;
  const CLIP_MIN_POINTS = 10;
  const CLIP_LEADING_SHARE = 0.1;

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key === "class") node.className = value;
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children || []) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function isNumber(value) {
    return typeof value === "number" && Number.isFinite(value);
  }

  function fmt(value, digits) {
    if (!isNumber(value)) return "–";
    return Number(value.toFixed(digits === undefined ? 3 : digits)).toString();
  }

  function colour(index) {
    return PALETTE[index % PALETTE.length];
  }

  /** The last number of a list (null if none). */
  function latest(values) {
    for (let i = values.length - 1; i >= 0; i--) if (isNumber(values[i])) return values[i];
    return null;
  }

  /* ---- turning inputs into series ------------------------------------------------------- */

  // Draft position K (1-based) of a per-position accuracy series: `accuracy_pos_K` is how the
  // worker flattens the trainer's accuracy_per_position list (trainer.pipeline.step_metrics).
  const POSITION_METRIC = /^accuracy_pos_(\d+)$/;

  /** Training curves from metrics.jsonl records ({step, loss, accuracy_per_position: [...]}). */
  function trainingFromRecords(records) {
    const rows = (records || []).filter((r) => r && isNumber(r.step));
    const width = Math.max(0, ...rows.map((r) => (Array.isArray(r.accuracy_per_position) ? r.accuracy_per_position.length : 0)));
    const positions = [];
    for (let k = 0; k < width; k++) {
      positions.push({ position: k + 1, x: rows.map((r) => r.step),
                       y: rows.map((r) => (Array.isArray(r.accuracy_per_position) ? nullable(r.accuracy_per_position[k]) : null)) });
    }
    return {
      loss: { x: rows.map((r) => r.step), y: rows.map((r) => nullable(r.loss)) },
      positions,
    };
  }

  /** The per-position series names of a drafter with this block size (B - 1 draft positions). */
  function positionMetricNames(blockSize) {
    return Array.from({ length: Math.max(0, (blockSize || 0) - 1) }, (_, k) => `accuracy_pos_${k + 1}`);
  }

  /** Training curves from the API's GET /v1/jobs/{id}/metrics body ({series: [{name, points}]}). */
  function trainingFromSeries(metrics) {
    const byName = {};
    for (const series of (metrics && metrics.series) || []) byName[series.name] = series.points || [];
    const loss = byName.loss || [];
    const positions = Object.keys(byName)
      .map((name) => ({ name, match: POSITION_METRIC.exec(name) }))
      .filter((item) => item.match)
      .map((item) => ({ position: Number(item.match[1]), x: byName[item.name].map((p) => p.step),
                        y: byName[item.name].map((p) => nullable(p.value)) }))
      .sort((a, b) => a.position - b.position);
    return { loss: { x: loss.map((p) => p.step), y: loss.map((p) => nullable(p.value)) }, positions };
  }

  function nullable(value) {
    return isNumber(value) ? value : null;
  }

  /** Align several (x, y) series on the union of their x values, as uPlot wants one x array. */
  function align(seriesList) {
    const xs = Array.from(new Set(seriesList.flatMap((s) => s.x))).sort((a, b) => a - b);
    const ys = seriesList.map((s) => {
      const lookup = new Map(s.x.map((x, i) => [x, s.y[i]]));
      return xs.map((x) => (lookup.has(x) ? lookup.get(x) : null));
    });
    return [xs, ...ys];
  }

  /**
   * A y range that keeps the first steps' outliers (a loss of 62 at step 1 when the run settles near 3)
   * from flattening everything after them: the axis stops a little above the highest value of the last
   * 90 % of the points, when the full range would squeeze those to less than half the chart's height.
   * Returns {range, above: [[x, y]...]} (the points left above the axis, all among the first 10 %) or null.
   */
  function clipLeadingOutliers(x, y) {
    const points = x.map((step, i) => [step, y[i]]).filter((p) => isNumber(p[1]));
    if (points.length < CLIP_MIN_POINTS) return null;
    const tail = points.slice(Math.ceil(points.length * CLIP_LEADING_SHARE)).map((p) => p[1]);
    const low = Math.min(...points.map((p) => p[1]));
    const high = Math.max(...points.map((p) => p[1]));
    const tailHigh = Math.max(...tail);
    if (tailHigh - low >= 0.5 * (high - low)) return null;
    const top = tailHigh + 0.1 * (tailHigh - low);
    return { range: [low - 0.05 * (top - low), top], above: points.filter((p) => p[1] > top) };
  }

  /* ---- figures -------------------------------------------------------------------------- */

  function figure(container, opts, table) {
    const canvasHost = el("div", { class: "ds-chart", role: "img", "aria-label": opts.summary || opts.title });
    const details = el("details", { class: "ds-chart-data" }, [el("summary", { text: "Data" }), table]);
    const fig = el("figure", { class: "ds-figure", "data-chart": opts.id || null }, [
      el("figcaption", { text: opts.title }), canvasHost, details,
    ]);
    if (opts.note) fig.append(el("p", { class: "ds-chart-note", text: opts.note }));
    container.append(fig);
    return { fig, canvasHost };
  }

  function dataTable(headers, rows) {
    return el("table", { class: "ds-data-table" }, [
      el("thead", {}, [el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })))]),
      el("tbody", {}, rows.map((row) => el("tr", {}, row.map((cell) => el("td", { text: cell }))))),
    ]);
  }

  function widthOf(host) {
    return Math.max(280, Math.floor(host.getBoundingClientRect().width || host.parentElement.clientWidth || 560));
  }

  function mount(host, options, data) {
    const plot = new global.uPlot({ width: widthOf(host), height: HEIGHT, ...options }, data, host);
    host.plot = plot; // the instance, for the browser tests and for a look from the console
    if (global.ResizeObserver) {
      // The figure's width follows the page; keep the canvas in step instead of overflowing it.
      const observer = new ResizeObserver(() => {
        const width = widthOf(host);
        if (Math.abs(width - plot.width) > 4) plot.setSize({ width, height: HEIGHT });
      });
      observer.observe(host);
    }
    return plot;
  }

  function axes(xLabel, yLabel) {
    return [{ label: xLabel, stroke: "#333", grid: { stroke: "#e5e5e5" } },
      { label: yLabel, stroke: "#333", grid: { stroke: "#e5e5e5" }, size: 56 }];
  }

  /**
   * Lines over a numeric x axis. series: [{label, x, y}]; opts.yRange: [min, max]. The legend shows the
   * values under the cursor, and each series' latest value while the cursor is off the chart (uPlot's
   * own text there is a bare "--"). Returns the uPlot instance (or null).
   */
  function lineChart(container, opts) {
    const series = (opts.series || []).filter((s) => s.x && s.x.length);
    const rows = [];
    const data = series.length ? align(series) : [[]];
    for (let i = 0; i < data[0].length; i++) rows.push([String(data[0][i]), ...series.map((_, j) => fmt(data[j + 1][i], 4))]);
    const { canvasHost } = figure(container, { ...opts, note: series.length ? opts.note : opts.empty || "No data yet." },
                                  dataTable([opts.xLabel, ...series.map((s) => s.label)], rows));
    if (!series.length) return null;
    const lastX = data[0][data[0].length - 1];
    const idle = (idx) => idx === null || idx === undefined;
    return mount(canvasHost, {
      scales: { x: { time: false }, y: opts.yRange ? { range: opts.yRange } : {} },
      axes: axes(opts.xLabel, opts.yLabel),
      series: [{ label: opts.xLabel, value: (u, v, i, idx) => (idle(idx) ? `${lastX} (latest)` : String(v)) },
        ...series.map((s, i) => {
          const last = latest(data[i + 1]);
          return {
            label: s.label, stroke: colour(i), width: 2, spanGaps: true,
            value: (u, v, j, idx) => fmt(idle(idx) ? last : v, 4),
            points: { show: opts.points === undefined ? data[0].length <= 40 : opts.points },
          };
        })],
    }, data);
  }

  /* ---- the training curves -------------------------------------------------------------- */

  /** The loss curve of a training run (see trainingFromRecords / trainingFromSeries). */
  function lossCurve(container, training) {
    const loss = (training && training.loss) || { x: [], y: [] };
    const last = latest(loss.y);
    const clip = clipLeadingOutliers(loss.x, loss.y);
    let note;
    if (clip) {
      const peak = clip.above.reduce((a, b) => (b[1] > a[1] ? b : a));
      const steps = clip.above.length === 1 ? `step ${clip.above[0][0]}`
        : `${clip.above.length} of the first logged steps (${clip.above[0][0]}–${clip.above[clip.above.length - 1][0]})`;
      note = `Y axis clipped at ${fmt(clip.range[1], 2)} so the rest of the run stays readable: ${steps} ` +
             `lie above it, up to ${fmt(peak[1], 2)} at step ${peak[0]}. Hover, or open Data, for every value.`;
    }
    return lineChart(container, {
      id: "loss", title: "Training loss", xLabel: "step", yLabel: clip ? "loss (axis clipped)" : "loss",
      summary: `Training loss over ${loss.x.length} logged steps; latest ${fmt(last, 3)}.${note ? ` ${note}` : ""}`,
      series: loss.x.length ? [{ label: "loss", x: loss.x, y: loss.y }] : [], empty: "No training metrics yet.",
      yRange: clip ? clip.range : undefined, note,
    });
  }

  /** Training accuracy of each block position over steps. */
  function positionAccuracyCurves(container, training) {
    const positions = (training && training.positions) || [];
    const summary = positions.map((p) => `position ${p.position} ${fmt(latest(p.y), 2)}`).join(", ");
    return lineChart(container, {
      id: "position-accuracy", title: "Training accuracy by draft position", xLabel: "step", yLabel: "accuracy",
      summary: `Training accuracy per draft position over steps; latest: ${summary || "none"}.`, yRange: [0, 1],
      series: positions.map((p) => ({ label: `position ${p.position}`, x: p.x, y: p.y })),
      empty: "No per-position accuracy recorded yet.",
    });
  }

  global.DraftsmithCharts = {
    PALETTE, colour, fmt, isNumber, nullable, el, dataTable,
    trainingFromRecords, trainingFromSeries, positionMetricNames, lineChart, clipLeadingOutliers,
    lossCurve, positionAccuracyCurves,
  };
})(typeof window !== "undefined" ? window : this);
