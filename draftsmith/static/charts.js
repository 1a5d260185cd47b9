/* Draftsmith charts: the one copy of the chart code that the web dashboard serves and that
 * `report.html` inlines (see README.md beside this file for why it lives here).
 *
 * A classic script, not an ES module, so the report can inline it inside a plain <script> and open
 * from disk. It needs uPlot (vendor/uPlot.iife.min.js) loaded first and defines window.DraftsmithCharts.
 *
 * Every chart is a <figure> with a caption, a canvas (role="img" with a text summary) and the same
 * numbers as a table under "Data": canvas charts are invisible to screen readers, tables are not.
 * Inputs are read defensively: report.json gains keys over time and older reports lack some, so a
 * missing value draws an empty chart with a note instead of throwing.
 */
(function (global) {
  "use strict";

  // Okabe-Ito: distinguishable with the common colour-vision deficiencies, 3:1 or more against white.
  const PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#8B6A00", "#3F7FBF", "#000000"];
  const HEIGHT = 240;

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

  function axes(xLabel, yLabel, xValues) {
    const x = { label: xLabel, stroke: "#333", grid: { stroke: "#e5e5e5" } };
    if (xValues) x.values = xValues;
    return [x, { label: yLabel, stroke: "#333", grid: { stroke: "#e5e5e5" }, size: 56 }];
  }

  /**
   * Lines over a numeric x axis. series: [{label, x, y}]. Returns the uPlot instance (or null).
   */
  function lineChart(container, opts) {
    const series = (opts.series || []).filter((s) => s.x && s.x.length);
    const rows = [];
    const data = series.length ? align(series) : [[]];
    for (let i = 0; i < data[0].length; i++) rows.push([String(data[0][i]), ...series.map((_, j) => fmt(data[j + 1][i], 4))]);
    const { canvasHost } = figure(container, { ...opts, note: series.length ? opts.note : opts.empty || "No data yet." },
                                  dataTable([opts.xLabel, ...series.map((s) => s.label)], rows));
    if (!series.length) return null;
    return mount(canvasHost, {
      scales: { x: { time: false }, y: opts.yRange ? { range: opts.yRange } : {} },
      axes: axes(opts.xLabel, opts.yLabel),
      series: [{ label: opts.xLabel }, ...series.map((s, i) => ({
        label: s.label, stroke: colour(i), width: 2, spanGaps: true,
        points: { show: opts.points === undefined ? data[0].length <= 40 : opts.points },
      }))],
    }, data);
  }

  /**
   * Values per named category. One series draws bars; several draw dots, each series shifted a
   * little along x so that none hides another (comparisons), joined by a dashed line when the
   * categories are ordered (opts.connect). series: [{label, values}] with values[i] for categories[i].
   */
  function categoryChart(container, opts) {
    const categories = opts.categories || [];
    const series = (opts.series || []).filter((s) => (s.values || []).some(isNumber));
    const rows = categories.map((c, i) => [String(c), ...series.map((s) => fmt(s.values[i], 4))]);
    const { canvasHost } = figure(container, { ...opts, note: series.length ? opts.note : opts.empty || "No data yet." },
                                  dataTable([opts.xLabel, ...series.map((s) => s.label)], rows));
    if (!series.length || !categories.length) return null;
    const bars = series.length === 1 && global.uPlot.paths && global.uPlot.paths.bars;
    const shift = (j) => (series.length === 1 ? 0 : (j - (series.length - 1) / 2) * Math.min(0.6 / series.length, 0.2));
    const data = align(series.map((s, j) => ({ x: categories.map((_, i) => i + shift(j)), y: categories.map((_, i) => nullable(s.values[i])) })));
    const nameAt = (v) => categories[Math.round(v)];
    const xAxis = axes(opts.xLabel, opts.yLabel, (u, splits) => splits.map((v) => (nameAt(v) === undefined ? "" : String(nameAt(v)))));
    xAxis[0].splits = () => categories.map((_, i) => i);
    return mount(canvasHost, {
      scales: { x: { time: false, range: [-0.6, categories.length - 0.4] }, y: { range: opts.yRange || ((u, min, max) => [0, (max > 0 ? max : 1) * 1.1]) } },
      axes: xAxis,
      series: [{ label: opts.xLabel, value: (u, v) => (v === null || nameAt(v) === undefined ? "–" : String(nameAt(v))) },
        ...series.map((s, i) => (bars
          ? { label: s.label, stroke: colour(i), fill: colour(i) + "cc", width: 1,
              paths: global.uPlot.paths.bars({ size: [0.6, 64] }), points: { show: false } }
          : { label: s.label, stroke: colour(i), width: opts.connect ? 1.5 : 0, spanGaps: true,
              paths: opts.connect ? undefined : () => null, dash: opts.connect ? [4, 3] : undefined,
              points: { show: true, size: 11, width: 2, fill: colour(i), stroke: colour(i) } })),
      ],
    }, data);
  }

  /* ---- the report's charts (report.json in, figures out) ------------------------------- */

  /** Conditional acceptance per block position (tau_per_position) for one or more reports. */
  function acceptanceByPosition(container, runs) {
    const width = Math.max(0, ...runs.map((r) => ((r.report && r.report.tau_per_position) || []).length));
    const categories = Array.from({ length: width }, (_, i) => i + 1);
    const series = runs.map((r) => ({ label: r.label, values: ((r.report && r.report.tau_per_position) || []).map(nullable) }));
    const summary = series.map((s) => `${s.label}: ${s.values.map((v) => fmt(v, 2)).join(", ")}`).join("; ");
    return categoryChart(container, {
      id: "acceptance-by-position", title: "Acceptance by draft position",
      summary: `Conditional acceptance per draft position. ${summary}`, xLabel: "draft position", yLabel: "P(accepted)",
      categories, series, yRange: [0, 1], connect: true, empty: "No validation report yet.",
    });
  }

  /** tau per prompt category (acceptance_by_category) for one or more reports. */
  function acceptanceByCategory(container, runs) {
    const names = Array.from(new Set(runs.flatMap((r) => Object.keys((r.report && r.report.acceptance_by_category) || {})))).sort();
    const series = runs.map((r) => ({
      label: r.label,
      values: names.map((n) => nullable((((r.report && r.report.acceptance_by_category) || {})[n] || {}).tau)),
    }));
    const summary = series.map((s) => `${s.label}: ` + names.map((n, i) => `${n} ${fmt(s.values[i], 2)}`).join(", ")).join("; ");
    return categoryChart(container, {
      id: "acceptance-by-category", title: "τ by prompt category",
      summary: `Mean acceptance length per prompt category. ${summary}`, xLabel: "category", yLabel: "τ",
      categories: names, series, empty: "This report has no per-category acceptance.",
    });
  }

  /** Estimated speedup and expected τ for each block size up to the trained one. */
  function speedupByBlockSize(container, report) {
    const speedups = (report && report.estimated_speedup_by_block_size) || {};
    const sizes = Object.keys(speedups).map(Number).filter(Number.isFinite).sort((a, b) => a - b);
    return categoryChart(container, {
      id: "speedup-by-block-size", title: "Estimated speedup by block size",
      summary: `Estimated speedup per block size: ${sizes.map((b) => `${b}: ${fmt(speedups[b], 2)}×`).join(", ")}. ` +
        `Recommended: ${report && report.recommended_block_size}.`,
      xLabel: "block size", yLabel: "speedup ×", categories: sizes,
      series: [{ label: "estimated speedup", values: sizes.map((b) => nullable(speedups[b])) }],
      empty: "This report has no per-block-size estimate.",
    });
  }

  /** The loss curve of a training run (see trainingFromRecords / trainingFromSeries). */
  function lossCurve(container, training) {
    const loss = (training && training.loss) || { x: [], y: [] };
    const last = loss.y.filter(isNumber).slice(-1)[0];
    return lineChart(container, {
      id: "loss", title: "Training loss", xLabel: "step", yLabel: "loss",
      summary: `Training loss over ${loss.x.length} logged steps; latest ${fmt(last, 3)}.`,
      series: loss.x.length ? [{ label: "loss", x: loss.x, y: loss.y }] : [], empty: "No training metrics yet.",
    });
  }

  /** Training accuracy of each block position over steps. */
  function positionAccuracyCurves(container, training) {
    const positions = (training && training.positions) || [];
    const latest = positions.map((p) => `position ${p.position} ${fmt(p.y.filter(isNumber).slice(-1)[0], 2)}`).join(", ");
    return lineChart(container, {
      id: "position-accuracy", title: "Training accuracy by draft position", xLabel: "step", yLabel: "accuracy",
      summary: `Training accuracy per draft position over steps; latest: ${latest || "none"}.`, yRange: [0, 1],
      series: positions.map((p) => ({ label: `position ${p.position}`, x: p.x, y: p.y })),
      empty: "No per-position accuracy recorded yet.",
    });
  }

  global.DraftsmithCharts = {
    PALETTE, fmt, isNumber, el, dataTable,
    trainingFromRecords, trainingFromSeries, positionMetricNames, lineChart, categoryChart,
    acceptanceByPosition, acceptanceByCategory, speedupByBlockSize, lossCurve, positionAccuracyCurves,
  };
})(typeof window !== "undefined" ? window : this);
