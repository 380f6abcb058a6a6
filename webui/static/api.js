// The HTTP API of `fleet web` (docs/web.md): JSON calls, uploads and the live event stream.
// Auth is the session cookie set by POST /api/auth, sent automatically (same origin).

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

const unauthorizedListeners = new Set();

/** Call `fn` whenever the server says we are not signed in (the token form takes over). */
export function onUnauthorized(fn) {
  unauthorizedListeners.add(fn);
}

function unauthorized() {
  for (const fn of unauthorizedListeners) fn();
}

async function errorOf(resp) {
  let kind = "http";
  let message = `${resp.status} ${resp.statusText}`.trim();
  try {
    const body = await resp.json();
    kind = body.error || kind;
    message = body.message || message;
  } catch {
    // Not JSON (a proxy or a crash page): the status line is all we have.
  }
  if (resp.status === 401) {
    unauthorized();
    message = "Not signed in: paste the token that `fleet web` printed.";
  }
  return new ApiError(resp.status, kind, message);
}

/**
 * Call the API. `json`: a body sent as JSON; `body`: sent as is (FormData, Blob).
 * Resolves to the parsed JSON (or null for 204); rejects with ApiError.
 */
export async function api(path, { method = "GET", json, body, headers = {} } = {}) {
  const init = { method, headers: { Accept: "application/json", ...headers }, credentials: "same-origin" };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch {
    throw new ApiError(0, "network", "The fleet web server is not reachable: is `fleet web` still running?");
  }
  if (!resp.ok) throw await errorOf(resp);
  if (resp.status === 204) return null;
  const type = resp.headers.get("Content-Type") || "";
  return type.includes("json") ? resp.json() : resp.text();
}

/** Query string from an object, leaving out empty values. */
export function qs(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

/** Sign in with a token: the server answers with the session cookie. */
export async function signIn(token) {
  await api("/api/auth", { method: "POST", json: { token } });
}

/** Upload files for a run; resolves to [{upload_id, name, size}]. */
export async function upload(files) {
  const form = new FormData();
  for (const f of files) form.append("file", f, f.name);
  const res = await api("/api/uploads", { method: "POST", body: form });
  return res.uploads;
}

// Event kinds of core/types.py; the stream names each event after its kind.
export const EVENT_KINDS = [
  "run.started", "run.finished", "context.loaded", "lm.call", "code.executed",
  "subcall.finished", "child.started", "child.finished", "warning",
  "optimize.started", "optimize.eval", "optimize.scored", "optimize.finished",
];

/**
 * Follow a run's events from the start (replayed) to run.finished.
 *
 * The browser's EventSource reconnects by itself after a network drop, sending Last-Event-ID;
 * when the connection is refused outright (server restarted, a proxy error) it gives up, so we
 * reopen it with `?after=<last seq>`. Events are delivered once each, in seq order.
 * Returns a handle with `close()`.
 */
export function followRun(runId, { onEvent, onEnd, onState }) {
  let last = 0;
  let source = null;
  let closed = false;
  let retries = 0;
  const url = () => `/api/runs/${encodeURIComponent(runId)}/events${last ? `?after=${last}` : ""}`;

  const handle = (msg) => {
    let ev;
    try {
      ev = JSON.parse(msg.data);
    } catch {
      return; // not an event envelope (should not happen); skip rather than break the view
    }
    if (typeof ev.seq === "number") {
      if (ev.seq <= last) return; // a replay overlap after reconnecting
      last = ev.seq;
    }
    retries = 0;
    onEvent(ev);
    if (ev.kind === "run.finished") {
      stop();
      if (onEnd) onEnd(ev);
    }
  };

  const open = () => {
    if (closed) return;
    source = new EventSource(url());
    for (const kind of EVENT_KINDS) source.addEventListener(kind, handle);
    source.onopen = () => onState && onState("live");
    source.onerror = () => {
      if (closed) return;
      if (source.readyState === EventSource.CONNECTING) {
        if (onState) onState("reconnecting");
        return; // the browser retries with Last-Event-ID
      }
      source.close();
      retries += 1;
      if (onState) onState("reconnecting");
      // Ask why: a 401 hands over to the token form, a 404 means the run is gone.
      api(`/api/runs/${encodeURIComponent(runId)}`).then(
        (state) => {
          if (closed) return;
          if (state.status !== "queued" && state.status !== "running" && retries > 3) {
            stop();
            if (onEnd) onEnd(null, state);
            return;
          }
          setTimeout(open, Math.min(2000 * retries, 10000));
        },
        (err) => {
          if (err.status === 401 || err.status === 404) {
            stop();
            if (onState) onState(err.status === 404 ? "gone" : "signed-out");
          } else {
            setTimeout(open, Math.min(2000 * retries, 10000));
          }
        },
      );
    };
  };

  const stop = () => {
    closed = true;
    if (source) source.close();
  };

  open();
  return { close: stop, get lastSeq() { return last; } };
}
