// The HTTP API of `fleet web` (docs/web.md): JSON calls, uploads and the live event stream.
// Auth: the page trades the token for a session id (POST /api/auth) kept in this tab's
// sessionStorage, which is per origin (port included), and sends it as the bearer on every request.
// No cookie: browsers send cookies for 127.0.0.1 to every port, so another local web app would get it.

const SESSION_KEY = "fleet-session";

export class ApiError extends Error {
  /** `hint`: where the fix is made, when the server says ("settings": a setting). */
  constructor(status, kind, message, hint = null) {
    super(message);
    this.status = status;
    this.kind = kind;
    this.hint = hint;
  }
}

const unauthorizedListeners = new Set();

/** Call `fn` whenever the server says we are not signed in (the token form takes over). */
export function onUnauthorized(fn) {
  unauthorizedListeners.add(fn);
}

function unauthorized() {
  sessionStorage.removeItem(SESSION_KEY); // refused: dead (signed out, idle too long, server restarted)
  for (const fn of unauthorizedListeners) fn();
}

/** Does this tab hold a session? */
export function hasSession() {
  return sessionStorage.getItem(SESSION_KEY) !== null;
}

function authHeaders() {
  const session = sessionStorage.getItem(SESSION_KEY);
  return session ? { Authorization: `Bearer ${session}` } : {};
}

async function errorOf(resp) {
  let kind = "http";
  let message = `${resp.status} ${resp.statusText}`.trim();
  let hint = null;
  try {
    const body = await resp.json();
    kind = body.error || kind;
    message = body.message || message;
    hint = body.hint || null;
  } catch {
    // Not JSON (a proxy or a crash page): the status line is all we have.
  }
  if (resp.status === 401) {
    unauthorized();
    message = "Not signed in: paste the token that `fleet web` printed.";
  }
  return new ApiError(resp.status, kind, message, hint);
}

/** fetch() with this tab's session; resolves to an ok Response, rejects with ApiError (or AbortError). */
export async function request(path, init = {}) {
  let resp;
  try {
    resp = await fetch(path, { ...init, headers: { ...authHeaders(), ...init.headers } });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "network", "The fleet web server is not reachable: is `fleet web` still running?");
  }
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

/**
 * Call the API. `json`: a body sent as JSON; `body`: sent as is (FormData, Blob).
 * Resolves to the parsed JSON (or null for 204); rejects with ApiError.
 */
export async function api(path, { method = "GET", json, body, headers = {} } = {}) {
  const init = { method, headers: { Accept: "application/json", ...headers } };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
  }
  const resp = await request(path, init);
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

/** Sign in with a token: the server answers with a session id (none when it runs without auth). */
export async function signIn(token) {
  const { session } = await api("/api/auth", { method: "POST", json: { token } });
  if (session) sessionStorage.setItem(SESSION_KEY, session);
}

/** Sign out: the server revokes the session; the tab forgets it even if the server is gone. */
export async function signOut() {
  try {
    await api("/api/auth", { method: "DELETE" });
  } finally {
    sessionStorage.removeItem(SESSION_KEY);
  }
}

/** Save what `path` answers as a file called `name` (a plain link would go without the session). */
export async function saveAs(path, name) {
  const blob = await (await request(path)).blob();
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 60_000); // the download has taken the blob by then
}

/** Upload files for a run; resolves to [{upload_id, name, size}]. */
export async function upload(files) {
  const form = new FormData();
  for (const f of files) form.append("file", f, f.name);
  const res = await api("/api/uploads", { method: "POST", body: form });
  return res.uploads;
}

/**
 * Read a text/event-stream body: `onFrame({data, event, id, retry})` per frame (`data` undefined
 * for a frame without one); keep-alive comments are skipped. Resolves when the stream ends.
 */
export async function readEvents(body, onFrame) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let rest = "";
  let frame = {};
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    // A "\r" at the very end may be the first half of "\r\n": it waits for the next chunk.
    const lines = (rest + value).split(/\r\n|\n|\r(?!$)/);
    rest = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (Object.keys(frame).length) onFrame(frame);
        frame = {};
      } else if (!line.startsWith(":")) {
        const cut = line.includes(":") ? line.indexOf(":") : line.length;
        const [name, text] = [line.slice(0, cut), line.slice(cut + 1).replace(/^ /, "")];
        if (name === "data") frame.data = frame.data === undefined ? text : `${frame.data}\n${text}`;
        else if (name === "event" || name === "id") frame[name] = text;
        else if (name === "retry" && /^\d+$/.test(text)) frame.retry = Number(text);
      }
    }
  }
}

const ACTIVE = new Set(["queued", "running"]);

/**
 * Follow a run's events from the start (replayed) to run.finished.
 *
 * The stream is read with fetch (an EventSource cannot send the session header). A dropped or
 * refused connection is reopened after the server's `retry:` interval, growing with each failure
 * (at most 10 s), with `Last-Event-ID` set to the last event seen. A 401 hands over to the token
 * form, a 404 means the run is gone; after a few failures in a row the run's state is asked, and a
 * finished run ends the stream. Events are delivered once each, in seq order.
 * Returns a handle with `close()`.
 */
export function followRun(runId, { onEvent, onEnd, onState = () => {} }) {
  const path = `/api/runs/${encodeURIComponent(runId)}`;
  const aborter = new AbortController();
  let last = 0;
  let closed = false;
  let retries = 0;
  let retryMs = 2000;

  const stop = () => {
    closed = true;
    aborter.abort();
  };

  const deliver = (ev) => {
    try {
      onEvent(ev);
      if (ev.kind === "run.finished" && onEnd) onEnd(ev);
    } catch (err) {
      setTimeout(() => { throw err; }); // a bug in the view: reported, and the stream goes on
    }
  };

  const onFrame = (frame) => {
    if (frame.retry !== undefined) retryMs = frame.retry;
    let ev;
    try {
      ev = JSON.parse(frame.data);
    } catch {
      return; // a frame without an event envelope (the opening `retry:`)
    }
    if (typeof ev.seq === "number") {
      if (ev.seq <= last) return; // a replay overlap after reconnecting
      last = ev.seq;
    }
    retries = 0;
    if (ev.kind === "run.finished") stop();
    deliver(ev);
  };

  const connect = async () => {
    const headers = { Accept: "text/event-stream" };
    if (last) headers["Last-Event-ID"] = String(last);
    const resp = await request(`${path}/events`, { headers, cache: "no-store", signal: aborter.signal });
    onState("live");
    await readEvents(resp.body, onFrame);
  };

  /** True when the run is over (its end delivered): nothing more will come. */
  const finished = async () => {
    try {
      const state = await api(path);
      if (ACTIVE.has(state.status)) return false;
      stop();
      if (onEnd) onEnd(null, state);
      return true;
    } catch {
      return false;
    }
  };

  const follow = async () => {
    while (!closed) {
      try {
        await connect();
      } catch (err) {
        if (closed) return;
        if (err.status === 401 || err.status === 404) {
          stop();
          onState(err.status === 404 ? "gone" : "signed-out");
          return;
        }
      }
      if (closed) return;
      retries += 1;
      onState("reconnecting");
      if (retries > 3 && (await finished())) return;
      await new Promise((resolve) => setTimeout(resolve, Math.min(retryMs * retries, 10000)));
    }
  };

  follow();
  return { close: stop, get lastSeq() { return last; } };
}
