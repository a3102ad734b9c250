// Small formatters and DOM helpers. Every formatter takes null or undefined and shows "—".

import { hostGpus } from "./host.js";

export const DASH = "—";

const isNum = (v) => typeof v === "number" && Number.isFinite(v);

export function num(value, digits = 4) {
  if (!isNum(value)) return DASH;
  if (value !== 0 && Math.abs(value) < 10 ** -digits) return value.toExponential(2);
  return Number(value.toFixed(digits)).toString();
}

export function percent(value) {
  return isNum(value) ? `${(value * 100).toFixed(1)}%` : DASH;
}

export function rate(value) {
  if (!isNum(value)) return DASH;
  if (value >= 10000) return `${(value / 1000).toFixed(1)}k`;
  return value >= 100 ? value.toFixed(0) : value.toFixed(1);
}

/** Seconds as "45s", "3m 05s", "2h 10m", "3d 4h". */
export function duration(seconds) {
  if (!isNum(seconds) || seconds < 0) return DASH;
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

export function seconds(iso) {
  if (!iso) return null;
  const t = Date.parse(iso);
  return Number.isNaN(t) ? null : t / 1000;
}

// The service's clock less this browser's, in ms, from the `Date` header of its answers
// (api.js). The times the service and its workers report (created_at, a report's
// updated_at) are by the service's clock: counted against a browser clock a minute or two
// off, a job reporting every 2 s said "no report for 1m 30s", and ages stuck at 0s.
let clockOffsetMs = 0;
// What every answer so far says of that offset: at least `low`, below `high` (ms).
let low = -Infinity;
let high = Infinity;

/** Take an answer's `Date` header, its request sent at `sentMs` and the answer received at
 *  `receivedMs` by this browser's clock. The service read its clock somewhere in between,
 *  and the header has it in whole seconds: so the offset is at least `date - receivedMs`
 *  and below `date + 1000 - sentMs`. Taken as the answer's arrival alone (its mid-second),
 *  an answer 3 s in transit (a slow network, a busy page) set the clock 3 s back; kept as
 *  bounds that each answer narrows, a late answer's wide ones change nothing, and a prompt
 *  one's pin it within a second. The offset is their middle, so it moves only as they
 *  narrow (ages do not step back and forth by one); an answer they do not fit (either
 *  clock was set anew) starts them again from its own. */
export function noteServerDate(header, sentMs, receivedMs = Date.now()) {
  const date = Date.parse(header || "");
  if (Number.isNaN(date)) return;
  const [least, below] = [date - receivedMs, date + 1000 - sentMs];
  if (least >= high || below <= low) [low, high] = [-Infinity, Infinity];
  [low, high] = [Math.max(low, least), Math.min(high, below)];
  clockOffsetMs = (low + high) / 2;
}

/** Now by the service's clock, in seconds. */
export function serverNow() {
  return (Date.now() + clockOffsetMs) / 1000;
}

/** Time since an ISO timestamp, e.g. "3m 05s". */
export function age(iso, now = serverNow()) {
  const t = seconds(iso);
  return t === null ? DASH : duration(Math.max(0, now - t));
}

/** Seconds without a progress report after which a running job's time left is unknown.
 *  A worker reports at least every 2 s while it trains, so this is a stall (or a long
 *  save): counted on, the ETA would reach 0 and say the job is nearly done. As the CLI. */
export const QUIET_SECONDS = 60;

/** A running job's time left: the worker's ETA, counted down since it was reported. A job
 *  not running has none, as `towerboard status` says: a succeeded one's "0s" (its folded
 *  `eta_seconds` is 0) read as a job about to end. */
export function eta(job, now = serverNow()) {
  const p = job.progress;
  if (job.state !== "running" || !p || !isNum(p.eta_seconds)) return DASH;
  const at = seconds(p.updated_at);
  const quiet = at === null ? 0 : Math.max(0, now - at);
  if (quiet > QUIET_SECONDS) return `? (no report for ${duration(quiet)})`;
  return duration(Math.max(0, p.eta_seconds - quiet));
}

export function bytes(n) {
  if (!isNum(n)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function localTime(iso) {
  const t = seconds(iso);
  return t === null ? DASH : new Date(t * 1000).toLocaleString();
}

/** The job's completion in 0..100, or null when it has no step count yet. */
export function progressPercent(job) {
  const p = job.progress;
  if (job.state === "succeeded") return 100;
  if (!p) return null;
  if (isNum(p.percent)) return p.percent;
  if (isNum(p.step) && isNum(p.total) && p.total > 0) return (100 * p.step) / p.total;
  return null;
}

export function stepText(job) {
  const p = job.progress;
  if (!p || !isNum(p.step)) {
    if (job.state === "queued") return "queued";
    // A worker between its start and its first line says so (`preparing`).
    return job.state === "running" && p && p.phase ? phaseText(p) : DASH;
  }
  return isNum(p.total) ? `${p.step} / ${p.total}` : String(p.step);
}

/** Make `el` say `text`, unless it says that already: written anew, its text is a new
 *  node, and a selection in it (a job's id, being copied) goes. */
export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

/** Dim `button` while what it asked the service for is out (`on`), or undo that.
 *  aria-disabled, not disabled: a disabled button drops the keyboard's focus to <body>,
 *  and a keyboard or screen-reader user is back at the page's top; a dimmed one keeps it,
 *  and its handler ignores presses meanwhile (`dimmed`). */
export function dim(button, on) {
  if (on) button.setAttribute("aria-disabled", "true");
  else button.removeAttribute("aria-disabled");
}

export function dimmed(button) {
  return button.getAttribute("aria-disabled") === "true";
}

/** document.createElement with attributes and children; strings become text nodes. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** A service message as nodes: its `quoted` names (keys, paths, commands) as <code>, as
 *  they read in Markdown; a message with an odd backtick is left as plain text. */
export function withCode(text) {
  const parts = String(text).split("`");
  if (parts.length % 2 === 0) return [String(text)];
  return parts.map((part, i) => (i % 2 ? h("code", {}, part) : part)).filter((p) => p !== "");
}

/** A progress bar (role=progressbar) showing `percent` or an indeterminate stripe. */
export function progressBar(job) {
  const value = progressPercent(job);
  const bar = h("div", {
    class: `bar bar-${job.state}`,
    role: "progressbar",
    "aria-label": "Progress",
    "aria-valuemin": "0",
    "aria-valuemax": "100",
  });
  const fill = h("div", { class: "bar-fill" });
  bar.append(fill);
  setProgress(bar, job, value);
  return bar;
}

export function setProgress(bar, job, value = progressPercent(job)) {
  for (const cls of [...bar.classList]) {
    if (cls.startsWith("bar-") && cls !== "bar-large") bar.classList.remove(cls);
  }
  bar.classList.add(`bar-${job.state}`);
  bar.setAttribute("aria-valuetext", stepText(job)); // "51 / 300", as the page shows it
  const fill = bar.firstElementChild;
  if (value === null) {
    bar.removeAttribute("aria-valuenow");
    fill.style.width = "0%";
  } else {
    const clamped = Math.max(0, Math.min(100, value));
    bar.setAttribute("aria-valuenow", clamped.toFixed(1));
    fill.style.width = `${clamped}%`;
  }
}

/** The devices a job holds ("gpu:0, gpu:1", or "cpu:0 (2 towers)" where one CPU slot runs
 *  every tower); what a queued job waits for, in the units its queue line and `towerboard
 *  status ID` say it ("waiting for 2 GPUs (2 towers)", or on a CPU-only host "waiting for
 *  1 job slot (2 towers)": a slot runs every tower of a job), "waiting for devices" until
 *  the host's kind is known (host.js); "—" once it has ended (they are freed), or with
 *  `ranOn` (a job's own page) the devices its last attempt ran on ("ran on gpu:0, gpu:1"),
 *  worth knowing of a slow or failed job. */
export function devicesText(job, { ranOn = false } = {}) {
  const towers = job.spec && job.spec.towers;
  const count = isNum(towers) ? ` (${towers} tower${towers === 1 ? "" : "s"})` : "";
  const held = Array.isArray(job.devices) ? job.devices : [];
  if (held.length) return held.join(", ") + (isNum(towers) && held.length !== towers ? count : "");
  const ran = Array.isArray(job.ran_on) ? job.ran_on : [];
  if (ranOn && ran.length && job.state !== "queued" && job.state !== "running") {
    return `ran on ${ran.join(", ")}`;
  }
  if (job.state !== "queued") return DASH;
  const gpus = hostGpus();
  if (gpus === null || !isNum(towers)) return `waiting for devices${count}`;
  const needed = gpus ? towers : 1;
  return `waiting for ${needed} ${gpus ? "GPU" : "job slot"}${needed === 1 ? "" : "s"}${count}`;
}

/** What a job trains on, as its worker loaded it ("205 train · 51 eval · 4 classes ·
 *  8×8×1"); "—" until its worker has said. */
export function dataText(progress) {
  const d = progress && progress.data;
  if (!d || !Array.isArray(d.image_shape)) return DASH;
  const count = (n) => (isNum(n) ? n.toLocaleString("en-US") : DASH);
  return `${count(d.train_examples)} train · ${count(d.eval_examples)} eval · ` +
    `${count(d.classes)} classes · ${d.image_shape.join("×")}`;
}

/** A view's notice that its live updates (an event stream) are down: "reconnecting" while
 *  the browser retries, "stopped" with a Reload button once it has given up. `el` goes in
 *  the view; `reload` runs on the button. It is a live region, written only when what it
 *  says changes: each of the browser's retries (every 3 s or so while the service is down)
 *  rewrote it, and a screen reader said it again each time. */
export function liveNotice(reload) {
  const text = h("span", { class: "live-notice-text" });
  const button = h("button", { type: "button", class: "link live-reload" }, "Reload");
  const el = h("div", { class: "live-notice", role: "status", hidden: true }, text, " ", button);
  button.addEventListener("click", () => {
    el.hidden = true;
    reload();
  });
  const show = (state, message) => {
    if (el.dataset.live !== state) el.dataset.live = state;
    if (text.textContent !== message) text.textContent = message;
    if (button.hidden !== (state !== "stopped")) button.hidden = state !== "stopped";
    if (el.hidden) el.hidden = false;
  };
  return {
    el,
    /** Report an EventSource error by its readyState. */
    error(readyState) {
      if (readyState === EventSource.CLOSED) {
        show("stopped", "Live updates stopped: the service refused or ended the event stream.");
      } else {
        show("reconnecting", "Live updates interrupted; reconnecting…");
      }
    },
    clear() {
      if (!el.hidden) el.hidden = true;
    },
  };
}

/** Why a job ended badly, as the service says it, without a leading "Cancelled:" or
 *  "Failed:" (the state badge beside it says that); "" when it gave no reason. */
export function endReason(job) {
  const reason = job.error && job.error.reason ? String(job.error.reason) : "";
  return reason.replace(/^(cancelled|failed):\s*/i, "");
}

/** How a cancelled job stopped, in plain words, from its result (the worker's
 *  result.json): "Stopped at step 8000 of 10000, after a checkpoint." (the trainer's
 *  "Stopped by SIGTERM at step 8000, after a checkpoint."), the worker's message where it
 *  gives no step, or "Cancelled while queued: it never started."; for one whose cancel
 *  ended otherwise (its error says how: a worker killed after the grace), `cutShortText`.
 *  "" for any other job. */
export function stoppedText(job) {
  if (job.state !== "cancelled") return "";
  if (job.error) return cutShortText(job);
  const result = job.result || {};
  if (result.outcome === "cancelled" && Number.isInteger(result.step)) {
    const of = Number.isInteger(result.total) ? ` of ${result.total}` : "";
    const saved = typeof result.checkpoint === "string" && result.checkpoint
      ? ", after a checkpoint" : "";
    return `Stopped at step ${result.step}${of}${saved}.`;
  }
  if (typeof result.message === "string" && result.message.trim()) return sentence(result.message);
  return job.result || job.started_at ? "" : "Cancelled while queued: it never started.";
}

/** A cancel that did not end in its worker's own checkpoint and exit: killed, as it had
 *  not exited within the grace after SIGTERM, or stopped by a signal first. It is still a
 *  cancel (nothing failed): the service's reason, and the step the worker last reported,
 *  which is no checkpoint's (steps past its latest checkpoint are trained again on a
 *  resume). "The worker did not exit within 10 s of SIGTERM and was killed with SIGKILL.
 *  Its last report was at step 12 of 100." The CLI's `display.stopped` says the same. */
function cutShortText(job) {
  const reason = endReason(job).trim();
  const p = job.progress || {};
  const of = Number.isInteger(p.total) ? ` of ${p.total}` : "";
  return [
    reason ? sentence(reason.charAt(0).toUpperCase() + reason.slice(1)) : "",
    Number.isInteger(p.step) ? `Its last report was at step ${p.step}${of}.` : "",
  ].filter(Boolean).join(" ");
}

/** `text` with its first character upper-cased where it is a lower-case ASCII letter: a
 *  reason the service gives after "Cancelled: " ("the worker did not exit within …") read,
 *  stripped of that, in lower case among the capitalised ones of the jobs table's WHY.
 *  Only ASCII: a name or a path that starts a reason keeps its own first character. */
export function capitalised(text) {
  return /^[a-z]/.test(text) ? text.charAt(0).toUpperCase() + text.slice(1) : text;
}

// The trainer's message of an attempt resumed at its latest checkpoint's step ("Finish at
// step N"): "Finished at step N, its checkpoint: no step trained." (trainer/run.py). Its
// result carries no other sign that the attempt trained nothing.
const NO_STEP_TRAINED = /: no step trained\.?$/;

/** A succeeded job whose last attempt trained no step (finished at its latest
 *  checkpoint, restored, evaluated and exported): "trained no step: finished at step 20's
 *  checkpoint"; "" for any other job. The job's page says it beside its attempt, as
 *  `towerboard status ID` does (`display.finished_here`): its "20 / 20" alone read as
 *  steps that attempt trained. */
export function noStepText(job) {
  const result = job.result || {};
  if (job.state !== "succeeded" || typeof result.message !== "string") return "";
  if (!NO_STEP_TRAINED.test(result.message.trim())) return "";
  const step = Number.isInteger(result.step) ? result.step
    : job.progress && Number.isInteger(job.progress.step) ? job.progress.step : null;
  return `trained no step: finished at ${step === null ? "its" : `step ${step}'s`} checkpoint`;
}

/** `text` as a sentence, ending in one full stop: a worker's reason may end in none, and
 *  another sentence follows it. */
export function sentence(text) {
  return String(text).trim().replace(/\.?$/, ".");
}

export function stateBadge(state) {
  return h("span", { class: `state state-${state}` }, state);
}

export function jobLink(job) {
  return `#/jobs/${encodeURIComponent(job.id)}`;
}

/** The phase, with how far it is when the worker says (`eval 3/20`); while `preparing`,
 *  the stage its worker says it is in, `loading data 42%` where it says how far (a whole
 *  percent, never 100 before it is through), as `towerboard status` says it. */
export function phaseText(progress) {
  const { phase, phase_done: done, phase_total: of, stage } = progress;
  if (phase === "preparing" && typeof stage === "string" && stage) {
    // Floored from the amounts, not `stage_percent`: rounded to a tenth, that is 100.0 from
    // 99.95% on, while the stage is not through.
    const { stage_done: part, stage_total: whole } = progress;
    const far = Number.isInteger(part) && Number.isInteger(whole) && whole > 0
      && part >= 0 && part <= whole;
    return far ? `${stage} ${Math.floor((100 * part) / whole)}%` : stage;
  }
  return Number.isInteger(done) && Number.isInteger(of) ? `${phase} ${done}/${of}` : phase;
}
