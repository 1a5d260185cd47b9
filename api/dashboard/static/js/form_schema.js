// Reading the API's own job spec schema (OpenAPI components.schemas.JobSpec) into form controls: the
// kind of each field, its human label, and one control per leaf. Nothing here names a field: a field
// added to the job spec appears in the form with a label, a default and its help without a change here.
//
// Labels come from the schema: its `title` where the API gave one of its own, else the field name made
// readable (pydantic's automatic title of `uri` is "Uri"): acronyms in capitals, a casing the field's own
// description uses ("ZeRO stage"), and a one-word name prefixed by its section ("Target URI").

import { h } from "./dom.js";

const WORDS = { uri: "URI", uris: "URIs", id: "ID", ids: "IDs", url: "URL", hf: "HF", s3: "S3", kl: "KL", gpu: "GPU",
                json: "JSON", num: "number of" };

export function deref(doc, schema) {
  let current = schema || {};
  while (current.$ref) current = doc.components.schemas[current.$ref.split("/").pop()] || {};
  return current;
}

/** {kind, nullable, schema} of a property: `anyOf: [X, null]` is X, nullable. */
export function describe(doc, property) {
  const options = property.anyOf || property.oneOf;
  if (options) {
    const real = options.filter((o) => o.type !== "null");
    if (real.length === 1) {
      // The property's own words win over its type's: "Warm start: ..." says more than InitSpec's docstring.
      const own = Object.fromEntries(["description", "title", "default"].filter((k) => property[k] !== undefined).map((k) => [k, property[k]]));
      return { ...describe(doc, { ...property, ...deref(doc, real[0]), ...own, anyOf: undefined, oneOf: undefined }), nullable: true };
    }
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

/** What pydantic writes as `title` when none was given: "top_p" -> "Top P". */
function automaticTitle(name) {
  return name.split("_").map((w) => w.charAt(0).toUpperCase() + w.slice(1)).join(" ");
}

function capitalise(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** "top_p" -> "top-p", "mask_token_id" -> "mask token ID", "zero_stage" -> "ZeRO stage" (its description's casing). */
function readable(name, description) {
  const words = name.split("_").map((w) => WORDS[w] || w);
  // A single letter belongs to the word before it: top_p is "top-p", not "top p".
  const text = words.reduce((out, w, i) => (i > 0 && w.length === 1 ? `${out}-${w}` : out ? `${out} ${w}` : w), "");
  const escaped = text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const used = new RegExp(`\\b${escaped}\\b`, "i").exec(description || "");
  return used && used[0].toLowerCase() === text.toLowerCase() && used[0] !== used[0].toLowerCase() ? used[0] : text;
}

/** A section's (or group's) title: the API's own, "Warm start" from "Warm start: ...", else the name. */
export function sectionTitle(name, schema, description) {
  if (schema.title && schema.title !== automaticTitle(name) && !/^[A-Z][a-z]+[A-Z]/.test(schema.title)) return schema.title;
  const lead = /^([A-Z][a-z]+(?: [a-z]+){0,2}):\s/.exec(description || "");
  return lead ? lead[1] : capitalise(readable(name, ""));
}

/** A field's label; `section` names the group it sits in ("Target"), null at the top level of the job. */
export function fieldLabel(name, schema, section) {
  if (schema.title && schema.title !== automaticTitle(name)) return schema.title;
  const text = readable(name, schema.description);
  // One word says little alone ("URI", "Source", "Count"): it is named with its section.
  if (!name.includes("_")) return `${section || "Job"} ${text === capitalise(text) && WORDS[name] ? text : text.toLowerCase()}`;
  return capitalise(text);
}

function rangeText(schema) {
  const low = schema.minimum ?? schema.exclusiveMinimum;
  const high = schema.maximum ?? schema.exclusiveMaximum;
  if (low === undefined && high === undefined) return "";
  const open = schema.exclusiveMinimum !== undefined ? "(" : "[";
  const close = schema.exclusiveMaximum !== undefined ? ")" : "]";
  return ` Range ${open}${low ?? "−∞"}, ${high ?? "∞"}${close}.`;
}

/**
 * One control for one leaf property: {field, input, path, label, read(), required, isDefault(value), wide}.
 * read() gives the value to send (undefined: leave the API's default).
 */
// A placeholder must read as an example, never as a value already filled in: the target's first example
// (bundled:smollm2-135m) is a real target, and a user who took it for the field's value submitted an empty form.
const PLACEHOLDERS = { "target.uri": "e.g. hf://your-org/your-model" };

export function placeholderOf(path, schema) {
  if (PLACEHOLDERS[path]) return PLACEHOLDERS[path];
  const example = (schema.examples || [])[0];
  return example === undefined || example === null ? null : `e.g. ${example}`;
}

export function control(path, info, required, label) {
  const id = `f-${path.replace(/\./g, "-")}`;
  const { kind, schema, nullable } = info;
  const dflt = schema.default;
  let input;
  let read;
  let wide = false;
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
    wide = true;
    input = h("textarea", { id, name: path, rows: 2, class: "mono",
                            placeholder: '[{"kind": "s3", "uri": "s3://bucket/prefix"}]' });
    read = () => {
      const text = input.value.trim();
      if (!text) return undefined;
      try { return JSON.parse(text); } catch { return text; } // sent as typed; the API says what is wrong
    };
  } else {
    const long = (schema.maxLength || 0) > 4096; // free text (a system prompt), not a URI or a name
    wide = long || (schema.maxLength || 0) >= 1024; // URIs and free text get the section's whole width
    input = h(long ? "textarea" : "input", { id, name: path, type: long ? null : "text", rows: long ? 3 : null,
                                             value: dflt ?? "", placeholder: placeholderOf(path, schema),
                                             autocomplete: "off" });
    read = () => (input.value === "" ? undefined : input.value);
  }
  const helpId = `${id}-help`;
  const errorId = `${id}-error`;
  input.setAttribute("aria-describedby", `${helpId} ${errorId}`);
  if (required) input.setAttribute("aria-required", "true");
  const hint = kind === "map" ? " One key: value per line." : kind === "json" ? " JSON." : kind === "numbers" ? " Comma-separated." : "";
  const defaultText = dflt !== undefined && dflt !== null && kind !== "boolean" ? ` Default ${JSON.stringify(dflt)}.` : "";
  const labelNode = h("label", { for: id }, label, required ? h("span", { "aria-hidden": "true", text: " *" }) : null);
  const field = h("div", { class: `field field-${kind}${wide ? " field-wide" : ""}`, "data-field": path },
    kind === "boolean" && !nullable ? h("div", { class: "check" }, input, labelNode) : [labelNode, input],
    h("p", { id: helpId, class: "help",
             text: `${schema.description || ""}${/\brange\b/i.test(schema.description || "") ? "" : rangeText(schema)}${defaultText}${hint}`.trim() }),
    h("p", { id: errorId, class: "field-error", "data-error-for": path }));
  const isDefault = (value) => JSON.stringify(value) === JSON.stringify(dflt);
  return { field, input, path, label, read: () => read(), required, isDefault, wide };
}
