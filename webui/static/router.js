// Hash routes: #/workbench, #/workbench/chat (its Chat mode), #/runs, #/runs/ID, #/volumes, #/optimize,
// #/settings.
// A page is `render(main, params) -> cleanup?`; the cleanup runs when the route changes
// (closing event streams and timers of the page left behind).

const DEFAULT = "#/workbench";

/** Parse a hash into {name, params}; unknown routes fall back to the workbench. */
export function parse(hash) {
  const parts = (hash || "").replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  const [first, second] = parts;
  if (first === "runs" && second) return { name: "run", params: { id: second } };
  if (first === "workbench" && second === "chat") return { name: "workbench", params: { mode: "chat" } };
  if (["workbench", "runs", "volumes", "optimize", "settings"].includes(first)) return { name: first, params: {} };
  return { name: "workbench", params: {} };
}

export class Router {
  constructor(main, pages, onRoute) {
    this.main = main;
    this.pages = pages;
    this.onRoute = onRoute;
    this.cleanup = null;
    this.running = false;
    window.addEventListener("hashchange", () => this.running && this.show());
  }

  start() {
    this.running = true;
    this.show();
  }

  /** Leave the current page (the token form takes over). */
  stop() {
    this.running = false;
    if (typeof this.cleanup === "function") this.cleanup();
    this.cleanup = null;
  }

  show() {
    if (!location.hash || location.hash === "#") {
      history.replaceState(null, "", DEFAULT);
    }
    const route = parse(location.hash);
    if (typeof this.cleanup === "function") this.cleanup();
    this.cleanup = null;
    this.main.replaceChildren();
    if (this.onRoute) this.onRoute(route);
    this.cleanup = this.pages[route.name](this.main, route.params);
    // Move focus to the new page's heading so keyboard and screen-reader users land on it.
    const heading = this.main.querySelector("h1");
    if (heading) {
      heading.setAttribute("tabindex", "-1");
      heading.focus({ preventScroll: true });
    }
  }
}
