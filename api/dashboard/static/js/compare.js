// Compare jobs side by side: τ, oracle τ, speedup and recipe in one table, and their acceptance by
// position and by category in shared charts (DFlash vs DFlash 2, two block sizes, two recipes).
// The jobs are named in the URL (#/compare?jobs=a,b,c); a picker of recent jobs edits that list.

import { api, ApiError, listJobs } from "./api.js";
import { fmtNum, h, replace, statusBadge } from "./dom.js";
import { findReportArtifact, headline, jobLabel, loadReport } from "./report_data.js";

const MAX_JOBS = 8;

async function loadEntry(jobId) {
  const job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
  const artifacts = (await api(`/v1/jobs/${encodeURIComponent(jobId)}/artifacts`)).data;
  const artifact = findReportArtifact(artifacts);
  const report = artifact ? await loadReport(jobId, artifact) : null;
  return { job, report, label: jobLabel(job) };
}

function picker(selectedIds, candidates) {
  const boxes = candidates.map((job) => {
    const id = `cmp-${job.id}`;
    return h("li", {}, h("input", { type: "checkbox", id, value: job.id, checked: selectedIds.includes(job.id) }),
      h("label", { for: id }, `${jobLabel(job)} `, statusBadge(job.status)));
  });
  const form = h("form", { id: "compare-picker", "aria-labelledby": "picker-title" },
    h("h2", { id: "picker-title", text: "Jobs to compare" }),
    candidates.length ? h("ul", { class: "picker" }, boxes) : h("p", { class: "muted", text: "No finished jobs yet." }),
    h("button", { type: "submit", class: "primary", text: "Compare" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const ids = [...form.querySelectorAll("input:checked")].map((box) => box.value).slice(0, MAX_JOBS);
    window.location.hash = `#/compare?jobs=${ids.map(encodeURIComponent).join(",")}`;
  });
  return form;
}

function table(entries) {
  const rows = entries.map(({ job, report, label }) => {
    const top = headline(report);
    const spec = job.spec || {};
    const drafter = spec.drafter || {};
    const training = spec.training || {};
    return h("tr", { "data-job-id": job.id },
      h("th", { scope: "row" }, h("a", { href: `#/jobs/${encodeURIComponent(job.id)}`, text: label })),
      h("td", {}, statusBadge(job.status)),
      h("td", { text: drafter.variant || "–" }), h("td", { class: "num", text: drafter.block_size ?? "–" }),
      h("td", { text: `${drafter.num_layers ?? "?"} layers, ${training.max_steps ?? "?"} steps, lr ${training.learning_rate ?? "?"}` }),
      h("td", { class: "num", "data-col": "tau", text: report ? fmtNum(top.tau, 3) : "no report yet" }),
      h("td", { class: "num", text: fmtNum(top.oracleTau, 3) }),
      h("td", { class: "num", text: top.speedup === null ? "–" : `${fmtNum(top.speedup, 3)}×` }),
      h("td", { class: "num", text: top.recommended ?? "–" }));
  });
  return h("div", { class: "table-wrap" }, h("table", { class: "compact", id: "compare-table" },
    h("caption", { text: "Side by side" }),
    h("thead", {}, h("tr", {}, ["Job", "Status", "Variant", "Block size", "Recipe", "τ", "oracle τ", "Speedup", "Recommended block"]
      .map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, rows)));
}

export function compareView(main, route) {
  let stopped = false;
  const ids = (route.query.get("jobs") || "").split(",").map((id) => id.trim()).filter(Boolean).slice(0, MAX_JOBS);
  const results = h("div", { id: "compare-results" }, h("p", { class: "muted", text: ids.length ? "Loading…" : "" }));
  const pickerHost = h("div");
  replace(main, h("div", { class: "page-head" }, h("h1", { text: "Compare jobs" })),
    h("p", { class: "muted", text: "Acceptance curves and τ of several drafters side by side. Pick two or more jobs." }),
    pickerHost, results);

  listJobs({ limit: 50 }, 2).then((jobs) => {
    if (!stopped) replace(pickerHost, picker(ids, jobs.filter((j) => ids.includes(j.id) || j.status === "succeeded" || j.status === "exporting" || j.status === "publishing")));
  }).catch(() => {});

  if (!ids.length) {
    replace(results);
    return () => { stopped = true; };
  }
  Promise.allSettled(ids.map(loadEntry)).then((outcomes) => {
    if (stopped) return;
    const entries = [];
    const problems = [];
    outcomes.forEach((outcome, i) => {
      if (outcome.status === "fulfilled") entries.push(outcome.value);
      else if (!(outcome.reason instanceof ApiError && outcome.reason.status === 401)) problems.push(`${ids[i]}: ${outcome.reason.message}`);
    });
    const Charts = window.DraftsmithCharts;
    const withReports = entries.filter((e) => e.report);
    const runs = withReports.map((e) => ({ label: e.label, report: e.report }));
    const position = h("div");
    const category = h("div");
    const tau = h("div");
    replace(results, problems.length ? h("div", { class: "error-summary", role: "alert" }, h("ul", {}, problems.map((p) => h("li", { text: p })))) : null,
      table(entries), h("div", { class: "chart-grid" }, tau, position, category));
    Charts.categoryChart(tau, {
      id: "tau-by-job", title: "τ by job", xLabel: "job", yLabel: "τ", categories: runs.map((r) => r.label),
      summary: `Mean acceptance length: ${withReports.map((e) => `${e.label} ${fmtNum(headline(e.report).tau, 3)}`).join(", ")}.`,
      series: [{ label: "τ", values: withReports.map((e) => headline(e.report).tau) }],
      empty: "None of these jobs has a validation report yet.",
    });
    Charts.acceptanceByPosition(position, runs);
    Charts.acceptanceByCategory(category, runs);
  });
  return () => { stopped = true; };
}
