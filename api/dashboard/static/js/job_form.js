// The new-job form, generated from the API's own OpenAPI document (components.schemas.JobSpec):
// fields, defaults, ranges and descriptions are the API's, so a field added to the job spec
// appears here without a dashboard change. The API is also the only validator: the form sends
// what was typed (novalidate) and shows each problem's message next to the field it names.
// The estimate (POST /v1/jobs/estimate) is fetched as the form changes, before anything is created.

import { api, ApiError } from "./api.js";
import { fmtNum, h, notify, randomId, replace } from "./dom.js";

const ESTIMATE_DELAY_MS = 400;
let openapiPromise = null;

function openapi() {
  openapiPromise = openapiPromise || fetch("/openapi.json", { cache: "no-store" }).then((r) => {
    if (!r.ok) throw new Error(`the API description answered ${r.status}`);
    return r.json();
  });
  return openapiPromise.catch((error) => { openapiPromise = null; throw error; });
}

function deref(doc, schema) {
  let current = schema || {};
  while (current.$ref) current = doc.components.schemas[current.$ref.split("/").pop()] || {};
  return current;
}

/** {type, nullable, schema} of a property: `anyOf: [X, null]` is X, nullable. */
function describe(doc, property) {
  const options = property.anyOf || property.oneOf;
  if (options) {
    const real = options.filter((o) => o.type !== "null");
    if (real.length === 1) return { ...describe(doc, { ...property, ...deref(doc, real[0]), anyOf: undefined, oneOf: undefined }), nullable: true };
  }
  const schema = deref(doc, property);
  let kind = schema.type || (schema.properties ? "object" : "json");
  if (schema.enum) kind = "enum";
  if (kind === "object" && !schema.properties && schema.additionalProperties) kind = "map";
  if (kind === "array" && ["integer", "number"].includes((schema.items || {}).type)) kind = "numbers";
  else if (kind === "array") kind = "json";
  return { kind, schema: { ...schema, description: property.description || schema.description,
                           default: property.default ?? schema.default, title: property.title || schema.title },
           nullable: false };
}

function humanize(name) {
  const text = name.replace(/_/g, " ");
  return text.charAt(0).toUpperCase() + text.slice(1);
}

function rangeText(schema) {
  const low = schema.minimum ?? schema.exclusiveMinimum;
  const high = schema.maximum ?? schema.exclusiveMaximum;
  if (low === undefined && high === undefined) return "";
  const open = schema.exclusiveMinimum !== undefined ? "(" : "[";
  const close = schema.exclusiveMaximum !== undefined ? ")" : "]";
  return ` Range ${open}${low ?? "−∞"}, ${high ?? "∞"}${close}.`;
}

/** One control for one leaf property; returns the element and a read() giving the value to send. */
function control(path, info, required) {
  const id = `f-${path.replace(/\./g, "-")}`;
  const { kind, schema, nullable } = info;
  const dflt = schema.default;
  let input;
  let read;
  if (kind === "boolean" && !nullable) {
    input = h("input", { id, name: path, type: "checkbox", checked: Boolean(dflt) });
    read = () => input.checked;
  } else if (kind === "enum" || (kind === "boolean" && nullable)) {
    const values = kind === "boolean" ? [true, false] : schema.enum;
    input = h("select", { id, name: path },
      nullable || dflt === undefined ? h("option", { value: "", text: "(default)" }) : null,
      values.map((v) => h("option", { value: JSON.stringify(v), text: String(v), selected: v === dflt })));
    read = () => (input.value === "" ? undefined : JSON.parse(input.value));
  } else if (kind === "integer" || kind === "number") {
    input = h("input", { id, name: path, type: "number", inputmode: kind === "integer" ? "numeric" : "decimal",
                         step: kind === "integer" ? "1" : "any", value: dflt ?? "" });
    // An unparseable number is sent as typed, so the API's own message explains it.
    read = () => (input.value.trim() === "" ? undefined : (Number.isFinite(Number(input.value)) ? Number(input.value) : input.value));
  } else if (kind === "numbers") {
    input = h("input", { id, name: path, type: "text", value: Array.isArray(dflt) ? dflt.join(", ") : "", placeholder: "e.g. 1, 14, 27" });
    read = () => {
      const text = input.value.trim();
      if (!text) return undefined;
      const items = text.split(/[\s,]+/).filter(Boolean);
      return items.every((x) => /^-?\d+$/.test(x)) ? items.map(Number) : text;
    };
  } else if (kind === "map") {
    input = h("textarea", { id, name: path, rows: 2, placeholder: "team: search\nexperiment: b16" });
    read = () => {
      const text = input.value.trim();
      if (!text) return undefined;
      const result = {};
      for (const line of text.split(/\n/)) {
        const match = /^\s*([^:=]+?)\s*[:=]\s*(.*?)\s*$/.exec(line);
        if (match) result[match[1]] = match[2]; else if (line.trim()) result[line.trim()] = "";
      }
      return result;
    };
  } else if (kind === "json") {
    input = h("textarea", { id, name: path, rows: 2, class: "mono",
                            placeholder: '[{"kind": "s3", "uri": "s3://bucket/prefix"}]' });
    read = () => {
      const text = input.value.trim();
      if (!text) return undefined;
      try { return JSON.parse(text); } catch { return text; } // sent as typed; the API says what is wrong
    };
  } else {
    const long = (schema.maxLength || 0) > 4096; // free text (a system prompt), not a URI or a name
    input = h(long ? "textarea" : "input", { id, name: path, type: long ? null : "text", rows: long ? 3 : null,
                                             value: dflt ?? "", placeholder: (schema.examples || [])[0] || null,
                                             autocomplete: "off" });
    read = () => (input.value === "" ? undefined : input.value);
  }
  const helpId = `${id}-help`;
  const errorId = `${id}-error`;
  input.setAttribute("aria-describedby", `${helpId} ${errorId}`);
  if (required) input.setAttribute("aria-required", "true");
  const hint = kind === "map" ? " One key: value per line." : kind === "json" ? " JSON." : kind === "numbers" ? " Comma-separated." : "";
  const defaultText = dflt !== undefined && dflt !== null && kind !== "boolean" ? ` Default ${JSON.stringify(dflt)}.` : "";
  const label = h("label", { for: id }, humanize(path.split(".").pop()), required ? h("span", { "aria-hidden": "true", text: " *" }) : null);
  const field = h("div", { class: `field field-${kind}`, "data-field": path },
    kind === "boolean" && !nullable ? h("div", { class: "check" }, input, label) : [label, input],
    h("p", { id: helpId, class: "help",
             text: `${schema.description || ""}${/\brange\b/i.test(schema.description || "") ? "" : rangeText(schema)}${defaultText}${hint}`.trim() }),
    h("p", { id: errorId, class: "field-error", "data-error-for": path }));
  const isDefault = (value) => JSON.stringify(value) === JSON.stringify(dflt);
  return { field, input, path, read: () => read(), required, isDefault };
}

function buildFields(doc, schema, prefix, controls) {
  const nodes = [];
  for (const [name, property] of Object.entries(schema.properties || {})) {
    const path = prefix ? `${prefix}.${name}` : name;
    const info = describe(doc, property);
    const required = (schema.required || []).includes(name);
    if (info.kind === "object" && !info.nullable) {
      const id = `fs-${path.replace(/\./g, "-")}`;
      nodes.push(h("fieldset", { id, "data-field": path },
        h("legend", { text: humanize(name) }),
        info.schema.description ? h("p", { class: "help", text: info.schema.description }) : null,
        h("p", { class: "field-error", "data-error-for": path, id: `${id}-error` }),
        buildFields(doc, info.schema, path, controls)));
    } else {
      const c = control(path, info, required);
      controls.push(c);
      nodes.push(c.field);
    }
  }
  return nodes;
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
    replace(form, buildFields(doc, schema, "", controls), h("div", { class: "form-actions" }, submit));
    form.addEventListener("input", () => { idempotencyKey = randomId(); scheduleEstimate(); });
    form.addEventListener("change", scheduleEstimate);
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
      // The most specific field or fieldset the error names: publish.0.uri -> publish.
      let path = error.field || "";
      let slot = null;
      while (path && !(slot = form.querySelector(`[data-error-for="${CSS.escape(path)}"]`))) path = path.split(".").slice(0, -1).join(".");
      if (!slot) { unplaced.push(error); continue; }
      slot.textContent = slot.textContent ? `${slot.textContent} ${error.message}` : error.message;
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
        h("p", { class: "muted", text: `Fill in ${missing.map((c) => c.path).join(", ")} to see the estimate.` }));
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
