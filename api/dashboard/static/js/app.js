// The dashboard's entry point: hash routes, the sign-in prompt, and the lifetime of each view.
//
//   #/jobs[?status=..&label=..]   jobs list          #/jobs/new        new job form
//   #/jobs/<id>                   one job            #/compare?jobs=a,b  compare jobs
//
// A view is a function (main, params) that draws into <main> and returns a cleanup function
// (stop polling, close the event stream); the router calls it before the next view starts.
// Without a key, or as soon as the API refuses the key (401 anywhere, the event stream included),
// the sign-in prompt replaces the view: never a blank page.

import { api, ApiError, auth, SIGNED_OUT } from "./api.js";
import { compareView } from "./compare.js";
import { h, replace } from "./dom.js";
import { jobForm } from "./job_form.js";
import { jobPage } from "./job_page.js";
import { jobsList } from "./jobs_list.js";

const main = document.getElementById("main");
let cleanup = null;
let signInMessage = "";

function parseRoute() {
  const hash = window.location.hash.replace(/^#/, "") || "/jobs";
  const [path, queryString] = hash.split("?");
  const query = new URLSearchParams(queryString || "");
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "jobs" && parts[1] === "new") return { view: jobForm, title: "New job", query };
  if (parts[0] === "jobs" && parts[1]) return { view: jobPage, title: "Job", id: decodeURIComponent(parts[1]), query };
  if (parts[0] === "compare") return { view: compareView, title: "Compare", query };
  return { view: jobsList, title: "Jobs", query };
}

function stopView() {
  if (cleanup) {
    try { cleanup(); } catch { /* a view that failed to start has nothing to stop */ }
  }
  cleanup = null;
}

function markCurrentNav(route) {
  for (const link of document.querySelectorAll("nav a")) {
    const current = link.dataset.view === route.view.name;
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function render() {
  stopView();
  document.getElementById("sign-out").hidden = !auth.key;
  if (!auth.key) {
    showSignIn();
    return;
  }
  const route = parseRoute();
  document.title = `${route.title} · Draftsmith`;
  markCurrentNav(route);
  main.dataset.view = route.view.name;
  try {
    cleanup = route.view(main, route) || null;
  } catch (error) {
    replace(main, h("p", { class: "error", role: "alert", text: `This page failed to load: ${error.message}` }));
  }
}

function showSignIn() {
  stopView();
  document.title = "Sign in · Draftsmith";
  main.dataset.view = "signIn";
  document.getElementById("sign-out").hidden = true;
  const input = h("input", { id: "api-key", name: "api-key", type: "password", autocomplete: "off", spellcheck: "false",
                             required: true, "aria-describedby": "api-key-help api-key-error", placeholder: "dsk_..." });
  const error = h("p", { id: "api-key-error", class: "field-error", role: "alert", text: signInMessage });
  const button = h("button", { type: "submit", class: "primary", text: "Sign in" });
  const form = h("form", { class: "sign-in", novalidate: true, "aria-labelledby": "sign-in-title" },
    h("h1", { id: "sign-in-title", text: "Sign in to Draftsmith" }),
    h("label", { for: "api-key", text: "API key" }),
    input,
    h("p", { id: "api-key-help", class: "help",
             text: "Your key (dsk_...) stays in this browser tab's session storage and is sent only to this server. " +
                   "Create one with: draftsmith keys create --org NAME" }),
    error,
    button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) {
      error.textContent = "Enter your API key.";
      input.focus();
      return;
    }
    button.disabled = true;
    error.textContent = "";
    auth.set(key);
    try {
      await api("/v1/jobs", { query: { limit: 1 } }); // the cheapest call that proves the key
      signInMessage = "";
      render();
    } catch (failure) {
      // 401 already cleared the key and re-rendered this prompt with the API's message.
      if (!(failure instanceof ApiError) || failure.status !== 401) {
        error.textContent = failure.message;
        auth.clear();
      }
      button.disabled = false;
    }
  });
  replace(main, form);
  input.focus();
}

window.addEventListener(SIGNED_OUT, (event) => {
  const reason = event.detail.message;
  signInMessage = main.dataset.view === "signIn"
    ? `That key was not accepted: ${reason}.`
    : `Your key stopped working (${reason}). Sign in again to continue.`;
  showSignIn();
});

window.addEventListener("hashchange", render);

document.getElementById("sign-out").addEventListener("click", () => {
  auth.clear();
  signInMessage = "Signed out.";
  showSignIn();
});

render();
