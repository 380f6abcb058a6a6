// Entry point: sign in (token from the URL fragment, the desktop shell, or the token form),
// then hand the page to the router. Also the light/dark theme toggle.

import { api, onUnauthorized, signIn } from "./api.js";
import { errorBox, field, h, replace } from "./dom.js";
import { Router } from "./router.js";
import { renderRuns } from "./pages/runs.js";
import { renderInspector } from "./pages/inspector.js";
import { renderSettings } from "./pages/settings.js";
import { renderVolumes } from "./pages/volumes.js";
import { renderWorkbench } from "./pages/workbench.js";

const main = document.getElementById("main");
const PAGES = {
  workbench: renderWorkbench,
  runs: renderRuns,
  run: renderInspector,
  volumes: renderVolumes,
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

/** The desktop shell passes the token through its JS bridge. */
async function tokenFromShell() {
  if (!window.pywebview) return null;
  if (!window.pywebview.api) {
    await new Promise((resolve) => window.addEventListener("pywebviewready", resolve, { once: true }));
  }
  try {
    return await window.pywebview.api.token();
  } catch {
    return null;
  }
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
  if (!router) router = new Router(main, PAGES, markNav);
  router.start();
}

async function boot() {
  setupTheme();
  // Only once a page is up: during sign-in the 401s are expected and handled here.
  onUnauthorized(() => {
    if (router && router.running) showTokenForm("Your session ended (the server restarted or you signed out).");
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
