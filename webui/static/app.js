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

/** The token handed over in `#token=...` (removed from the address bar at once), if any. */
function tokenFromFragment() {
  const match = /^#token=([^&]+)/.exec(location.hash);
  if (!match) return null;
  history.replaceState(null, "", `${location.pathname}${location.search}#/workbench`);
  return decodeURIComponent(match[1]);
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

function showTokenForm(message) {
  if (router) router.stop();
  document.getElementById("nav").hidden = true;
  document.getElementById("sign-out").hidden = true;
  const input = h("input", { type: "password", autocomplete: "off", spellcheck: "false", required: true });
  const status = h("div", {});
  const form = h("form", { class: "card narrow", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("p", {}, "Paste the token that `fleet web` printed in its terminal (the part after #token=)."),
    field("Token", input).row,
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Sign in")),
    status);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      await signIn(input.value.trim());
      document.getElementById("nav").hidden = false;
      start();
    } catch (err) {
      replace(status, errorBox(err.status === 401 ? new Error("That token was not accepted: copy it again from the terminal.") : err));
    }
  });
  replace(main, form, message ? h("p", { class: "muted" }, message) : null);
  input.focus();
}

function markNav(route) {
  const current = route.name === "run" ? "runs" : route.name;
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.dataset.route === current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function start() {
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
