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
      h("label", { for: id }, `${jobLabel(job)} `, statusBadge(job.status, job.status_text)));
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
      h("td", {}, statusBadge(job.status, job.status_text)),
      h("td", { text: drafter.variant || "–" }), h("td", { class: "num", text: drafter.block_size ?? "–" }),
      h("td", { text: `${drafter.num_layers ?? "?"} layers, ${training.max_steps ?? "?"} steps, lr ${training.learning_rate ?? "?"}` }),
      h("td", { class: "num", "data-col": "tau", text: report ? fmtNum(top.tau, 3) : "no report yet" }),
      h("td", { class: "num", text: fmtNum(top.oracleTau, 3) }),
      h("td", { class: "num", text: top.speedup === null ? "–" : `${fmtNum(top.speedup, 3)}×` }),
      h("td", { class: "num", text: top.recommended ?? "–" }),
      h("td", { "data-col": "advice" }, adviceWords(top.advice)));
  });
  return h("div", { class: "table-wrap" }, h("table", { class: "compact", id: "compare-table" },
    h("caption", { text: "Side by side" }),
    h("thead", {}, h("tr", {}, ["Job", "Status", "Variant", "Block size", "Recipe", "τ", "oracle τ", "Speedup", "Best block", "Serving advice"]
      .map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, rows)));
}

function adviceWords(advice) {
  if (!advice) return "–";
  if (advice.enable === false) return h("span", { class: "bad", title: advice.text, text: "do not enable on hardware like the validation machine" });
  if (advice.enable === true) return h("span", { class: "ok", title: advice.text, text: "enable" });
  return h("span", { class: "warn", title: advice.text, text: "no clear gain" });
}

/** The jobs validation advises against serving, said before the table: never a bare "best block size". */
function againstBanner(entries) {
  const against = entries.filter((e) => { const advice = headline(e.report).advice; return advice && advice.enable === false; });
  if (!against.length) return null;
  return h("div", { class: "advice advice-bad", id: "compare-advice" },
    h("strong", { text: `Validation advises against serving ${against.length === entries.length ? (against.length > 1 ? "all of these drafters" : "this drafter") : `${against.length} of these drafters`}:` }),
    h("ul", {}, against.map((e) => h("li", { "data-job-id": e.job.id }, `${e.label}: ${headline(e.report).advice.text}`))));
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
    const position = h("div", { class: "ds-wide" });
    const category = h("div");
    const tau = h("div");
    replace(results, problems.length ? h("div", { class: "error-summary", role: "alert" }, h("ul", {}, problems.map((p) => h("li", { text: p })))) : null,
      againstBanner(withReports), table(entries), h("div", { class: "chart-grid" }, tau, category, position));
    Charts.tauByRun(tau, runs);
    Charts.acceptanceByPosition(position, runs);
    Charts.acceptanceByCategory(category, runs);
  });
  return () => { stopped = true; };
}
