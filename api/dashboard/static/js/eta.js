// Time left, from what this job has measured so far.
//
// A running stage: its progress over the time since it started is its rate, and the rest of it goes at
// that rate: elapsed × (100 − p) / p, less the time since that progress was reported. Shown once the
// stage is past MIN_PROGRESS % and MIN_SECONDS old; before that a rate would be noise.
//
// The whole job: the running stage's time left, plus the API's estimate (POST /v1/jobs/estimate) of the
// stages not started yet. The API estimates per GPU class and does not know this worker's; the class
// whose estimate is nearest to the stages measured so far is taken, scaled by how much faster or slower
// this job ran than it (generate, train and validate are estimated; prepare, export and publish share
// the estimate's fixed overhead). A training stage never runs past the job's training.max_minutes.

import { fmtDuration, h, STAGES, TERMINAL } from "./dom.js";

export const MIN_PROGRESS = 3;
export const MIN_SECONDS = 20;
const ESTIMATED = { generate: "generation_minutes", train: "training_minutes", validate: "validation_minutes" };
const estimates = new Map(); // job id -> Promise of the API's estimate for its spec (a spec never changes)

function parse(timestamp) {
  const ms = typeof timestamp === "number" ? timestamp : Date.parse(timestamp);
  return Number.isFinite(ms) ? ms : null;
}

/** The latest attempt of each stage (the API lists every attempt, oldest first). */
export function latestAttempts(job) {
  const latest = {};
  for (const run of job.stages || []) latest[run.stage] = run;
  return latest;
}

/**
 * {seconds, elapsed} left in a running stage whose progress was last reported at `reportedAt` (a
 * timestamp; the stage's own progress field is that report's value), or null while too early to tell.
 */
export function stageRemaining(run, reportedAt, now = Date.now()) {
  if (!run || run.status !== "running" || typeof run.progress !== "number") return null;
  const started = parse(run.started_at);
  const at = Math.min(now, parse(reportedAt) ?? now);
  if (started === null || run.progress < MIN_PROGRESS || at - started < MIN_SECONDS * 1000) return null;
  const measured = (at - started) / 1000;
  const rest = (measured * (100 - run.progress)) / run.progress - (now - at) / 1000;
  return { seconds: Math.max(0, rest), elapsed: (now - started) / 1000 };
}

/** The API's estimate for a job's spec, fetched once per job (null when the API gives none). */
export function jobEstimate(job, call) {
  if (!estimates.has(job.id)) {
    estimates.set(job.id, call("/v1/jobs/estimate", { method: "POST", body: job.spec }).catch(() => null));
  }
  return estimates.get(job.id);
}

function duration(run) {
  const start = parse(run.started_at);
  const end = parse(run.finished_at);
  return start !== null && end !== null ? Math.max(0, (end - start) / 1000) : null;
}

/**
 * {seconds, gpuClass, factor, parts: [{stage, seconds, basis}]} left in the whole job, or null when a
 * stage still to run has no estimate yet (the running one too early to measure, no stage measured to
 * scale the API's estimate by, or no estimate). `running`: stageRemaining of the running stage.
 */
export function jobRemaining(job, estimate, running, now = Date.now()) {
  if (!estimate || !(estimate.estimates || []).length || TERMINAL.has(job.status) || job.status === "cancelling") return null;
  const latest = latestAttempts(job);
  const measured = {}; // estimated stage -> its seconds: finished, or projected from its measured rate
  for (const stage of Object.keys(ESTIMATED)) {
    const run = latest[stage];
    if (run && run.status === "succeeded" && duration(run) !== null) measured[stage] = duration(run);
    else if (run && run.status === "running" && running) measured[stage] = running.elapsed + running.seconds;
  }
  const stages = Object.keys(measured).filter((stage) => estimate.estimates.every((e) => e[ESTIMATED[stage]] > 0));
  if (!stages.length) return null;
  const miss = (e) => stages.reduce((sum, stage) => sum + Math.abs(Math.log(measured[stage] / (60 * e[ESTIMATED[stage]]))), 0);
  const best = estimate.estimates.reduce((a, b) => (miss(b) < miss(a) ? b : a));
  const factor = stages.reduce((sum, stage) => sum + measured[stage], 0) / stages.reduce((sum, stage) => sum + 60 * best[ESTIMATED[stage]], 0);
  const cap = ((job.spec || {}).training || {}).max_minutes;
  const parts = [];
  let overheadUsed = 0;
  let overheadLeft = false;
  for (const stage of STAGES) {
    const run = latest[stage];
    if (run && run.status === "succeeded") {
      if (!ESTIMATED[stage]) overheadUsed += duration(run) || 0;
    } else if (run && run.status === "running") {
      if (!running) return null;
      parts.push({ stage, seconds: running.seconds, basis: "measured rate" });
      if (!ESTIMATED[stage]) overheadUsed += running.elapsed + running.seconds;
    } else if (ESTIMATED[stage]) {
      let seconds = 60 * best[ESTIMATED[stage]] * factor;
      if (stage === "train" && typeof cap === "number") seconds = Math.min(seconds, 60 * cap);
      parts.push({ stage, seconds, basis: `estimate for ${best.gpu_class} × ${factor.toFixed(2)}` });
    } else {
      overheadLeft = true;
    }
  }
  if (overheadLeft) {
    parts.push({ stage: "prepare, export, publish", seconds: Math.max(0, 60 * best.overhead_minutes - overheadUsed),
                 basis: "the estimate's fixed overhead, less what those stages took" });
  }
  return { seconds: parts.reduce((sum, part) => sum + part.seconds, 0), gpuClass: best.gpu_class, factor, parts, at: now };
}

/** "≈ 4m 20s left" (with the clock time it ends at, for the longer ones). */
export function leftText(seconds, now = Date.now()) {
  const end = new Date(now + seconds * 1000).toLocaleTimeString([], { hour12: false, hour: "2-digit", minute: "2-digit" });
  return `≈ ${fmtDuration(seconds)} left${seconds >= 120 ? ` (ends about ${end})` : ""}`;
}

/** The whole job's time left as a line, with how it was made under "how" (or the reason there is none). */
export function jobEtaLine(remaining) {
  if (!remaining) return null;
  return h("div", { class: "job-eta", id: "job-eta", "data-seconds": String(Math.round(remaining.seconds)) },
    h("strong", { text: "Whole job: " }), leftText(remaining.seconds, remaining.at), " ",
    h("details", { class: "eta-how" }, h("summary", { text: "how" }),
      h("ul", {}, remaining.parts.map((part) => h("li", { text: `${part.stage}: ${fmtDuration(part.seconds)} (${part.basis})` })))));
}
