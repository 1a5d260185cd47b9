// A Server-Sent Events client over fetch().
//
// The browser's EventSource cannot send an Authorization header, and the API takes keys only
// there, so the stream is read with fetch and parsed here. What EventSource would do, this does:
// remember the last `id:`, reconnect after the server's `retry:` delay with `Last-Event-ID`, stop on
// 204. In addition it reports its state ("connecting", "live", "reconnecting", "ended") so the page
// can show a lost connection, drops any event whose id it has already delivered (no duplicates
// after a reconnect), and stops for good on `event: end` (the job finished) or on 401.

import { auth, signedOut } from "./api.js";

const IDLE_TIMEOUT_MS = 45000; // the API sends a keep-alive comment every 15 s; three missed = dead link
const MAX_BACKOFF_MS = 30000;

export class EventStream {
  /**
   * @param {string} url   the events endpoint, e.g. /v1/jobs/{id}/events
   * @param {object} handlers  onEvent(event), onState(state, info), onEnd(data)
   */
  constructor(url, { onEvent, onState, onEnd } = {}) {
    this.url = url;
    this.onEvent = onEvent || (() => {});
    this.onState = onState || (() => {});
    this.onEnd = onEnd || (() => {});
    this.lastId = 0;
    this.retryMs = 2000;
    this.failures = 0;
    this.stopped = false;
    this.controller = null;
    this.state = null;
  }

  start() {
    this.stopped = false;
    this.loop();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.idleTimer);
    clearTimeout(this.retryTimer);
    if (this.controller) this.controller.abort();
  }

  setState(state, info = {}) {
    this.state = state;
    this.onState(state, info);
  }

  async loop() {
    while (!this.stopped) {
      const outcome = await this.connectOnce();
      if (this.stopped || outcome === "ended" || outcome === "unauthorized") return;
      // Dropped or refused: say so, wait, and continue after the last event we delivered.
      this.failures += 1;
      const delay = Math.min(MAX_BACKOFF_MS, this.retryMs * 2 ** Math.max(0, this.failures - 1));
      this.setState("reconnecting", { attempt: this.failures, delayMs: delay, lastId: this.lastId });
      await new Promise((resolve) => { this.retryTimer = setTimeout(resolve, delay); });
    }
  }

  /** One connection; resolves to "ended", "unauthorized" or "dropped". */
  async connectOnce() {
    this.controller = new AbortController();
    const sentKey = auth.key;
    const headers = { Accept: "text/event-stream", ...auth.headers() };
    if (this.lastId > 0) headers["Last-Event-ID"] = String(this.lastId);
    if (this.state !== "reconnecting") this.setState("connecting");
    let response;
    try {
      response = await fetch(this.url, { headers, signal: this.controller.signal, cache: "no-store" });
    } catch {
      return "dropped";
    }
    if (response.status === 204) { // a finished job with nothing newer: nothing more will come
      this.setState("ended");
      this.onEnd({});
      return "ended";
    }
    if (response.status === 401) {
      let detail = "your API key was not accepted";
      try { detail = (await response.json()).detail || detail; } catch { /* keep the default */ }
      if (sentKey && auth.key === sentKey) signedOut(detail); // else an earlier 401 already signed out (api.js)
      this.setState("ended");
      return "unauthorized";
    }
    if (!response.ok || !response.body) return "dropped";
    this.failures = 0;
    this.setState("live", { lastId: this.lastId });
    try {
      return await this.read(response.body);
    } catch {
      return "dropped";
    } finally {
      clearTimeout(this.idleTimer);
    }
  }

  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let message = { id: null, event: "message", data: [] };
    const armIdle = () => {
      clearTimeout(this.idleTimer);
      this.idleTimer = setTimeout(() => this.controller.abort(), IDLE_TIMEOUT_MS);
    };
    armIdle();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return "dropped"; // the server closed without `event: end` (stream limit, restart)
      armIdle();
      buffer += value;
      let newline;
      while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
        if (line === "") {
          if (this.dispatch(message) === "ended") return "ended";
          message = { id: null, event: "message", data: [] };
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "data") message.data.push(text);
          else if (field === "id") message.id = text;
          else if (field === "event") message.event = text;
          else if (field === "retry" && /^\d+$/.test(text)) this.retryMs = Number(text);
        }
      }
    }
  }

  dispatch(message) {
    if (message.event === "end") {
      this.stopped = true;
      this.setState("ended");
      this.onEnd(parse(message.data.join("\n")) || {});
      return "ended";
    }
    if (!message.data.length) return "skip";
    const id = Number(message.id);
    if (Number.isFinite(id) && id <= this.lastId) return "duplicate";
    if (Number.isFinite(id)) this.lastId = id;
    const event = parse(message.data.join("\n"));
    if (event) this.onEvent(event);
    return "delivered";
  }
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
