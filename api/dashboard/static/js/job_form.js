// The new-job form, generated from the API's own OpenAPI document (components.schemas.JobSpec):
// fields, labels, defaults, ranges and descriptions are the API's (form_schema.js reads them), so a
// field added to the job spec appears here without a dashboard change. The API is also the only
// validator: the form sends what was typed (novalidate) and shows each problem's message next to the
// field it names.
//
// Layout: the job's own fields (name, labels) first, then one section per group of the spec (target,
// sampling, drafter, data, training, validation, warm start, publish), each a two-column grid where
// the screen allows. A section holding a required field is open; the others are collapsed, their
// summary saying whether they keep the defaults or what was changed, and they open by themselves
// when the API reports a problem in them. The estimate (POST /v1/jobs/estimate) is fetched as the form
// changes, before anything is created, and stays in view while the form scrolls.

import { api, ApiError } from "./api.js";
import { fmtNum, h, notify, randomId, replace } from "./dom.js";
import { control, deref, describe, fieldLabel, sectionTitle } from "./form_schema.js";

const ESTIMATE_DELAY_MS = 400;
let openapiPromise = null;

function openapi() {
  openapiPromise = openapiPromise || fetch("/openapi.json", { cache: "no-store" }).then((r) => {
    if (!r.ok) throw new Error(`the API description answered ${r.status}`);
    return r.json();
  });
  return openapiPromise.catch((error) => { openapiPromise = null; throw error; });
}

/**
 * The controls of an object's properties, in the schema's order, as a grid; nested objects as
 * groups spanning the grid. `required`: the object itself must be sent (a nullable one need not).
 */
function fieldGrid(doc, schema, prefix, section, required, controls) {
  const nodes = [];
  for (const [name, property] of Object.entries(schema.properties || {})) {
    const path = prefix ? `${prefix}.${name}` : name;
    const info = describe(doc, property);
    const needed = required && (schema.required || []).includes(name);
    if (info.kind === "object") {
      const title = sectionTitle(name, info.schema, info.schema.description);
      const id = `fs-${path.replace(/\./g, "-")}`;
      nodes.push(h("fieldset", { id, class: "field-wide", "data-field": path },
        h("legend", { text: title }),
        info.schema.description ? h("p", { class: "help", text: info.schema.description }) : null,
        h("p", { class: "field-error", "data-error-for": path, id: `${id}-error` }),
        fieldGrid(doc, info.schema, path, title, needed && !info.nullable, controls)));
    } else {
      const c = control(path, info, needed, fieldLabel(name, info.schema, section));
      controls.push(c);
      nodes.push(c.field);
    }
  }
  return h("div", { class: "field-grid" }, nodes);
}

/** One collapsible section per object, array or nullable group of the job spec. */
function section(doc, name, info, required, controls) {
  const title = sectionTitle(name, info.schema, info.schema.description);
  const own = [];
  const id = `fs-${name}`;
  let body;
  if (info.kind === "object") {
    body = [info.schema.description ? h("p", { class: "help", text: info.schema.description }) : null,
      h("p", { class: "field-error", "data-error-for": name, id: `${id}-error` }),
      fieldGrid(doc, info.schema, name, title, required && !info.nullable, own)];
  } else { // a list (publish destinations): one JSON field, which carries its own help and error slot
    own.push(control(name, info, required, title));
    body = h("div", { class: "field-grid" }, own[0].field);
  }
  controls.push(...own);
  const digest = h("span", { class: "section-digest", "data-digest": name });
  const details = h("details", { class: "form-section", "data-section": name, open: own.some((c) => c.required) },
    h("summary", {}, h("span", { class: "section-title", text: title }), digest),
    h("fieldset", { id, "data-field": name }, h("legend", { class: "visually-hidden", text: title }), body));
  return { details, update: () => { digest.textContent = digestOf(own); } };
}

/** "defaults", or what differs from them: "changed: Block size 4, Number of layers 3". */
function digestOf(controls) {
  const changed = controls.filter((c) => {
    const value = c.read();
    return value !== undefined && !c.isDefault(value) && !c.required;
  });
  const required = controls.filter((c) => c.required);
  const parts = required.map((c) => `${c.label}: ${c.read() === undefined ? "required" : String(c.read())}`);
  if (changed.length) parts.push(`changed: ${changed.map((c) => `${c.label} ${JSON.stringify(c.read())}`).join(", ")}`);
  else if (!required.length) parts.push("defaults");
  return parts.join(" · ");
}

/** The whole form: the job's own leaf fields, then the sections. Returns its nodes and a digest updater. */
function buildForm(doc, schema, controls) {
  const leaves = [];
  const sections = [];
  for (const [name, property] of Object.entries(schema.properties || {})) {
    const info = describe(doc, property);
    const required = (schema.required || []).includes(name);
    if (info.kind === "object" || info.kind === "json") sections.push(section(doc, name, info, required, controls));
    else leaves.push([name, info, required]);
  }
  const own = leaves.map(([name, info, required]) => control(name, info, required, fieldLabel(name, info.schema, null)));
  controls.unshift(...own);
  const job = h("fieldset", { id: "fs-job", class: "form-job" }, h("legend", { text: "Job" }),
    h("div", { class: "field-grid" }, own.map((c) => c.field)));
  return { nodes: [job, ...sections.map((s) => s.details)], update: () => sections.forEach((s) => s.update()) };
}

function bodyOf(controls) {
  const body = {};
  for (const c of controls) {
    const value = c.read();
    if (value === undefined || (!c.required && c.isDefault(value))) continue;
    const parts = c.path.split(".");
    let node = body;
    for (const part of parts.slice(0, -1)) node = node[part] = node[part] || {};
    node[parts[parts.length - 1]] = value;
  }
  return body;
}

export function jobForm(main) {
  let stopped = false;
  let timer = null;
  let estimateSeq = 0;
  let idempotencyKey = randomId();
  const controls = [];
  const summary = h("div", { id: "form-errors", class: "error-summary", role: "alert", tabindex: "-1", hidden: true });
  const estimate = h("section", { id: "estimate", "aria-labelledby": "estimate-title", "aria-live": "polite" },
    h("h2", { id: "estimate-title", text: "Estimate" }), h("p", { class: "muted", text: "Loading…" }));
  const submit = h("button", { type: "submit", class: "primary", id: "create-job", text: "Create job" });
  const form = h("form", { id: "job-form", novalidate: true, "aria-labelledby": "form-title" });
  replace(main, h("div", { class: "page-head" }, h("h1", { id: "form-title", text: "New job" })),
    h("p", { class: "muted", text: "Fields, defaults and limits come from the API's job spec. Only values that differ from a default are sent." }),
    summary, h("div", { class: "form-layout" }, form, estimate));

  openapi().then((doc) => {
    if (stopped) return;
    const schema = deref(doc, doc.components.schemas.JobSpec);
    const built = buildForm(doc, schema, controls);
    replace(form, built.nodes, h("div", { class: "form-actions" }, submit));
    built.update();
    form.addEventListener("input", () => { idempotencyKey = randomId(); built.update(); scheduleEstimate(); });
    form.addEventListener("change", () => { built.update(); scheduleEstimate(); });
    form.addEventListener("submit", create);
    const first = controls.find((c) => c.required);
    if (first) first.input.focus();
    scheduleEstimate();
  }).catch((error) => replace(form, h("p", { class: "error", role: "alert", text: `Could not load the job spec: ${error.message}` })));

  // withSummary: after Create only. While typing, the estimate marks fields quietly: an alert on
  // every pause would have a screen reader interrupt the user constantly.
  function showErrors(errors, fallback, withSummary = true) {
    for (const node of form.querySelectorAll("[data-error-for]")) node.textContent = "";
    for (const node of form.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
    const unplaced = [];
    const placed = [];
    for (const error of errors) {
      // The most specific field or fieldset the error names: publish.0.uri -> publish. A missing group
      // ("target" when nothing was typed) is shown at the empty required field inside it (target.uri),
      // where the user has to type.
      let path = error.field || "";
      const empty = controls.find((c) => c.required && c.path.startsWith(`${path}.`) && c.read() === undefined);
      if (empty) path = empty.path;
      let slot = null;
      while (path && !(slot = form.querySelector(`[data-error-for="${CSS.escape(path)}"]`))) path = path.split(".").slice(0, -1).join(".");
      if (!slot) { unplaced.push(error); continue; }
      slot.textContent = slot.textContent ? `${slot.textContent} ${error.message}` : error.message;
      const closed = slot.closest("details");
      if (closed) closed.open = true; // a problem is never left inside a collapsed section
      const input = form.querySelector(`[name="${CSS.escape(path)}"]`);
      if (input) input.setAttribute("aria-invalid", "true");
      placed.push({ error, target: input || slot });
    }
    const items = placed.map(({ error, target }) => h("li", {}, h("a", {
      href: `#${target.id}`, text: `${error.field}: ${error.message}`,
      // Focus the field in place: following the link would change the route (the hash).
      onclick: (event) => { event.preventDefault(); target.focus(); target.scrollIntoView({ block: "center" }); },
    })));
    items.push(...unplaced.map((e) => h("li", { text: `${e.field}: ${e.message}` })));
    if (!errors.length && fallback) items.push(h("li", { text: fallback }));
    summary.hidden = !withSummary || !items.length;
    replace(summary, errors.length ? h("p", { text: `The API refused this job: ${errors.length} problem${errors.length > 1 ? "s" : ""}, shown next to ${errors.length > 1 ? "their fields" : "its field"}.` }) : null,
      items.length ? h("ul", {}, items) : null);
  }

  function scheduleEstimate() {
    clearTimeout(timer);
    timer = setTimeout(runEstimate, ESTIMATE_DELAY_MS);
  }

  async function runEstimate() {
    const seq = ++estimateSeq;
    const missing = controls.filter((c) => c.required && c.read() === undefined);
    if (missing.length) { // nothing typed yet: no errors before the user has done anything
      replace(estimate, h("h2", { id: "estimate-title", text: "Estimate" }),
        h("p", { class: "muted", text: `Fill in ${missing.map((c) => c.label).join(", ")} to see the estimate.` }));
      return;
    }
    try {
      const result = await api("/v1/jobs/estimate", { method: "POST", body: bodyOf(controls) });
      if (stopped || seq !== estimateSeq) return;
      showErrors([], null, false);
      renderEstimate(result);
    } catch (error) {
      if (stopped || seq !== estimateSeq || !(error instanceof ApiError) || error.status === 401) return;
      if (error.status === 422) showErrors(error.errors, error.message, false);
      replace(estimate, h("h2", { id: "estimate-title", text: "Estimate" }),
        h("p", { class: "muted", text: error.status === 422 ? "Fix the fields marked above to see an estimate." : `No estimate: ${error.message}` }));
    }
  }

  function renderEstimate(result) {
    const rows = (result.estimates || []).map((e) => h("tr", {},
      h("th", { scope: "row", text: `${e.gpu_count}× ${e.gpu_class}` }),
      h("td", { class: "num", text: fmtNum(e.total_minutes, 1) }),
      h("td", { class: "num", text: `$${fmtNum(e.cost_usd, 2)}` })));
    replace(estimate, h("h2", { id: "estimate-title", text: "Estimate" }),
      h("dl", { class: "facts" },
        h("dt", { text: "Prompts" }), h("dd", { "data-estimate": "prompts", text: `${result.prompts} (${result.holdout_prompts} held out)` }),
        h("dt", { text: "Tokens to generate (at most)" }), h("dd", { "data-estimate": "tokens", text: Number(result.tokens_to_generate).toLocaleString("en") }),
        h("dt", { text: "Training steps" }), h("dd", { "data-estimate": "steps", text: String(result.training_steps) }),
        h("dt", { text: "Target size" }), h("dd", { text: `${result.target_parameters_billion}B parameters` })),
      h("table", { class: "compact", id: "estimate-table" },
        h("caption", { text: "Time and cost per GPU class" }),
        h("thead", {}, h("tr", {}, ["GPU class", "minutes", "cost"].map((t) => h("th", { scope: "col", text: t })))),
        h("tbody", {}, rows)),
      h("details", {}, h("summary", { text: "Assumptions" }),
        h("ul", {}, (result.assumptions || []).map((a) => h("li", { text: a })))));
  }

  async function create(event) {
    event.preventDefault();
    submit.disabled = true;
    try {
      const job = await api("/v1/jobs", { method: "POST", body: bodyOf(controls), headers: { "Idempotency-Key": idempotencyKey } });
      notify(`Job ${job.id} created.`);
      window.location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
    } catch (error) {
      if (!(error instanceof ApiError) || error.status === 401) return;
      showErrors(error.errors, error.message);
      const firstInvalid = form.querySelector("[aria-invalid=true]");
      (firstInvalid || summary).focus();
    } finally {
      submit.disabled = false;
    }
  }

  return () => { stopped = true; clearTimeout(timer); };
}
