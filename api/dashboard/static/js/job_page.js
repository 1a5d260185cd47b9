// One job: header with cancel/resume, the stage timeline with durations, the live connection
// state, training curves, validation results, artifacts, serving commands and the event log.
//
// Live updates come from the job's SSE stream (sse.js). Events are appended to the log as they
// arrive and trigger throttled refreshes of the parts they concern (status -> job, artifact ->
// artifacts and report, training progress -> metrics). Metric points are not events, so while the
// job trains the curves are also re-read on a timer.

import { api, ApiError } from "./api.js";
import { fmtDuration, fmtTime, h, notify, replace, secondsBetween, STAGES, statusBadge, TERMINAL, throttle } from "./dom.js";
import { jobEstimate, jobEtaLine, jobRemaining, latestAttempts, leftText, MIN_PROGRESS, stageRemaining } from "./eta.js";
import { resultsPanels, trainingPanel } from "./job_results.js";
import { EventStream } from "./sse.js";

const METRICS_POLL_MS = 5000;
const LEVELS = ["debug", "info", "warning", "error"];

function stageLine(job, stage, run, reportedAt) {
  const attempts = (job.stages || []).filter((s) => s.stage === stage).length;
  let state = "pending";
  let detail = "";
  let left = null;
  if (run) {
    state = run.status;
    const seconds = secondsBetween(run.started_at, run.finished_at);
    if (run.status === "running") {
      const remaining = stageRemaining(run, reportedAt);
      detail = `${run.progress !== null && run.progress !== undefined ? `${Math.round(run.progress)}% · ` : ""}${fmtDuration(seconds)} so far`;
      left = h("span", { class: "stage-eta", "data-eta": remaining ? String(Math.round(remaining.seconds)) : "",
                         text: remaining ? leftText(remaining.seconds) : `time left once past ${MIN_PROGRESS}%` });
    } else {
      detail = `${fmtDuration(seconds)}${run.error_message ? ` · ${run.error_message}` : ""}`;
    }
  }
  const progress = run && run.status === "running" && run.progress !== null && run.progress !== undefined
    ? h("progress", { max: "100", value: String(run.progress), "aria-label": `${stage} progress` }) : null;
  return h("li", { class: `stage stage-${state}`, "data-stage": stage, "data-state": state },
    h("span", { class: "stage-name", text: stage }),
    h("span", { class: "stage-state", text: state }),
    h("span", { class: "stage-detail", "data-duration": "", text: detail }),
    left,
    attempts > 1 ? h("span", { class: "muted", text: ` (${attempts} attempts)` }) : null,
    progress);
}

export function jobPage(main, route) {
  const jobId = route.id;
  const path = `/v1/jobs/${encodeURIComponent(jobId)}`;
  let job = null;
  let stopped = false;
  let metricsTimer = null;
  let tick = null;
  const seen = new Set();

  const title = h("h1", { id: "job-title", text: jobId });
  const badge = h("span", { id: "job-status" });
  const actions = h("div", { class: "actions", id: "job-actions" });
  const facts = h("dl", { class: "facts inline", id: "job-facts" });
  const errorBox = h("div", { id: "job-error" });
  const adviceBox = h("div", { id: "job-advice" });
  const live = h("p", { id: "live-state", class: "live", role: "status", "data-state": "connecting", text: "Connecting to live updates…" });
  const timeline = h("ol", { class: "timeline", id: "timeline", "aria-label": "Stages" });
  const jobEta = h("div", { id: "job-eta-box" });
  const reportedAt = {}; // stage -> when its latest progress was reported (the events' timestamps)
  let estimate = null; // the API's estimate for this job's spec, for the stages not started yet
  const training = h("section", { id: "training", "aria-label": "Training" });
  const report = h("section", { id: "report", "aria-label": "Validation" });
  const serving = h("section", { id: "serving", "aria-label": "Serving commands" });
  const artifacts = h("section", { id: "artifacts", "aria-label": "Artifacts" });
  const publications = h("section", { id: "publications", "aria-label": "Publications" });
  const levelFilter = h("select", { id: "log-level", name: "log-level" },
    LEVELS.map((level) => h("option", { value: level, text: `${level} and above`, selected: level === "info" })));
  const logBody = h("tbody");
  const log = h("section", { id: "events", "aria-labelledby": "events-title" },
    h("div", { class: "section-head" }, h("h2", { id: "events-title", text: "Event log" }),
      h("div", { class: "field inline" }, h("label", { for: "log-level", text: "Show" }), levelFilter)),
    h("div", { class: "table-wrap log-wrap", tabindex: "0", "aria-label": "Event log entries" },
      h("table", { class: "compact log", id: "event-log" },
        h("caption", { class: "visually-hidden", text: "Events, oldest first" }),
        h("thead", {}, h("tr", {}, ["#", "time", "level", "stage", "message"].map((t) => h("th", { scope: "col", text: t })))),
        logBody)));
  levelFilter.addEventListener("change", applyLevelFilter);

  replace(main,
    h("p", {}, h("a", { href: "#/jobs", text: "← All jobs" })),
    h("div", { class: "page-head" }, h("div", {}, title, badge), actions),
    facts, errorBox, adviceBox, live,
    h("section", { "aria-labelledby": "timeline-title" }, h("h2", { id: "timeline-title", text: "Stages" }), jobEta, timeline),
    training, report, serving, artifacts, publications, log);

  let refreshTraining = null; // needs the job's block size: made on the first load
  const refreshResults = resultsPanels({ adviceBox, artifacts, report, serving }, jobId);
  const guard = (what, fn) => async () => {
    try {
      await fn();
    } catch (error) {
      if (!stopped && !(error instanceof ApiError && error.status === 401)) notify(`Could not refresh ${what}: ${error.message}`, "error");
    }
  };
  const refreshJob = throttle(guard("the job", loadJob), 500);
  const refreshMetrics = throttle(guard("the training curves", () => refreshTraining && refreshTraining()), 1500);
  const refreshArtifacts = throttle(guard("the artifacts", refreshResults), 1000);

  async function loadJob() {
    job = await api(path);
    if (stopped) return;
    refreshTraining = refreshTraining || trainingPanel(training, jobId, ((job.spec || {}).drafter || {}).block_size);
    title.textContent = job.name || job.id;
    replace(badge, statusBadge(job.status, job.status_text), job.cancel_requested && job.status !== "cancelled" ? h("span", { class: "muted", text: " cancel requested" }) : null);
    renderFacts();
    renderActions();
    renderTimeline();
    renderError();
    renderPublications();
    scheduleMetrics();
  }

  function renderFacts() {
    const spec = job.spec || {};
    const drafter = spec.drafter || {};
    const training = spec.training || {};
    const items = [["id", job.id], ["target", (spec.target || {}).uri], ["variant", drafter.variant], ["block size", drafter.block_size],
      ["drafter layers", drafter.num_layers], ["steps", training.max_steps], ["learning rate", training.learning_rate],
      ["labels", Object.entries(job.labels || {}).map(([k, v]) => `${k}:${v}`).join(", ") || "none"],
      ["created", new Date(job.created_at).toLocaleString()]];
    replace(facts, items.map(([k, v]) => h("div", { class: "fact" },
      h("dt", { text: k }), h("dd", { class: k === "id" || k === "target" ? "mono" : null, text: v ?? "–" }))));
  }

  function renderActions() {
    // Rebuilt only when the available actions change, so a focused button keeps its focus.
    const wanted = `${!TERMINAL.has(job.status) && job.status !== "cancelling"}|${job.status === "failed" || job.status === "cancelled"}`;
    if (actions.dataset.wanted === wanted) return;
    actions.dataset.wanted = wanted;
    const buttons = [];
    if (!TERMINAL.has(job.status) && job.status !== "cancelling") {
      buttons.push(h("button", { type: "button", id: "cancel-job", class: "danger", text: "Cancel job", onclick: () => act("cancel") }));
    }
    if (job.status === "failed" || job.status === "cancelled") {
      buttons.push(h("button", { type: "button", id: "resume-job", class: "primary", text: "Resume job", onclick: () => act("resume") }));
    }
    buttons.push(h("a", { class: "button", href: `#/compare?jobs=${encodeURIComponent(job.id)}`, text: "Compare…" }));
    replace(actions, buttons);
  }

  async function act(verb) {
    for (const button of actions.querySelectorAll("button")) button.disabled = true;
    delete actions.dataset.wanted; // redraw the buttons (enabled again) whatever the outcome
    try {
      job = await api(`${path}/${verb}`, { method: "POST" });
      notify(verb === "cancel" ? `Cancellation requested: the job is ${job.status}.` : `Job resumed: ${job.status}.`);
      if (verb === "resume" && stream.state === "ended") stream.start(); // a resumed job streams again
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 401) notify(`Could not ${verb} the job: ${error.message}`, "error");
    }
    await guard("the job", loadJob)();
  }

  function renderTimeline() {
    const latest = latestAttempts(job);
    replace(timeline, STAGES.map((stage) => stageLine(job, stage, latest[stage], reportedAt[stage])));
    const run = STAGES.map((stage) => latest[stage]).find((r) => r && r.status === "running");
    const remaining = jobRemaining(job, estimate, run ? stageRemaining(run, reportedAt[run.stage]) : null);
    const open = Boolean(jobEta.querySelector("details[open]")); // redrawn every second: keep "how" open
    replace(jobEta, jobEtaLine(remaining));
    if (open && jobEta.querySelector("details")) jobEta.querySelector("details").open = true;
  }

  function renderError() {
    replace(errorBox, job.error ? h("div", { class: "error-summary", role: "alert" },
      h("strong", { text: `Failed in ${job.error.stage || "?"}: ${job.error.code}` }), h("p", { text: job.error.message })) : null);
  }

  function renderPublications() {
    const list = job.publications || [];
    replace(publications, list.length ? [h("h2", { text: "Published" }), h("ul", {}, list.map((p) =>
      h("li", {}, `${p.kind}: `, h("span", { class: "mono", text: p.location }), p.revision ? ` @ ${p.revision}` : "",
        p.url ? [" — ", h("span", { class: "mono", text: p.url })] : null)))] : []);
  }

  function scheduleMetrics() {
    clearTimeout(metricsTimer);
    if (!stopped && job && job.status === "training") metricsTimer = setTimeout(() => { refreshMetrics(); scheduleMetrics(); }, METRICS_POLL_MS);
  }

  function applyLevelFilter() {
    const minimum = LEVELS.indexOf(levelFilter.value);
    for (const tr of logBody.children) tr.hidden = LEVELS.indexOf(tr.dataset.level) < minimum;
  }

  function appendEvent(event) {
    if (seen.has(event.id)) return; // the stream already de-duplicates; this guards the page too
    seen.add(event.id);
    const wrap = logBody.closest(".log-wrap");
    const atBottom = wrap.scrollTop + wrap.clientHeight >= wrap.scrollHeight - 8;
    const tr = h("tr", { "data-event-id": event.id, "data-level": event.level, "data-type": event.type },
      h("td", { class: "num", text: event.id }), h("td", { title: event.created_at, text: fmtTime(event.created_at) }),
      h("td", {}, h("span", { class: `level level-${event.level}`, text: event.level })),
      h("td", { text: event.stage || "" }), h("td", { text: event.message }));
    tr.hidden = LEVELS.indexOf(event.level) < LEVELS.indexOf(levelFilter.value);
    logBody.append(tr);
    if (atBottom) wrap.scrollTop = wrap.scrollHeight;
  }

  function onEvent(event) {
    appendEvent(event);
    if (event.progress !== null && event.progress !== undefined && event.stage) reportedAt[event.stage] = event.created_at;
    if (event.type !== "log" || event.progress !== null) refreshJob();
    if (event.type === "artifact.created" || (event.type === "stage.finished" && ["validate", "export"].includes(event.stage))) refreshArtifacts();
    if (event.stage === "train") refreshMetrics();
  }

  function onState(state, info) {
    live.dataset.state = state;
    live.textContent = {
      connecting: "Connecting to live updates…",
      live: "● Live: updates appear as they happen.",
      reconnecting: `Connection lost. Reconnecting in ${Math.round((info.delayMs || 0) / 1000)} s (attempt ${info.attempt}); ` +
                    `will continue after event ${info.lastId}.`,
      ended: "The job has finished; live updates ended.",
    }[state] || state;
  }

  function onEnd() {
    refreshJob();
    refreshArtifacts();
    refreshMetrics();
  }

  const stream = new EventStream(`${path}/events`, { onEvent, onState, onEnd });
  loadJob().then(() => {
    if (stopped) return;
    if (!TERMINAL.has(job.status)) jobEstimate(job, api).then((result) => { estimate = result; });
    stream.start();
    refreshMetrics();
    refreshArtifacts();
  }).catch((error) => {
    if (stopped || (error instanceof ApiError && error.status === 401)) return;
    replace(main, h("h1", { text: "Job not available" }),
      h("p", { class: "error", role: "alert", text: error.status === 404 ? `There is no job ${jobId} in your organisation.` : `Could not load the job: ${error.message}` }),
      h("p", {}, h("a", { href: "#/jobs", text: "← All jobs" })));
  });
  // Running durations count up between events.
  tick = setInterval(() => { if (job && !TERMINAL.has(job.status)) renderTimeline(); }, 1000);

  return () => {
    stopped = true;
    stream.stop();
    clearTimeout(metricsTimer);
    clearInterval(tick);
    refreshJob.cancel();
    refreshMetrics.cancel();
    refreshArtifacts.cancel();
  };
}
