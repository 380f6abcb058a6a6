// Entry point: sign in (token from the URL fragment, the desktop shell, or the token form),
// then hand the page to the router. Also the light/dark theme toggle.

import { api, hasSession, onUnauthorized, signIn, signOut } from "./api.js";
import { errorBox, field, h, replace } from "./dom.js";
import { Router } from "./router.js";
import { renderRuns } from "./pages/runs.js";
import { renderInspector } from "./pages/inspector.js";
import { renderSettings } from "./pages/settings.js";
import { renderVolumes } from "./pages/volumes.js";
import { renderOptimize } from "./pages/optimize.js";
import { renderWorkbench } from "./pages/workbench.js";

const main = document.getElementById("main");
const PAGES = {
  workbench: renderWorkbench,
  runs: renderRuns,
  run: renderInspector,
  volumes: renderVolumes,
  optimize: renderOptimize,
  settings: renderSettings,
};

// -- theme: auto (the system's), light or dark; remembered in localStorage --------------------

const THEMES = ["auto", "light", "dark"];

function applyTheme(theme) {
  const button = document.getElementById("theme");
  if (theme === "auto") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
  button.textContent = `Theme: ${theme}`;
  button.setAttribute("aria-label", theme === "auto" ? "Colour theme: follow the system" : `Colour theme: ${theme}`);
}

function setupTheme() {
  let theme = localStorage.getItem("fleet-theme") || "auto";
  if (!THEMES.includes(theme)) theme = "auto";
  applyTheme(theme);
  document.getElementById("theme").addEventListener("click", () => {
    theme = THEMES[(THEMES.indexOf(theme) + 1) % THEMES.length];
    localStorage.setItem("fleet-theme", theme);
    applyTheme(theme);
  });
}

// -- auth ---------------------------------------------------------------------------------------

/** The token of a sign-in address (`http://127.0.0.1:PORT/#token=...`, or its fragment alone), or null. */
function tokenInAddress(text) {
  const match = /#token=([^&\s]+)/.exec(text);
  if (!match) return null;
  try {
    return decodeURIComponent(match[1]);
  } catch {
    return match[1]; // not %-encoded after all: the server says whether it is the token
  }
}

/** The token handed over in `#token=...` (removed from the address bar at once), if any. */
function tokenFromFragment() {
  const token = tokenInAddress(location.hash);
  if (token) history.replaceState(null, "", `${location.pathname}${location.search}#/workbench`);
  return token;
}

const DESKTOP = new URLSearchParams(location.search).has("desktop");

/**
 * The desktop shell (`fleet desktop` opens `/?desktop`) hands the token over its JS bridge: once
 * the page says it is waiting, the shell runs a script in it that dispatches `fleet-desktop-token`.
 * (pywebview's `js_api` cannot be used: it builds functions with `new Function`, which this page's
 * Content-Security-Policy forbids.) A plain browser given `?desktop` gives up after a while.
 */
function tokenFromShell() {
  if (!DESKTOP) return Promise.resolve(null);
  return new Promise((resolve) => {
    const done = (token) => {
      delete document.documentElement.dataset.desktop;
      resolve(token);
    };
    window.addEventListener("fleet-desktop-token", (e) => done(e.detail), { once: true });
    setTimeout(() => done(null), 20000);
    document.documentElement.dataset.desktop = "waiting";
  });
}

async function signedIn() {
  try {
    await api("/api/runs?limit=1");
    return true;
  } catch (err) {
    if (err.status === 401) return false;
    throw err;
  }
}

let router = null;

function refusal(err) {
  return err.status === 401 ? new Error("That token was not accepted: copy it again from the terminal.") : err;
}

/** The token form, with a `message` under it or the `error` of the last attempt in it. */
function showTokenForm(message, error = null) {
  if (router) router.stop();
  document.getElementById("nav").hidden = true;
  document.getElementById("sign-out").hidden = true;
  const input = h("input", { type: "password", autocomplete: "off", spellcheck: "false", required: true });
  const status = h("div", {});
  const form = h("form", { class: "card narrow", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("p", {}, "Paste the address that `fleet web` printed in its terminal (http://127.0.0.1:…/#token=…), "
      + "or only the token after #token=."),
    field("Token", input).row,
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Sign in")),
    status);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      await signIn(tokenInAddress(input.value) || input.value.trim());
      start();
    } catch (err) {
      replace(status, errorBox(refusal(err)));
    }
  });
  if (error) replace(status, errorBox(error));
  replace(main, form, message ? h("p", { class: "muted" }, message) : null);
  input.focus();
}

/**
 * The sign-in address opened in this tab: only the fragment changes, so the page does not load again.
 * Signed out, it signs in; either way the token leaves the address bar at once.
 */
async function signInFromAddress() {
  const token = tokenFromFragment();
  if (!token || (router && router.running)) return;
  try {
    await signIn(token);
    start();
  } catch (err) {
    showTokenForm(null, refusal(err));
  }
}

function markNav(route) {
  const current = route.name === "run" ? "runs" : route.name;
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.dataset.route === current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function start() {
  document.getElementById("nav").hidden = false;
  // The desktop window holds its session as long as it is open: there is no token to sign in again with.
  document.getElementById("sign-out").hidden = DESKTOP || !hasSession();
  if (!router) router = new Router(main, PAGES, markNav);
  router.start();
}

function setupSignOut() {
  document.getElementById("sign-out").addEventListener("click", async () => {
    try {
      await signOut();
      showTokenForm("Signed out.");
    } catch (err) {
      showTokenForm(`Signed out in this tab; the server did not answer (${err.message}).`);
    }
  });
}

async function boot() {
  setupTheme();
  setupSignOut();
  // Before the router's own listener: the token is gone from the address before a page reads it.
  window.addEventListener("hashchange", signInFromAddress);
  // Only once a page is up: during sign-in the 401s are expected and handled here.
  onUnauthorized(() => {
    if (!router || !router.running) return;
    if (DESKTOP) location.reload(); // the shell hands the launch token over again on every load
    else showTokenForm("Your session ended (signed out, unused for 8 hours, or the server restarted): sign in again.");
  });
  try {
    const token = tokenFromFragment() || (await tokenFromShell());
    if (token) {
      try {
        await signIn(token);
      } catch (err) {
        if (err.status !== 401) throw err; // a stale token: fall through to the form
      }
    }
    if (await signedIn()) start();
    else showTokenForm();
  } catch (err) {
    replace(main, h("h1", {}, "fleet-rlm"), errorBox(err));
  }
}

boot();
