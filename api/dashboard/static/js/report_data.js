// What a job produced, read from the API as it stands: the validation report (the report.json
// artifact), the model card (README.md, for the serving commands) and the training metrics.
// The job resource itself carries no tau or speedup; they live in the report. Reports never change
// once written, so they are cached by artifact sha256.

import { api } from "./api.js";

const reportCache = new Map(); // sha256 -> report object
const summaryCache = new Map(); // job id -> {status, summary}
let reportSchema = null; // the promise of report.json's JSON Schema, fetched once

/**
 * report.json's JSON Schema (report/static/validation_report.schema.json, generated from the typed report
 * schemas/validation_report.py), served with the charts; null when it cannot be read (the report still renders).
 */
export function loadReportSchema() {
  if (!reportSchema) {
    reportSchema = fetch("/assets/shared/validation_report.schema.json", { headers: { Accept: "application/json" } })
      .then((response) => (response.ok ? response.json() : null))
      .catch(() => null);
  }
  return reportSchema;
}

/**
 * The schema of a report field by its path (["speedup", "ratio"]), through `$ref`s and `anyOf: [X, null]`; its
 * `description` is the field's own where it has one, else its type's. null for a field the schema lacks.
 */
export function reportField(schema, path) {
  let current = schema;
  for (const name of path) {
    const property = current && current.properties ? current.properties[name] : null;
    if (!property) return null;
    let resolved = property;
    for (let depth = 0; depth < 8; depth++) {
      const options = (resolved.anyOf || []).filter((o) => o.type !== "null");
      if (resolved.$ref) resolved = ((schema && schema.$defs) || {})[resolved.$ref.split("/").pop()] || {};
      else if (options.length === 1) resolved = options[0];
      else break;
    }
    current = { ...resolved, description: property.description || resolved.description };
  }
  return current;
}

/** What the schema says a report field means, or "". */
export function fieldHelp(schema, path) {
  const field = reportField(schema, path);
  return (field && field.description) || "";
}

/**
 * A sentence for a report newer than this dashboard's schema (its `version` above the schema's
 * `x-report-version`), else null: such a report still renders, with the figures this dashboard knows.
 * A report without `version` is version 1 (schemas/validation_report.py).
 */
export function reportVersionNote(report, schema) {
  const known = schema && Number.isInteger(schema["x-report-version"]) ? schema["x-report-version"] : null;
  const version = report && Number.isInteger(report.version) ? report.version : 1;
  if (known === null || version <= known) return null;
  return `This report is version ${version}, newer than this dashboard reads (version ${known}): figures it does not know are not shown.`;
}

/**
 * The artifact holding the validation report: `report.json` (what `draftsmith export` writes), or
 * failing that any JSON artifact of kind "report" (a worker may name it after its stage).
 */
export function findReportArtifact(artifacts) {
  const list = artifacts || [];
  return list.find((a) => a.name === "report.json")
    || list.find((a) => a.name.split("/").pop() === "report.json")
    || list.find((a) => a.kind === "report" && a.name.endsWith(".json"))
    || null;
}

export function findModelCard(artifacts) {
  const list = artifacts || [];
  return list.find((a) => a.name === "README.md") || list.find((a) => a.kind === "model-card") || null;
}

// Through the dashboard's own reader, not GET /v1/.../artifacts/{name}: with S3 storage that answers
// with a redirect to the bucket, which a script can follow only if the bucket allows CORS.
async function artifactText(jobId, artifact) {
  const name = artifact.name.split("/").map(encodeURIComponent).join("/");
  const response = await api(`/dashboard/jobs/${encodeURIComponent(jobId)}/artifacts/${name}`,
                             { raw: true, headers: { Accept: "*/*" } });
  return response.text();
}

export async function loadReport(jobId, artifact) {
  if (!artifact) return null;
  if (reportCache.has(artifact.sha256)) return reportCache.get(artifact.sha256);
  const text = await artifactText(jobId, artifact);
  const report = JSON.parse(text);
  if (!report || typeof report !== "object") throw new Error(`${artifact.name} is not a JSON object`);
  reportCache.set(artifact.sha256, report);
  return report;
}

export async function loadModelCard(jobId, artifact) {
  return artifact ? artifactText(jobId, artifact) : null;
}

/**
 * The serving commands of a model card: the fenced code blocks of its "Serving" section, each titled
 * by the paragraph before it, up to its first colon or parenthesis ("SGLang:", "vLLM: vLLM serves ...",
 * "llama.cpp (the command ...)" give SGLang, vLLM, llama.cpp).
 */
export function servingCommands(markdown) {
  if (!markdown) return [];
  const lines = markdown.split(/\r?\n/);
  const start = lines.findIndex((line) => /^#{1,6}\s+Serving\b/i.test(line));
  if (start < 0) return [];
  const commands = [];
  let paragraph = null; // the first line of the paragraph before the next fence
  for (let i = start + 1; i < lines.length; i++) {
    const line = lines[i];
    if (/^#{1,6}\s/.test(line)) break; // the next section
    const fence = /^```\s*([\w-]*)/.exec(line);
    if (fence) {
      const body = [];
      for (i += 1; i < lines.length && !/^```/.test(lines[i]); i++) body.push(lines[i]);
      const title = (paragraph || "").split(/:|\s\(/)[0].replace(/[.,]\s*$/, "").trim();
      commands.push({ title: title || `command ${commands.length + 1}`, language: fence[1] || "", code: body.join("\n") });
      paragraph = null;
    } else if (!line.trim()) {
      paragraph = null;
    } else if (paragraph === null) {
      paragraph = line.trim();
    }
  }
  return commands;
}

/**
 * "passed", "failed", "inconclusive" (it could test nothing: never a pass) or null, from the sampling
 * test's `status`, or the `passed` flag of reports older than it.
 */
export function samplingStatus(sampling) {
  const s = sampling || {};
  if (["passed", "failed", "inconclusive"].includes(s.status)) return s.status;
  return s.passed === true ? "passed" : s.passed === false ? "failed" : null;
}

/**
 * Validation's verdict on serving (report.json `serving_advice`): {enable: true | false | null, text}
 * with the summary as a sentence, or null for a report without one.
 */
export function servingAdvice(report) {
  const advice = (report || {}).serving_advice;
  const summary = advice && typeof advice.summary === "string" ? advice.summary.trim() : "";
  if (!summary) return null;
  const text = `${summary.charAt(0).toUpperCase()}${summary.slice(1)}${summary.endsWith(".") ? "" : "."}`;
  return { enable: typeof advice.enable === "boolean" ? advice.enable : null, text };
}

/** τ, speedup, the recommended block size and the serving advice from a report, whatever keys it has. */
export function headline(report) {
  const r = report || {};
  const speed = r.speedup && typeof r.speedup === "object" ? r.speedup : {};
  const interval = Array.isArray(speed.ratio_ci95) && speed.ratio_ci95.length === 2 && speed.ratio_ci95.every((v) => typeof v === "number")
    ? speed.ratio_ci95 : null;
  return {
    tau: typeof r.tau === "number" ? r.tau : null,
    oracleTau: typeof r.oracle_tau === "number" ? r.oracle_tau : null,
    speedup: typeof speed.ratio === "number" ? speed.ratio : (typeof r.speedup === "number" ? r.speedup : null),
    speedupInterval: interval,
    recommended: r.recommended_block_size ?? null,
    passed: typeof r.passed === "boolean" ? r.passed : null,
    advice: servingAdvice(r),
  };
}

const MAY_HAVE_REPORT = new Set(["exporting", "publishing", "succeeded", "failed", "cancelling", "cancelled"]);

/**
 * τ and speedup of a job for the list: its report when there is one, else the `tau` / `speedup`
 * metrics a worker may record. Cached per job until its status changes.
 */
export async function jobSummary(job) {
  const cached = summaryCache.get(job.id);
  if (cached && (cached.status === job.status || cached.summary.tau !== null)) return cached.summary;
  let summary = { tau: null, speedup: null, recommended: null, passed: null, advice: null };
  const validated = (job.stages || []).some((s) => s.stage === "validate" && s.status === "succeeded");
  if (validated || MAY_HAVE_REPORT.has(job.status)) {
    const artifacts = await api(`/v1/jobs/${encodeURIComponent(job.id)}/artifacts`);
    const artifact = findReportArtifact(artifacts.data);
    if (artifact) summary = headline(await loadReport(job.id, artifact));
    if (summary.tau === null) {
      const metrics = await api(`/v1/jobs/${encodeURIComponent(job.id)}/metrics`,
                                { query: { name: ["tau", "speedup"], max_points: 2 } });
      for (const series of metrics.series) {
        const last = series.points.filter((p) => p.value !== null).pop();
        if (last && series.name === "tau") summary.tau = last.value;
        if (last && series.name === "speedup") summary.speedup = last.value;
      }
    }
  }
  summaryCache.set(job.id, { status: job.status, summary });
  return summary;
}

/** A short name for a job in tables and chart legends. */
export function jobLabel(job) {
  const spec = job.spec || {};
  const drafter = spec.drafter || {};
  const base = job.name || spec.name || `${drafter.variant || "?"} B=${drafter.block_size ?? "?"}`;
  return `${base} (${job.id.slice(-6)})`;
}
