// Small DOM and formatting helpers. Everything the API returns is put into the page as text
// (textContent / attributes), never as HTML: job names, labels and log lines are user data.

/**
 * h("button", {class: "primary", onclick: fn, disabled: true}, "Cancel") -> <button>.
 * Attributes: `text` sets textContent, `on<event>` adds a listener, `false`/null/undefined are skipped.
 */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "value" && "value" in node) node.value = String(value);
    else if (key === "checked" || key === "selected") node[key] = Boolean(value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : String(child));
  }
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function replace(node, ...children) {
  clear(node);
  append(node, children);
  return node;
}

export function isNumber(value) {
  return typeof value === "number" && Number.isFinite(value);
}

export function fmtNum(value, digits = 3) {
  return isNumber(value) ? Number(value.toFixed(digits)).toString() : "–";
}

export function fmtBytes(bytes) {
  if (!isNumber(bytes)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

export function fmtDuration(seconds) {
  if (!isNumber(seconds) || seconds < 0) return "–";
  if (seconds < 60) return `${Math.round(seconds)}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m ${Math.round(seconds % 60)}s`;
  return `${Math.floor(minutes / 60)}h ${minutes % 60}m`;
}

export function secondsBetween(start, end) {
  if (!start) return null;
  const from = Date.parse(start);
  const to = end ? Date.parse(end) : Date.now();
  return Number.isFinite(from) && Number.isFinite(to) ? Math.max(0, (to - from) / 1000) : null;
}

export function fmtAge(timestamp) {
  const seconds = secondsBetween(timestamp, null);
  if (seconds === null) return "–";
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

export function fmtTime(timestamp) {
  const date = new Date(timestamp);
  return Number.isNaN(date.getTime()) ? "–" : date.toLocaleTimeString([], { hour12: false });
}

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const STAGES = ["prepare", "generate", "train", "validate", "export", "publish"];

/** A status shown as a word in a coloured pill: the word carries the meaning, the colour helps. */
/** A job's or audit's status; `text` is the API's words for it where it sends them (a job's `status_text`). */
export function statusBadge(status, text) {
  return h("span", { class: `badge status-${status}`, "data-status": status, text: text || status });
}

/** Coalesce bursts of calls into at most one run per `ms` (SSE events arrive in bursts). */
export function throttle(fn, ms) {
  let timer = null;
  let pending = false;
  let last = 0;
  const fire = () => {
    timer = null;
    last = Date.now();
    pending = false;
    fn();
  };
  const call = () => {
    pending = true;
    if (timer) return;
    timer = setTimeout(fire, Math.max(0, last + ms - Date.now()));
  };
  call.cancel = () => {
    if (timer) clearTimeout(timer);
    timer = null;
    pending = false;
  };
  call.flush = () => {
    if (pending) {
      if (timer) clearTimeout(timer);
      fire();
    }
  };
  return call;
}

/** Random hex, also in insecure (plain-http) contexts where crypto.randomUUID is missing. */
export function randomId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Copy text; the async clipboard needs a secure context, the selection fallback does not. */
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = h("textarea", { class: "visually-hidden", "aria-hidden": "true" });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

/** Announce a short message to screen readers and show it in the notice bar. */
export function notify(message, kind = "info") {
  const bar = document.getElementById("notice");
  if (!bar) return;
  replace(bar, h("p", { class: `notice notice-${kind}`, text: message }));
  clearTimeout(notify.timer);
  notify.timer = setTimeout(() => clear(bar), kind === "error" ? 12000 : 5000);
}
