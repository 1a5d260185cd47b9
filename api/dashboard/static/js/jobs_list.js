// The jobs list: newest first, filtered by status and label (kept in the URL so a filtered view can
// be shared), refreshed every few seconds while the tab is visible, with τ and speedup read from
// each job's validation report, and the time left of every running job (eta.js: the running stage's
// from its measured rate, the whole job's where the API's estimate covers the rest). Ticking two or
// more jobs opens them side by side.

import { api, ApiError } from "./api.js";
import { fmtAge, fmtNum, h, notify, replace, statusBadge } from "./dom.js";
import { jobEstimate, jobRemaining, latestAttempts, leftText, stageRemaining } from "./eta.js";
import { jobSummary } from "./report_data.js";

const REFRESH_MS = 3000;
const STATUS_FILTERS = {
  "": "any status",
  active: "active (queued or running)",
  queued: "queued", preparing: "preparing", generating: "generating", training: "training",
  validating: "validating", exporting: "exporting", publishing: "publishing", waiting: "waiting", cancelling: "cancelling",
  succeeded: "succeeded", failed: "failed", cancelled: "cancelled",
};
const ACTIVE = ["queued", "preparing", "generating", "training", "validating", "exporting", "publishing", "waiting",
  "cancelling"];

function statusQuery(filter) {
  if (!filter) return undefined;
  return filter === "active" ? ACTIVE : [filter];
}

function labelQuery(text) {
  return (text || "").split(/[\s,]+/).map((item) => item.trim()).filter(Boolean);
}

export function jobsList(main, route) {
  const filter = { status: route.query.get("status") || "", label: route.query.get("label") || "" };
  const selected = new Set();
  let timer = null;
  let stopped = false;
  let pages = 1;

  const statusSelect = h("select", { id: "filter-status", name: "status" },
    Object.entries(STATUS_FILTERS).map(([value, text]) => h("option", { value, text, selected: value === filter.status })));
  const labelInput = h("input", { id: "filter-label", name: "label", type: "text", value: filter.label,
                                  placeholder: "team:search", "aria-describedby": "filter-label-help" });
  const filterError = h("p", { id: "filter-error", class: "field-error", role: "alert" });
  const form = h("form", { class: "filters", role: "search", "aria-label": "Filter jobs" },
    h("div", { class: "field inline" }, h("label", { for: "filter-status", text: "Status" }), statusSelect),
    h("div", { class: "field inline" }, h("label", { for: "filter-label", text: "Labels" }), labelInput,
      h("span", { id: "filter-label-help", class: "help", text: "key:value, several separated by spaces (all must match)" })),
    h("button", { type: "submit", text: "Apply filters" }),
    filterError);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const params = new URLSearchParams();
    if (statusSelect.value) params.set("status", statusSelect.value);
    if (labelInput.value.trim()) params.set("label", labelInput.value.trim());
    const query = params.toString();
    window.location.hash = `#/jobs${query ? `?${query}` : ""}`;
  });
  statusSelect.addEventListener("change", () => form.requestSubmit());

  const compareButton = h("button", { type: "button", class: "primary", id: "compare-selected", disabled: true,
                                      text: "Compare selected" });
  compareButton.addEventListener("click", () => {
    window.location.hash = `#/compare?jobs=${[...selected].map(encodeURIComponent).join(",")}`;
  });
  const updated = h("span", { class: "muted", id: "list-updated", "aria-live": "off" });
  const tbody = h("tbody");
  const table = h("table", { class: "jobs", id: "jobs-table" },
    h("caption", { class: "visually-hidden", text: "Jobs, newest first" }),
    h("thead", {}, h("tr", {}, ["Compare", "Job", "Status", "Target", "Variant", "Block size", "τ", "Speedup", "Age"]
      .map((title) => h("th", { scope: "col", text: title })))),
    tbody);
  const more = h("button", { type: "button", id: "load-more", hidden: true, text: "Show more jobs" });
  more.addEventListener("click", () => { pages += 1; refresh(); });
  const empty = h("p", { class: "empty", hidden: true, text: "No jobs match. Create one with New job." });

  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Jobs" }),
      h("div", { class: "actions" }, compareButton, h("a", { class: "button", href: "#/jobs/new", text: "New job" }))),
    form, h("p", { class: "muted" }, updated), h("div", { class: "table-wrap" }, table), empty, more);

  function updateCompare() {
    compareButton.disabled = selected.size < 2;
    compareButton.textContent = selected.size ? `Compare selected (${selected.size})` : "Compare selected";
  }

  function row(job) {
    const spec = job.spec || {};
    const drafter = spec.drafter || {};
    const box = h("input", { type: "checkbox", id: `pick-${job.id}`, checked: selected.has(job.id),
                             "aria-label": `Compare ${job.name || job.id}` });
    box.addEventListener("change", () => {
      if (box.checked) selected.add(job.id); else selected.delete(job.id);
      updateCompare();
    });
    const tau = h("td", { class: "num", "data-col": "tau", text: "…" });
    const speedup = h("td", { class: "num", "data-col": "speedup", text: "…" });
    const progress = job.stage_progress !== null && job.stage_progress !== undefined && !["succeeded", "failed", "cancelled"].includes(job.status)
      ? h("span", { class: "muted", text: ` ${Math.round(job.stage_progress)}%` }) : null;
    const eta = h("div", { class: "muted", "data-col": "eta" });
    const labels = Object.entries(job.labels || {}).map(([k, v]) => h("span", { class: "label-chip", text: `${k}:${v}` }));
    const tr = h("tr", { "data-job-id": job.id, "data-status": job.status },
      h("td", {}, box),
      h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(job.id)}`, text: job.name || job.id }),
        job.name ? h("div", { class: "muted mono", text: job.id }) : null, labels.length ? h("div", {}, labels) : null),
      h("td", {}, statusBadge(job.status, job.status_text), progress, eta,
        job.error ? h("div", { class: "muted", title: job.error.message, text: `${job.error.code} in ${job.error.stage || "?"}` }) : null),
      h("td", { class: "mono", text: (spec.target || {}).uri || "–" }),
      h("td", { text: drafter.variant || "–" }),
      h("td", { class: "num", text: drafter.block_size ?? "–" }),
      tau, speedup,
      h("td", { title: job.created_at, "data-col": "age", text: fmtAge(job.created_at) }));
    jobSummary(job).then((summary) => {
      tau.textContent = fmtNum(summary.tau, 3);
      speedup.textContent = summary.speedup === null ? "–" : `${fmtNum(summary.speedup, 2)}×`;
    }).catch(() => { tau.textContent = "?"; speedup.textContent = "?"; });
    return tr;
  }

  /**
   * The running stage's time left and the whole job's, counted down at every refresh. The list has no
   * event timestamps: the job's updated_at (bumped by every event) stands for when its progress was reported.
   */
  function showEta(tr, job) {
    const cell = tr.querySelector("[data-col=eta]");
    const run = Object.values(latestAttempts(job)).find((r) => r.status === "running");
    const stage = run ? stageRemaining(run, job.updated_at) : null;
    if (!stage) {
      cell.textContent = "";
      return;
    }
    cell.textContent = `${run.stage} ${leftText(stage.seconds)}`;
    cell.dataset.eta = String(Math.round(stage.seconds));
    jobEstimate(job, api).then((estimate) => {
      const whole = jobRemaining(job, estimate, stage);
      if (whole && !stopped) {
        cell.textContent = `${run.stage} ${leftText(stage.seconds)}; whole job ${leftText(whole.seconds)}`;
        cell.dataset.jobEta = String(Math.round(whole.seconds));
      }
    });
  }

  // Rows are kept while their job is unchanged, so a refresh does not take the keyboard focus
  // away from a checkbox or link inside the table.
  const rows = new Map(); // job id -> {tr, version}
  function render(jobs) {
    const wanted = jobs.map((job) => {
      const version = `${job.updated_at}|${job.status}|${job.stage_progress}`;
      const known = rows.get(job.id);
      if (known && known.version === version) {
        known.tr.querySelector("[data-col=age]").textContent = fmtAge(job.created_at);
        showEta(known.tr, job);
        return known.tr;
      }
      const tr = row(job);
      showEta(tr, job);
      if (known) known.tr.replaceWith(tr);
      rows.set(job.id, { tr, version });
      return tr;
    });
    const current = [...tbody.children];
    if (wanted.length !== current.length || wanted.some((tr, i) => tr !== current[i])) replace(tbody, wanted);
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const jobs = [];
      let after;
      let hasMore = false;
      for (let page = 0; page < pages; page++) {
        const body = await api("/v1/jobs", { query: { status: statusQuery(filter.status), label: labelQuery(filter.label), limit: 25, after } });
        jobs.push(...body.data);
        hasMore = body.has_more;
        after = body.next_cursor;
        if (!hasMore) break;
      }
      if (stopped) return;
      filterError.textContent = "";
      render(jobs);
      empty.hidden = jobs.length > 0;
      more.hidden = !hasMore;
      updated.textContent = `Updated ${new Date().toLocaleTimeString([], { hour12: false })}; refreshes every ${REFRESH_MS / 1000} s.`;
    } catch (error) {
      if (stopped || !(error instanceof ApiError) || error.status === 401) return;
      if (error.status === 422) {
        filterError.textContent = error.errors.map((e) => `${e.field}: ${e.message}`).join("; ") || error.message;
      } else {
        notify(`Could not refresh the jobs list: ${error.message}`, "error");
      }
    }
    if (!stopped) timer = setTimeout(refresh, document.hidden ? REFRESH_MS * 5 : REFRESH_MS);
  }

  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
