/* Draftsmith bar charts: acceptance by draft position and by prompt category, speedup by block size and
 * τ by job, for the dashboard and report.html (one copy; see README.md beside this file).
 *
 * A classic script loaded after charts.js, whose window.DraftsmithCharts it extends. The bars are HTML,
 * not canvas: each row's label sits in its own grid cell and wraps instead of overlapping its
 * neighbours however long it is (category names, job names), and every bar carries its value and the
 * count it rests on as text. A figure resting on fewer than FEW_CYCLES cycles is greyed and hatched: a
 * late draft position's 1.00 may come from 2 cycles out of 2.
 */
(function (global) {
  "use strict";

  const C = global.DraftsmithCharts;
  const { el, fmt, isNumber, nullable, colour, dataTable } = C;
  const FEW_CYCLES = 20;

  /** A probability as the report reads it: 1.00, 0.24, and two significant digits below 0.1 (0.0012). */
  function share(value) {
    if (!isNumber(value)) return "–";
    if (value === 0) return "0";
    return value >= 0.095 ? value.toFixed(2) : Number(value.toPrecision(2)).toString();
  }

  /** A number with exactly `digits` decimals (1.30, not 1.3: the bars' texts line up). */
  function fixed(value, digits) {
    return isNumber(value) ? value.toFixed(digits) : "–";
  }

  function clamp01(value) {
    return Math.min(1, Math.max(0, value));
  }

  function legend(series, few) {
    const items = series.length > 1 ? series.map((label, i) => {
      const swatch = el("span", { class: "ds-swatch", "aria-hidden": "true" });
      swatch.style.background = colour(i);
      return el("li", {}, [swatch, label]);
    }) : [];
    if (few) {
      items.push(el("li", { class: "ds-legend-few" }, [el("span", { class: "ds-swatch ds-swatch-few", "aria-hidden": "true" }),
        `grey, hatched: fewer than ${FEW_CYCLES} cycles behind the figure, too few to trust`]));
    }
    return el("ul", { class: "ds-bar-legend" }, items);
  }

  function barNode(bar, seriesIndex, column, textWidth) {
    const track = el("div", { class: "ds-bar-track" });
    const text = el("span", { class: "ds-bar-text", text: bar ? bar.text : "–" });
    text.style.minWidth = `min(${textWidth}, 100%)`; // a narrow screen wraps it under its bar instead
    const node = el("div", { class: `ds-bar${bar && bar.few ? " ds-bar-few" : ""}`, "data-series": seriesIndex,
                             "data-value": bar && isNumber(bar.value) ? bar.value : null, title: bar && bar.title }, [track, text]);
    if (bar && isNumber(bar.value)) {
      const fill = el("div", { class: "ds-bar-fill" });
      // Width and colour through the CSSOM: the dashboard's policy refuses style attributes, not this.
      fill.style.width = `${100 * clamp01((bar.value - column.min) / (column.max - column.min))}%`;
      if (!bar.few) fill.style.background = colour(seriesIndex);
      track.append(fill);
    }
    if (bar && bar.few) track.style.borderLeft = `4px solid ${colour(seriesIndex)}`; // greyed, but whose it is still shows
    if (isNumber(column.reference)) {
      const line = el("div", { class: "ds-bar-reference", "aria-hidden": "true" });
      line.style.left = `${100 * clamp01((column.reference - column.min) / (column.max - column.min))}%`;
      track.append(line);
    }
    return node;
  }

  /**
   * Horizontal bars. opts: {id, title, summary, note, empty, rowHeader, series: [label...],
   * columns: [{label, min, max, reference?}], rows: [{label, strong?, cells: [[bar per series] per column]}]}
   * with bar = {value, text, few?, title?} or null. Returns the figure.
   */
  function barChart(container, opts) {
    const rows = opts.rows || [];
    const columns = opts.columns || [];
    const series = opts.series || [];
    const fig = el("figure", { class: "ds-figure ds-bar-figure", "data-chart": opts.id || null }, [el("figcaption", { text: opts.title })]);
    container.append(fig);
    if (!rows.length) {
      fig.append(el("p", { class: "ds-chart-note", text: opts.empty || "No data yet." }));
      return fig;
    }
    const few = rows.some((row) => row.cells.some((cell) => cell.some((bar) => bar && bar.few)));
    if (series.length > 1 || few) fig.append(legend(series, few));
    // Every text of a column gets the width of its longest, so the tracks of a column line up.
    const widths = columns.map((_, c) => `${Math.max(2, ...rows.flatMap((row) => row.cells[c].map((bar) => (bar ? bar.text.length : 1))))}ch`);
    const grid = el("div", { class: "ds-bars", role: "img", "aria-label": opts.summary || opts.title });
    grid.style.gridTemplateColumns = `fit-content(12rem) repeat(${columns.length}, minmax(0, 1fr))`;
    if (columns.some((column) => column.label)) {
      grid.append(el("div", { class: "ds-bars-head", text: opts.rowHeader || "" }),
        ...columns.map((column) => el("div", { class: "ds-bars-head", text: column.label || "" })));
    }
    for (const row of rows) {
      grid.append(el("div", { class: `ds-bars-label${row.strong ? " ds-bars-strong" : ""}`, text: row.label }),
        ...row.cells.map((cell, c) => el("div", { class: "ds-bars-cell" }, cell.map((bar, s) => barNode(bar, s, columns[c], widths[c])))));
    }
    const headers = [opts.rowHeader || "", ...columns.flatMap((column) => series.map((label) => (series.length > 1 ? `${column.label} — ${label}` : column.label)))];
    const table = dataTable(headers, rows.map((row) => [row.label, ...row.cells.flatMap((cell) => cell.map((bar) => (bar ? bar.text : "–")))]));
    fig.append(grid, el("details", { class: "ds-chart-data" }, [el("summary", { text: "Data" }), table]));
    if (opts.note) fig.append(el("p", { class: "ds-chart-note", text: opts.note }));
    return fig;
  }

  /* ---- the report's bar charts (report.json in, figures out) ---------------------------- */

  /**
   * Per draft position: {position, reached, accepted, offered, conditional, unconditional} from
   * acceptance_by_position, or, for a report older than it, the conditional rates alone.
   */
  function positionsOf(report) {
    const r = report || {};
    if (Array.isArray(r.acceptance_by_position)) return { counted: true, items: r.acceptance_by_position };
    return { counted: false, items: (r.tau_per_position || []).map((value, i) => ({ position: i + 1, conditional: nullable(value) })) };
  }

  function counted(value, accepted, total) {
    return isNumber(total) ? `${share(value)} (${accepted}/${total})` : share(value);
  }

  /** Conditional and unconditional acceptance per draft position, with the cycles behind each. */
  function acceptanceByPosition(container, runs) {
    const measured = runs.map((run) => ({ label: run.label, ...positionsOf(run.report) }));
    const width = Math.max(0, ...measured.map((m) => m.items.length));
    const anyCounted = measured.some((m) => m.counted);
    const columns = [{ label: "conditional: P(draft k accepted | drafts 1…k−1 accepted)", min: 0, max: 1 }];
    if (anyCounted) columns.push({ label: "unconditional: P(drafts 1…k all accepted)", min: 0, max: 1 });
    const rows = Array.from({ length: width }, (_, i) => ({
      label: String(i + 1),
      cells: columns.map((_, c) => measured.map((m) => {
        const item = m.items[i];
        if (!item || (c === 1 && !m.counted)) return null;
        const value = c === 0 ? nullable(item.conditional) : nullable(item.unconditional);
        const total = c === 0 ? item.reached : item.offered;
        return {
          value, text: counted(value, item.accepted, total), few: isNumber(total) && total < FEW_CYCLES,
          title: isNumber(total) ? `${m.label}, position ${i + 1}: accepted on ${item.accepted} of the ${total} cycles ` +
            (c === 0 ? "that reached it (drafts before it accepted)" : "that offered it") : null,
        };
      })),
    }));
    const summary = measured.map((m) => `${m.label}: ` + m.items.map((item) => `position ${item.position} ` +
      `conditional ${counted(nullable(item.conditional), item.accepted, item.reached)}` +
      (m.counted ? `, unconditional ${counted(nullable(item.unconditional), item.accepted, item.offered)}` : "")).join("; ")).join(". ");
    const old = measured.filter((m) => !m.counted).map((m) => m.label);
    return barChart(container, {
      id: "acceptance-by-position", title: "Acceptance by draft position", rowHeader: "position",
      summary: `Acceptance per draft position, with accepted/cycles. ${summary}`, series: measured.map((m) => m.label),
      columns, rows, empty: "No validation report yet.",
      note: old.length ? `${old.join(", ")}: a report older than per-position counts, conditional acceptance only.` : null,
    });
  }

  /** τ per prompt category (acceptance_by_category), with the cycles each rests on. */
  function acceptanceByCategory(container, runs) {
    const byCategory = (run) => (run.report && run.report.acceptance_by_category) || {};
    const names = Array.from(new Set(runs.flatMap((run) => Object.keys(byCategory(run))))).sort();
    const taus = runs.flatMap((run) => names.map((name) => nullable((byCategory(run)[name] || {}).tau))).filter(isNumber);
    const rows = names.map((name) => ({
      label: name,
      cells: [runs.map((run) => {
        const entry = byCategory(run)[name];
        if (!entry) return null;
        const cycles = entry.cycles;
        return { value: nullable(entry.tau), text: `${fixed(entry.tau, 2)}${isNumber(cycles) ? ` · ${cycles} cycles` : ""}`,
                 few: isNumber(cycles) && cycles < FEW_CYCLES };
      })],
    }));
    const summary = runs.map((run) => `${run.label}: ` + names.map((name) => {
      const entry = byCategory(run)[name] || {};
      return `${name} ${fixed(entry.tau, 2)}${isNumber(entry.cycles) ? ` on ${entry.cycles} cycles` : ""}`;
    }).join(", ")).join("; ");
    return barChart(container, {
      id: "acceptance-by-category", title: "τ by prompt category", rowHeader: "category",
      summary: `Mean acceptance length per prompt category. ${summary}`, series: runs.map((run) => run.label), rows,
      columns: [{ label: "τ (bars start at 1: no draft accepted)", min: 1, max: 1 + 1.1 * Math.max(0.1, ...taus.map((t) => t - 1)) }],
      empty: "This report has no per-category acceptance.",
    });
  }

  /** Estimated speedup for each block size up to the trained one, against the 1× of the target alone. */
  function speedupByBlockSize(container, report) {
    const speedups = (report && report.estimated_speedup_by_block_size) || {};
    const sizes = Object.keys(speedups).map(Number).filter(Number.isFinite).sort((a, b) => a - b);
    const values = sizes.map((b) => nullable(speedups[b])).filter(isNumber);
    const best = report && report.recommended_block_size;
    const slower = values.length && values.every((v) => v < 1);
    return barChart(container, {
      id: "speedup-by-block-size", title: "Estimated speedup by block size", rowHeader: "block size",
      summary: `Estimated speedup per block size: ${sizes.map((b) => `${b}: ${fmt(speedups[b], 2)}×`).join(", ")}. ` +
        `Best: ${best}.${slower ? " Every block size is estimated below 1×." : ""}`,
      series: ["estimated speedup"],
      columns: [{ label: "estimated speedup (dashed line: 1×, the target alone)", min: 0, max: Math.max(1.2, 1.1 * Math.max(0, ...values)), reference: 1 }],
      rows: sizes.map((b) => ({ label: b === best ? `${b} (best)` : String(b), strong: b === best,
                                cells: [[{ value: nullable(speedups[b]), text: `${fixed(speedups[b], 2)}×` }]] })),
      note: slower ? "Every block size is estimated below 1× on the validation machine: there, speculative decoding " +
                     "with this drafter is slower than the target alone." : null,
      empty: "This report has no per-block-size estimate.",
    });
  }

  /** τ of several jobs side by side (the compare view), with the cycles each rests on. */
  function tauByRun(container, runs) {
    const taus = runs.map((run) => nullable((run.report || {}).tau));
    return barChart(container, {
      id: "tau-by-job", title: "τ by job", rowHeader: "job", series: ["τ"],
      summary: `Mean acceptance length: ${runs.map((run, i) => `${run.label} ${fmt(taus[i], 3)}`).join(", ")}.`,
      columns: [{ label: "τ (bars start at 1: no draft accepted)", min: 1, max: 1 + 1.1 * Math.max(0.1, ...taus.filter(isNumber).map((t) => t - 1)) }],
      rows: runs.map((run, i) => {
        const cycles = (run.report || {}).cycles;
        return { label: run.label, cells: [[{ value: taus[i], text: `${fixed(taus[i], 3)}${isNumber(cycles) ? ` · ${cycles} cycles` : ""}`,
                                              few: isNumber(cycles) && cycles < FEW_CYCLES }]] };
      }),
      empty: "None of these jobs has a validation report yet.",
    });
  }

  Object.assign(C, { FEW_CYCLES, share, barChart, acceptanceByPosition, acceptanceByCategory, speedupByBlockSize, tauByRun });
})(typeof window !== "undefined" ? window : this);
