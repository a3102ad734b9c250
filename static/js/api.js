// The service's HTTP API, as the dashboard uses it: fetch with the token, one error type,
// and a job's Server-Sent Events.
//
// The token is kept in localStorage and mirrored into the `towerboard_token` cookie, which
// the service also accepts: EventSource, download links and TensorBoard's own requests
// cannot carry an Authorization header, but they do carry same-origin cookies.

import { noteServerDate } from "./format.js";

const TOKEN_KEY = "towerboard.token";
const COOKIE = "towerboard_token";
export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const STATES = ["queued", "running", "succeeded", "failed", "cancelled"];
// A read that got no answer (or a server error) is asked again this often, by the jobs
// list and a job's page alike (see mayPass).
export const RETRY_MS = 3000;

export function getToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  token = token.trim();
  const secure = location.protocol === "https:" ? "; Secure" : "";
  if (token) {
    localStorage.setItem(TOKEN_KEY, token);
    document.cookie = `${COOKIE}=${encodeURIComponent(token)}; Path=/; SameSite=Strict${secure}`;
  } else {
    localStorage.removeItem(TOKEN_KEY);
    document.cookie = `${COOKIE}=; Path=/; Max-Age=0; SameSite=Strict${secure}`;
  }
}

/** Any non-2xx answer: `status`, the service's `detail` and its field `errors`. The
 *  message names the field errors too: a detail alone may only say "see `errors`". */
export class ApiError extends Error {
  constructor(status, detail, errors = []) {
    const fields = errors.map((e) => `${e.field}: ${e.message}`).join("; ");
    super(fields ? `${detail} ${fields}` : detail);
    this.status = status;
    this.detail = detail;
    this.errors = errors;
  }
}

/** Whether a failed call may succeed if asked again: no answer (a dropped connection, the
 *  service restarting) or a server error; not a refusal (401, 404, 409). */
export function mayPass(error) {
  return error.status === 0 || error.status >= 500;
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // Not JSON (a proxy's error page, say): the status line says enough.
  }
  const detail = (body && typeof body.detail === "string" && body.detail) ||
    `${response.status} ${response.statusText || "error"}`;
  const errors = body && Array.isArray(body.errors) ? body.errors : [];
  return new ApiError(response.status, detail, errors);
}

/** Call the API; returns parsed JSON (or text), throws ApiError. A 401 also fires
 *  `towerboard:unauthorized` on window, so the page can ask for a token. `body` is sent
 *  as JSON; `json`, JSON text, is sent as it is (a person's: what JSON.parse would drop,
 *  a key given twice, is the service's to refuse). */
export async function api(path, { method = "GET", body, json, signal } = {}) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, signal, credentials: "same-origin" };
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = json;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  const sent = Date.now(); // the service stamps its answer after this (noteServerDate)
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, `The service did not answer (${error.message}).`);
  }
  noteServerDate(response.headers.get("date"), sent); // ages and ETAs count by the service's clock
  if (response.status === 401) {
    window.dispatchEvent(new CustomEvent("towerboard:unauthorized"));
  }
  if (!response.ok) throw await errorOf(response);
  const type = response.headers.get("content-type") || "";
  const result = type.includes("json") ? await response.json() : await response.text();
  return { status: response.status, data: result };
}

export async function getJSON(path, options) {
  return (await api(path, options)).data;
}

// `deleted` and `exited` come on the all-jobs stream (a job's own stream has ended before
// its job can be deleted, or its worker be gone after the end; one opened as its job is
// deleted says `deleted`, `{id}`, and ends): `{job_id, id}` of a
// job deleted for good; `{job_id, id, devices}` once the worker of a job that ended while
// it was still exiting (the devices list marked its devices `exiting`) has gone.
const EVENT_NAMES = [
  "state", "start", "progress", "eval", "checkpoint", "trace", "phase", "end", "deleted",
  "exited",
];

/** Open an EventSource on `path` and hand its events to `on` (see followJob). */
function subscribe(path, on, { closeAtEnd }) {
  const source = new EventSource(path);
  let closed = false;
  const close = () => {
    closed = true;
    source.close();
  };
  for (const name of EVENT_NAMES) {
    source.addEventListener(name, (message) => {
      if (closed) return;
      let data;
      try {
        data = JSON.parse(message.data);
      } catch {
        return;
      }
      if (on[name]) on[name](data);
      if (on.any) on.any(name, data);
      // The service ends a job's stream after a terminal state; EventSource would reconnect.
      if (closeAtEnd && name === "state" && TERMINAL.has(data.state)) close();
    });
  }
  source.onopen = () => {
    if (on.open && !closed) on.open();
  };
  // EventSource.CONNECTING: the connection dropped and the browser retries by itself.
  // EventSource.CLOSED: an HTTP error answer (401 after the token changed, 502 from a proxy
  // while the service restarts) or not an event stream: the browser has given up for good.
  source.onerror = () => {
    if (on.error && !closed) on.error(source.readyState);
  };
  return close;
}

/** Follow a job's events. `on` maps event names (state, start, progress, eval,
 *  checkpoint, trace, phase, end) to handlers of the parsed data, `any` gets every event,
 *  `open` and `error` the connection's (`error` with the EventSource's readyState). The
 *  stream is closed once the job has ended, or by the returned function. */
export function followJob(jobId, on) {
  return subscribe(`/api/v1/jobs/${encodeURIComponent(jobId)}/events`, on, { closeAtEnd: true });
}

/** Follow every job's events (each carries its `job_id`), `deleted` and `exited` among
 *  them, until the returned function is called. The browser reconnects after a drop;
 *  `open` runs on every (re)connection, so a caller can re-read what it may have missed. */
export function followAllJobs(on) {
  return subscribe("/api/v1/events", on, { closeAtEnd: false });
}
