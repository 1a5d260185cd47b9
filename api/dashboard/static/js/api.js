// The /v1 client of the dashboard: the API key from the browser session, problem+json errors as
// ApiError, and one place that turns any 401 into "sign in again".

const KEY_STORAGE = "draftsmith.apiKey";
export const SIGNED_OUT = "draftsmith:signed-out";

export const auth = {
  get key() {
    return sessionStorage.getItem(KEY_STORAGE);
  },
  set(key) {
    sessionStorage.setItem(KEY_STORAGE, key);
  },
  clear() {
    sessionStorage.removeItem(KEY_STORAGE);
  },
  headers() {
    const key = this.key;
    return key ? { Authorization: `Bearer ${key}` } : {};
  },
};

/** An error answer of the API: `status`, and the problem body's `title`, `detail` and field `errors`. */
export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
    this.errors = Array.isArray(this.problem.errors) ? this.problem.errors : [];
  }
}

/** Tell the page the key stopped working (expired, revoked, wrong): it shows the sign-in prompt. */
export function signedOut(message) {
  auth.clear();
  window.dispatchEvent(new CustomEvent(SIGNED_OUT, { detail: { message } }));
}

async function readProblem(response) {
  try {
    const body = await response.json();
    return body && typeof body === "object" ? body : { detail: String(body) };
  } catch {
    return { title: response.statusText || `HTTP ${response.status}`, detail: `the server answered ${response.status}` };
  }
}

/**
 * Call the API: api("/v1/jobs", {query: {status: ["failed"]}}), api(path, {method: "POST", body}).
 * Resolves to the JSON body (null for 204); rejects with ApiError (status 0 when the network failed).
 */
export async function api(path, { method = "GET", body, query, headers = {}, signal, raw = false } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item !== undefined && item !== null && item !== "") url.searchParams.append(name, String(item));
    }
  }
  const sentKey = auth.key;
  const init = { method, signal, cache: "no-store", headers: { Accept: "application/json", ...auth.headers(), ...headers } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    if (error && error.name === "AbortError") throw error;
    throw new ApiError(0, { title: "Network error", detail: "the Draftsmith API could not be reached; check your connection" });
  }
  if (response.status === 401) {
    const problem = await readProblem(response);
    // Only a refusal of the key in use signs out: a request that left after an earlier 401 had cleared the key
    // would otherwise replace that refusal's reason ("revoked") with "send your API key".
    if (sentKey && auth.key === sentKey) signedOut(problem.detail || "your API key was not accepted");
    throw new ApiError(401, problem);
  }
  if (!response.ok) throw new ApiError(response.status, await readProblem(response));
  if (raw) return response;
  if (response.status === 204) return null;
  return response.json();
}

/** Every page of a list endpoint that pages with next_cursor (bounded, for the compare picker). */
export async function listJobs(query, maxPages = 5) {
  const jobs = [];
  let after;
  for (let page = 0; page < maxPages; page++) {
    const body = await api("/v1/jobs", { query: { ...query, after } });
    jobs.push(...body.data);
    if (!body.has_more || !body.next_cursor) break;
    after = body.next_cursor;
  }
  return jobs;
}

/** Start a browser download of one artifact through a short-lived signed link (see downloads.py). */
export async function downloadArtifact(jobId, name) {
  const link = await api("/dashboard/download-links", { method: "POST", body: { job_id: jobId, name } });
  const anchor = document.createElement("a");
  anchor.href = link.url;
  anchor.download = name.split("/").pop();
  anchor.rel = "noopener";
  document.body.append(anchor);
  anchor.click();
  anchor.remove();
}
