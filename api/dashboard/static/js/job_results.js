// The job page's result panels: training curves (from /metrics), the validation report (τ,
// acceptance by position and category, oracle headroom, lossless results, speed, recommended block
// size), artifacts with download buttons, and the serving commands of the model card.
// The charts are drawn by the shared DraftsmithCharts (report/static/charts.js), the same code
// that draws report.html; what each figure means comes from report.json's JSON Schema.

import { api, ApiError, downloadArtifact } from "./api.js";
import { copyText, fmtBytes, fmtNum, h, notify, replace } from "./dom.js";
import { fieldHelp, findModelCard, findReportArtifact, headline, loadModelCard, loadReport, loadReportSchema,
         reportVersionNote, samplingStatus, servingCommands } from "./report_data.js";

const Charts = () => window.DraftsmithCharts;

/**
 * Training curves; redrawn only when the series changed (the API downsamples to max_points). Only
 * the series drawn are asked for: the worker records a dozen more per step (lr, grad_norm, ...).
 */
export function trainingPanel(container, jobId, blockSize) {
  const loss = h("div", { id: "loss-chart" });
  const positions = h("div", { id: "position-chart" });
  replace(container, h("h2", { text: "Training" }), h("div", { class: "chart-grid" }, loss, positions));
  let signature = "";
  return async function refresh() {
    const names = ["loss", ...Charts().positionMetricNames(blockSize)];
    const metrics = await api(`/v1/jobs/${encodeURIComponent(jobId)}/metrics`, { query: { max_points: 400, name: names } });
    const next = metrics.series.map((s) => `${s.name}:${s.total_points}:${s.points.length ? s.points[s.points.length - 1].step : ""}`).join("|");
    if (next === signature) return;
    signature = next;
    const training = Charts().trainingFromSeries(metrics);
    replace(loss);
    replace(positions);
    Charts().lossCurve(loss, training);
    Charts().positionAccuracyCurves(positions, training);
  };
}

function card(label, value, sub, key, help) {
  return h("div", { class: "card", "data-figure": key, title: help || null },
    h("div", { class: "label", text: label }), h("div", { class: "value", text: value }),
    sub ? h("div", { class: "sub", text: sub }) : null);
}

function verdict(passed) {
  if (passed === true) return h("span", { class: "ok", text: "passed" });
  if (passed === false) return h("span", { class: "bad", text: "FAILED" });
  return h("span", { text: "–" });
}

/** Validation's verdict on serving, as a banner: a drafter measured slower than the target says so first. */
export function adviceBanner(advice) {
  if (!advice) return null;
  const kind = advice.enable === true ? "ok" : advice.enable === false ? "bad" : "warn";
  return h("div", { class: `advice advice-${kind}`, id: "serving-advice", "data-enable": String(advice.enable) },
    h("strong", { text: "Serving advice from validation: " }), advice.text);
}

/**
 * A warm start's verdict on which drafter to serve (report.json `warm_start.advice`): keep serving the parent
 * unless the paired gain's interval lies above 1. Null for a job without a parent.
 */
export function warmStartBanner(report) {
  const ws = report && typeof report.warm_start === "object" ? report.warm_start : null;
  if (!ws || (ws.advice !== "keep_parent" && ws.advice !== "serve_new")) return null;
  const keep = ws.advice === "keep_parent";
  const text = ws.advice_reason || (keep ? "keep serving the parent: the gain's 95 % interval does not lie above 1"
    : "the new drafter beats its parent");
  return h("div", { class: `advice advice-${keep ? "warn" : "ok"}`, id: "warm-start-advice", "data-advice": ws.advice },
    h("strong", { text: "Warm start: " }), text.charAt(0).toUpperCase() + text.slice(1));
}

function withInterval(value, ci, suffix = "") {
  if (typeof value !== "number") return "–";
  const bounds = Array.isArray(ci) && ci.length === 2 && ci.every((v) => typeof v === "number")
    ? ` [${fmtNum(ci[0], 3)}, ${fmtNum(ci[1], 3)}]` : "";
  return `${fmtNum(value, 3)}${suffix}${bounds}`;
}

/** The serving mode every τ was measured in (report.json `serving_mode`), as one line. */
function servingModeText(mode) {
  if (!mode || typeof mode !== "object") return "";
  const thinking = mode.enable_thinking === true ? "thinking on" : mode.enable_thinking === false ? "thinking off"
    : "thinking: the template's default";
  const parts = [thinking, mode.system_prompt_sha256 ? `system prompt ${String(mode.system_prompt_sha256).slice(0, 8)}` : "no system prompt"];
  if (typeof mode.temperature === "number") parts.push(mode.temperature === 0 ? "greedy (T=0)" : `T=${mode.temperature}`);
  if (mode.temperature && typeof mode.top_p === "number" && mode.top_p < 1) parts.push(`top-p ${mode.top_p}`);
  if (mode.temperature && mode.top_k) parts.push(`top-k ${mode.top_k}`);
  return parts.join(", ");
}

/**
 * A drafter adapter job's line (report.json `warm_start.adapter`), worded as report.html's (report/warm_start.py
 * `adapter_text`): the LoRA's rank and size against the whole drafter's, and that the τ are the merged drafter's.
 */
function adapterLine(adapter) {
  if (!adapter || typeof adapter !== "object") return null;
  const count = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "–");
  const share = typeof adapter.trainable_share === "number"
    ? ` (${fmtNum(100 * adapter.trainable_share, 3)} % of the drafter's ${count(adapter.drafter_parameters)})` : "";
  const alpha = typeof adapter.alpha === "number" ? `, alpha ${adapter.alpha}` : "";
  return h("p", { class: "muted", id: "warm-start-adapter", text: `Trained as a drafter adapter (preview): a rank-` +
    `${adapter.rank ?? "–"} LoRA${alpha}, ${count(adapter.trainable_parameters)} parameters${share}, ` +
    `${fmtBytes(adapter.bytes)} in ${adapter.folder || "drafter-adapter"}/ against ${fmtBytes(adapter.drafter_bytes)} for the ` +
    "drafter. The τ here are the adapter merged into its parent (drafter/, the drafter to serve)." });
}

/**
 * Parent τ against the new drafter's on the same held-out prompts and seeds, at T=0 and at the job's own
 * parameters, each with its 95 % interval, and the paired ratio new / parent with its interval.
 */
export function warmStartSection(report) {
  const ws = report && typeof report.warm_start === "object" ? report.warm_start : null;
  if (!ws) return null;
  const rows = [];
  const gain = (g) => (g && typeof g === "object" ? g : null);
  const figure = (f) => (f && typeof f === "object" ? f : {});
  if (gain(ws.gain_greedy)) {
    rows.push(["T=0 (greedy)", withInterval(figure(ws.parent_tau_greedy).tau, figure(ws.parent_tau_greedy).ci95),
      withInterval(figure(ws.tau_greedy).tau, figure(ws.tau_greedy).ci95), withInterval(ws.gain_greedy.ratio, ws.gain_greedy.ci95, "×")]);
  }
  if (gain(ws.gain_sampled) && figure(ws.tau_sampled).same_as_greedy !== true) {
    rows.push([`T=${ws.gain_sampled.temperature ?? "–"} (the job's)`,
      withInterval(figure(ws.parent_tau_sampled).tau, figure(ws.parent_tau_sampled).ci95),
      withInterval(figure(ws.tau_sampled).tau, figure(ws.tau_sampled).ci95), withInterval(ws.gain_sampled.ratio, ws.gain_sampled.ci95, "×")]);
  }
  if (!rows.length) rows.push(["the job's parameters", withInterval(ws.parent_tau), withInterval(ws.tau), "–"]);
  const parent = ws.parent && typeof ws.parent === "object" ? ws.parent : {};
  const origin = [parent.name, parent.format ? `${parent.format} format` : null, parent.variant].filter(Boolean).join(", ");
  const mode = servingModeText(ws.serving_mode || report.serving_mode);
  return h("section", { id: "warm-start", "aria-label": "Warm start" },
    h("h3", { text: "Warm start: the parent against this drafter" }),
    origin ? h("p", { class: "muted", id: "warm-start-parent", text: `Parent: ${origin}` +
      (Array.isArray(parent.upgrades) && parent.upgrades.length ? `; upgraded: ${parent.upgrades.join("; ")}` : "") +
      (Array.isArray(parent.dropped_tensors) && parent.dropped_tensors.length ? `; dropped: ${parent.dropped_tensors.join("; ")}` : "") }) : null,
    mode ? h("p", { class: "muted", text: `Both measured on the same ${ws.prompts ?? "–"} held-out prompts, in the serving mode: ${mode}.` }) : null,
    adapterLine(ws.adapter),
    h("table", { class: "facts", id: "warm-start-table" },
      h("thead", {}, h("tr", {}, ["sampling", "parent τ [95 %]", "new τ [95 %]", "new / parent [95 %, paired]"]
        .map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", {}, rows.map(([setting, parentTau, tau, ratio]) => h("tr", {},
        h("th", { scope: "row", text: setting }), h("td", { "data-parent-tau": "", text: parentTau }),
        h("td", { "data-new-tau": "", text: tau }), h("td", { "data-ratio": "", text: ratio }))))));
}

function samplingCell(sampling) {
  const status = samplingStatus(sampling);
  if (status === "inconclusive") { // it tested nothing: never shown as a pass
    return [h("span", { class: "warn", text: "not tested" }), `: ${sampling.reason || "the test could test nothing"}`];
  }
  return [verdict(status === "passed" ? true : status === "failed" ? false : null),
    ` p = ${fmtNum(sampling.p_value, 4)} (α ${sampling.alpha ?? "–"}, ${sampling.draws ?? "–"} draws, ${sampling.cells ?? "–"} cells)`];
}

function overallVerdict(passed, sampling) {
  if (passed === true && samplingStatus(sampling) === "inconclusive") {
    return [h("span", { class: "warn", text: "passed on the greedy exact match only" }), " (the sampling test tested nothing)"];
  }
  return verdict(passed);
}

/** "95 % interval a–b, N prompts, M tokens" of a report.json `tau_greedy` / `tau_sampled` figure. */
function tauInterval(figure) {
  const ci = Array.isArray(figure.ci95) && figure.ci95.length === 2 && figure.ci95.every((v) => typeof v === "number") ? figure.ci95 : null;
  return `${ci ? `95 % interval ${fmtNum(ci[0], 3)}–${fmtNum(ci[1], 3)}, ` : ""}${figure.prompts ?? "–"} prompts, ${figure.tokens ?? "–"} tokens`;
}

/** τ at T=0 and at the job's own sampling parameters (a greedy job's is the T=0 figure); none for an older report. */
function tauCards(r, help) {
  const figure = (value) => (value && typeof value === "object" && typeof value.tau === "number" ? value : null);
  const greedy = figure(r.tau_greedy);
  const sampled = figure(r.tau_sampled);
  const cards = [];
  if (greedy) cards.push(card("τ at T=0 (greedy)", fmtNum(greedy.tau, 3), tauInterval(greedy), "tau-greedy", help("tau_greedy")));
  if (sampled) {
    const sub = sampled.same_as_greedy === true ? "the job is greedy: the T=0 figure"
      : `speculative sampling, top-p ${sampled.top_p ?? "–"}, top-k ${sampled.top_k ?? "–"}; ${tauInterval(sampled)}`;
    cards.push(card(`τ at the job's T=${sampled.temperature ?? "–"}`, fmtNum(sampled.tau, 3), sub, "tau-sampled", help("tau_sampled")));
  }
  return cards;
}

/**
 * The validation report, whatever keys it has: missing ones show as "–". `schema`: report.json's JSON Schema
 * (loadReportSchema), whose field descriptions title the cards; null renders without them.
 */
export function renderReport(container, report, artifactName, schema = null) {
  const r = report || {};
  const help = (...path) => fieldHelp(schema, path);
  const versionNote = reportVersionNote(r, schema);
  const top = headline(r);
  const greedy = (r.lossless && r.lossless.greedy) || {};
  const sampling = (r.lossless && r.lossless.sampling) || {};
  const speed = r.speedup && typeof r.speedup === "object" ? r.speedup : {};
  const headroom = top.oracleTau !== null && top.tau !== null ? top.oracleTau - top.tau : null;
  const byBlock = r.estimated_speedup_by_block_size || {};
  const against = top.advice && top.advice.enable === false;
  const interval = top.speedupInterval ? `, 95 % interval ${fmtNum(top.speedupInterval[0], 2)}–${fmtNum(top.speedupInterval[1], 2)}×` : "";
  const inconclusive = samplingStatus(sampling) === "inconclusive";
  const cards = h("div", { class: "cards" },
    card("τ (mean acceptance length)", fmtNum(top.tau, 3), `block size ${r.block_size ?? "–"}`, "tau", help("tau")),
    card("oracle τ", fmtNum(top.oracleTau, 3), headroom === null ? "" : `headroom +${fmtNum(headroom, 3)} with a perfect choice among the drafter's top-K`, "oracle", help("oracle_tau")),
    ...tauCards(r, help),
    card("measured speedup", top.speedup === null ? "–" : `${fmtNum(top.speedup, 3)}×`,
         speed.ar_tokens_per_s !== undefined ? `${fmtNum(speed.ar_tokens_per_s, 1)} → ${fmtNum(speed.spec_tokens_per_s, 1)} tokens/s${interval}` : "", "speedup",
         help("speedup", "ratio")),
    // Advised against: the best block size is no recommendation, only the size to try on other hardware.
    card(against ? "best block size, if enabled elsewhere" : "recommended block size", top.recommended === null ? "–" : String(top.recommended),
         [Number.isInteger(top.recommended) ? `draft length ${top.recommended - 1}` : "",
          byBlock[top.recommended] !== undefined ? `estimated ${fmtNum(byBlock[top.recommended], 3)}×` : "",
          against ? "not advised on this machine (see the serving advice at the top)" : ""]
           .filter(Boolean).join(", "), "recommended", help("recommended_block_size")),
    card("greedy mismatches", greedy.mismatches === undefined ? "–" : String(greedy.mismatches),
         greedy.prompts !== undefined ? `over ${greedy.prompts} prompts` : "", "mismatches", help("lossless", "greedy", "mismatches")),
    card("sampling test", inconclusive ? "not tested" : sampling.p_value === undefined ? "–" : `p = ${fmtNum(sampling.p_value, 4)}`,
         inconclusive ? sampling.reason || "the test could test nothing"
           : sampling.draws !== undefined ? `${sampling.draws} draws, α = ${sampling.alpha ?? "–"}` : "", "sampling",
         help("lossless", "sampling", "status")));
  const charts = h("div", { class: "chart-grid" });
  const lossless = h("table", { class: "facts", id: "lossless-table" },
    h("caption", { text: "Lossless checks" }),
    h("tbody", {},
      h("tr", {}, h("th", { scope: "row", text: "verdict" }), h("td", {}, overallVerdict(top.passed, sampling))),
      h("tr", {}, h("th", { scope: "row", text: "greedy exact match" }),
        h("td", { text: `${greedy.mismatches ?? "–"} mismatches over ${greedy.prompts ?? "–"} prompts` })),
      h("tr", {}, h("th", { scope: "row", text: "first divergence" }),
        h("td", { class: "mono", text: greedy.first_divergence ? JSON.stringify(greedy.first_divergence) : "none" })),
      h("tr", {}, h("th", { scope: "row", text: "sampling test" }), h("td", { "data-sampling": samplingStatus(sampling) }, samplingCell(sampling))),
      h("tr", {}, h("th", { scope: "row", text: "method" }), h("td", { text: sampling.test || "–" })),
      h("tr", {}, h("th", { scope: "row", text: "speed measured with" }), h("td", { text: speed.decoding || "–" }))));
  const mode = servingModeText(r.serving_mode);
  replace(container, h("h2", { text: "Validation" }),
    h("p", { class: "muted", text: `From ${artifactName}.` }),
    versionNote ? h("p", { class: "muted", id: "report-version", text: versionNote }) : null,
    mode ? h("p", { class: "muted", id: "serving-mode", text: `Every τ measured in the serving mode: ${mode}.` }) : null,
    cards, warmStartSection(r), charts, lossless);
  const run = [{ label: "this drafter", report: r }];
  const position = h("div", { class: "ds-wide" });
  const category = h("div");
  const block = h("div");
  charts.append(position, category, block);
  Charts().acceptanceByPosition(position, run);
  Charts().acceptanceByCategory(category, run);
  Charts().speedupByBlockSize(block, r);
}

/** Artifacts table with sizes, sha256 and download buttons; returns the list for the caller. */
export function renderArtifacts(container, jobId, artifacts) {
  if (!artifacts.length) {
    replace(container, h("h2", { text: "Artifacts" }), h("p", { class: "muted", text: "No artifacts yet." }));
    return;
  }
  const rows = artifacts.map((a) => {
    const button = h("button", { type: "button", class: "small", "data-download": a.name, text: "Download",
                                 "aria-label": `Download ${a.name}` });
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await downloadArtifact(jobId, a.name);
      } catch (error) {
        if (!(error instanceof ApiError) || error.status !== 401) notify(`Download failed: ${error.message}`, "error");
      } finally {
        button.disabled = false;
      }
    });
    return h("tr", { "data-artifact": a.name },
      h("td", { class: "mono", text: a.name }), h("td", { text: a.kind }), h("td", { text: a.stage || "–" }),
      h("td", { class: "num", title: `${a.size_bytes} bytes`, text: fmtBytes(a.size_bytes) }),
      h("td", {}, h("code", { class: "sha", title: a.sha256, "data-sha256": a.sha256, text: `${a.sha256.slice(0, 12)}…` })),
      h("td", {}, button));
  });
  replace(container, h("h2", { text: "Artifacts" }),
    h("div", { class: "table-wrap" }, h("table", { class: "compact", id: "artifacts-table" },
      h("caption", { class: "visually-hidden", text: "Artifacts" }),
      h("thead", {}, h("tr", {}, ["Name", "Kind", "Stage", "Size", "sha256", "Download"].map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", {}, rows))));
}

export function renderServing(container, commands, advice) {
  if (!commands.length) {
    replace(container);
    return;
  }
  replace(container, h("h2", { text: "Serve it" }),
    advice && advice.enable === false
      ? h("p", { class: "advice advice-bad", id: "serving-warning", text: `Before you serve it: ${advice.text}` }) : null,
    h("p", { class: "muted", text: "From the model card (README.md) of this drafter." }),
    commands.map((command, index) => {
      const codeId = `serving-${index}`;
      const button = h("button", { type: "button", class: "small", "aria-label": `Copy the ${command.title} command`,
                                   "aria-describedby": codeId, text: "Copy" });
      button.addEventListener("click", async () => {
        try {
          await copyText(command.code);
          notify(`${command.title} command copied.`);
        } catch (error) {
          notify(`Could not copy: ${error.message}`, "error");
        }
      });
      return h("figure", { class: "command", "data-command": command.title },
        h("figcaption", { text: command.title }),
        h("pre", { tabindex: "0" }, h("code", { id: codeId, text: command.code })), button);
    }));
}

/**
 * Artifacts, then (when they exist) the report, its serving advice (in `adviceBox`, at the top of the
 * page) and the model card. Returns a refresh function; the report and card are fetched once per
 * artifact sha256.
 */
export function resultsPanels({ adviceBox, artifacts, report, serving }, jobId) {
  let reportSha = null;
  let cardSha = null;
  let advice = null;
  return async function refresh() {
    const list = (await api(`/v1/jobs/${encodeURIComponent(jobId)}/artifacts`)).data;
    renderArtifacts(artifacts, jobId, list);
    const reportArtifact = findReportArtifact(list);
    if (reportArtifact && reportArtifact.sha256 !== reportSha) {
      const [loaded, schema] = await Promise.all([loadReport(jobId, reportArtifact), loadReportSchema()]);
      advice = headline(loaded).advice;
      replace(adviceBox, adviceBanner(advice), warmStartBanner(loaded));
      renderReport(report, loaded, reportArtifact.name, schema);
      reportSha = reportArtifact.sha256;
    }
    const cardArtifact = findModelCard(list);
    const cardKey = cardArtifact && `${cardArtifact.sha256}|${reportSha}`; // the warning follows the report
    if (cardArtifact && cardKey !== cardSha) {
      renderServing(serving, servingCommands(await loadModelCard(jobId, cardArtifact)), advice);
      cardSha = cardKey;
    }
    return list;
  };
}
