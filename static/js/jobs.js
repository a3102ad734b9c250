// The jobs table: every job's state and progress at a glance, filtered by state and by
// name, live.
//
// One Server-Sent-Events stream of every job's events keeps the rows live (progress as the
// workers write it; new jobs and state changes as they happen). The list is re-read when
// the stream (re)connects, when a job enters the filter (below the rows shown, it changes
// their count) or leaves it where the rows shown may change, and every POLL_MS as a
// safety net;
// at most once a REREAD_MS for a burst of events. "Show more" reads the next page from the API's next_cursor; a re-read reads
// as many rows as are shown, MAX_LIMIT at a time. A job deleted (here, elsewhere or from the
// CLI: the stream's `deleted`) leaves the table at once, and no read still out brings it back.
// Who holds a device changes at a job's start or end and, for an end that left its worker
// exiting, at the stream's `exited`: the devices panel (app.js) is told each time.
// Each row's checkbox picks the job for "Compare in TensorBoard (N)", which adds the jobs
// picked to the shared TensorBoard as a job page's "Open in TensorBoard" adds its job
// (tensorboard.js), and opens it filtered to their runs. What is picked is kept while the
// dashboard is open (re-reads, live updates, Show more, other filters and searches, a job's
// page and back) and through a reload of its tab, and a deleted job leaves it.
// The name search asks the API (`?name=`) and keeps the stream's new jobs to those whose
// names hold the text as the API matches them (SQLite's LIKE: any case, ASCII only).
// The Queued filter lists the jobs in the order they start, as the API lists the queued
// jobs alone, each (with no search) with its place: 1st, 2nd, ... A job entering the queue
// goes where the next read puts it (a resumed one behind those of its priority, one of a
// higher priority ahead of them), not on top, and so does one whose priority is changed.

import { RETRY_MS, STATES, TERMINAL, followAllJobs, getJSON, mayPass } from "./api.js";
import {
  age, capitalised, devicesText, dim, dimmed, endReason, eta, h, jobLink, liveNotice, num, percent,
  progressBar, rate, setProgress, setText, stateBadge, stepText, stoppedText, withCode,
} from "./format.js";
import { arrangeInPlace } from "./inplace.js";
import { ordinal } from "./queue.js";
import { tensorBoardOpener } from "./tensorboard.js";

const POLL_MS = 15000;
const PAGE = 50;
const MAX_LIMIT = 200; // the API's largest page
const MAX_NAME = 200; // the API's longest `name` filter
const SEARCH_MS = 250; // typing pauses this long before the list is read again
const REREAD_MS = 1000; // a burst of events re-reads the list at most this often

const COLUMNS = [
  ["name", "Name"], ["state", "State"], ["progress", "Progress"], ["loss", "Loss"],
  ["accuracy", "Accuracy"], ["speed", "Examples/s"], ["eta", "ETA"], ["devices", "Devices"],
  ["age", "Age"],
];
// Which loss and accuracy a row shows, on its header and under each number ("train",
// "eval"): the last training batch's accuracy, shown alone here, read as the model's
// (98.4% for a job whose eval said 94.9%). A word under the number, not a column of its
// own: the nine columns only just fit from 820px on.
const HEADER_TITLES = {
  loss: "The loss of the last training batch the worker reported",
  accuracy: "The accuracy of the job's latest eval, on held-out examples; before its first "
    + "eval, the last training batch's (which runs higher)",
};

/** Merge a progress.jsonl event into the job as the service folds it (service/progress.py). */
export function applyProgressEvent(job, event) {
  const p = { ...(job.progress || {}) };
  // A trace's step is the trace's last: its line comes once the trace is read, off the
  // worker's loop, after reports of later steps. Still a step done: the job is at least
  // there, never back.
  if (Number.isInteger(event.step)) {
    const trace = event.event === "trace" && Number.isInteger(p.step);
    p.step = trace ? Math.max(p.step, event.step) : event.step;
  }
  if (Number.isInteger(event.total)) p.total = event.total;
  if (typeof event.phase === "string") {
    p.phase = event.phase;
    const known = Number.isInteger(event.phase_done) && Number.isInteger(event.phase_total);
    p.phase_done = known ? event.phase_done : null;
    p.phase_total = known ? event.phase_total : null;
    // A preparation's stage, with how far it is where it says; a phase without one ends it.
    const stage = typeof event.stage === "string" ? event.stage : null;
    const done = event.stage_done;
    const of = event.stage_total;
    const far = stage !== null && Number.isInteger(done) && Number.isInteger(of) && of > 0
      && done >= 0 && done <= of;
    p.stage = stage;
    p.stage_done = far ? done : null;
    p.stage_total = far ? of : null;
    p.stage_percent = far ? Math.round((1000 * done) / of) / 10 : null;
  }
  if (event.event === "progress") {
    for (const key of ["loss", "accuracy", "examples_per_sec", "eta_seconds", "learning_rate"]) {
      p[key] = typeof event[key] === "number" ? event[key] : null;
    }
  }
  // Each tower's GPU's peak memory, as the service folds it: a list of numbers alone
  // (else the last good one stays).
  const memory = Array.isArray(event.memory_mb) && event.memory_mb.every((mb) => typeof mb === "number");
  if (event.event === "progress" && memory) p.memory_mb = event.memory_mb;
  if (event.event === "start" && Number.isInteger(event.towers)) p.towers = event.towers;
  // What it trains on: the service checks the whole summary before it stores one (a
  // worker's line is trusted here as it is shown, and the next read replaces it).
  if (event.event === "start" && event.data && Array.isArray(event.data.image_shape)) {
    p.data = event.data;
  }
  if (event.event === "checkpoint" && typeof event.checkpoint === "string") {
    p.checkpoint = event.checkpoint;
  }
  // Done in 0 s only when it succeeded, as the service folds it: a cancelled job has none,
  // and ends with the loss and accuracy of the step it stopped at, where its end says them.
  if (event.event === "end") {
    p.eta_seconds = event.outcome === "succeeded" ? 0 : null;
    for (const key of ["loss", "accuracy"]) {
      if (typeof event[key] === "number") p[key] = event[key];
    }
  }
  // A list of numbers alone, as the service keeps it: a null in one (from a worker other
  // than the trainer) made every later event throw as the job's page drew its towers.
  const times = Array.isArray(event.tower_ms) && event.tower_ms.every((ms) => typeof ms === "number");
  if (times) p.tower_ms = event.tower_ms;
  if (event.event === "trace" && Number.isInteger(event.step)) p.trace_step = event.step;
  // A trace whose times could not be read (no CUPTI on a GPU host) says why in their
  // place: the older trace's times are not its; why stays until a trace with times.
  if (event.event === "trace" && times) {
    p.tower_ms_error = null;
  } else if (event.event === "trace" && !("tower_ms" in event)) {
    p.tower_ms = null;
    p.tower_ms_error = typeof event.tower_ms_error === "string" ? event.tower_ms_error : null;
  }
  if (typeof event.time === "number") p.updated_at = new Date(event.time * 1000).toISOString();
  p.percent = Number.isInteger(p.step) && p.total ? Math.round((1000 * p.step) / p.total) / 10 : null;
  const updated = { ...job, progress: p };
  if (event.event === "eval") {
    updated.eval = {
      step: event.step, loss: event.eval_loss ?? null, accuracy: event.eval_accuracy ?? null,
      // Over how many examples (the job page's "97.3% on 640 examples"), as the service folds it.
      examples: Number.isInteger(event.eval_examples) ? event.eval_examples : null,
    };
  }
  return updated;
}

let moment = 0;
let listHash = "#/"; // the list last shown, filters and all: where a job page goes back to
let pendingNotice = ""; // said atop the list the next time it is shown
// The jobs picked to compare in TensorBoard, id -> name, in the order picked: here, not in
// a mount of the list, so a filter (which mounts the list anew) or a job's page keeps them,
// and in the tab's sessionStorage (PICKED_KEY), so a reload of the tab keeps them too.
const PICKED_KEY = "towerboard.compare";
const picked = new Map(restoredPicks());
// Picks restored from a reload whose jobs are still to be checked: one deleted meanwhile,
// while no page of this tab was open to see it go, drops out at the list's first mount.
let unchecked = [...picked.keys()];

/** The picks sessionStorage holds ([id, name] pairs), none where it holds nothing usable. */
function restoredPicks() {
  try {
    const pairs = JSON.parse(sessionStorage.getItem(PICKED_KEY) || "[]");
    return Array.isArray(pairs) ? pairs.filter((pair) => Array.isArray(pair) && pair.length === 2
      && typeof pair[0] === "string" && typeof pair[1] === "string") : [];
  } catch {
    return []; // not JSON, or no storage (a browser that refuses it)
  }
}

/** Keep the picks for a reload of this tab. */
function savePicked() {
  try {
    if (picked.size) sessionStorage.setItem(PICKED_KEY, JSON.stringify([...picked]));
    else sessionStorage.removeItem(PICKED_KEY);
  } catch {
    // No storage (full, or refused): they are kept while the page is open, as before.
  }
}

/** Take `id` out of the picks; whether it was picked. */
function unpick(id) {
  if (!picked.delete(id)) return false;
  savePicked();
  return true;
}

/** The job is no longer one to compare (deleted: a job page that saw it go says so). */
export function unselect(id) {
  unpick(id);
}

/** The jobs list as last shown (its filter kept), for a job page to go back to. */
export function jobsListHash() {
  return listHash;
}

/** Say `text` atop the jobs list when it is next shown (a job page that deleted its job
 *  goes back to the list, which says so). */
export function noticeOnJobs(text) {
  pendingNotice = text;
}

/** The jobs list's address for a state filter and a name search ("" for none). */
export function listAddress(state, name) {
  const params = new URLSearchParams();
  if (state) params.set("state", state);
  if (name) params.set("name", name);
  return params.size ? `#/?${params}` : "#/";
}

/** Lower case for ASCII letters alone, as SQLite's LIKE compares them. */
function asciiLower(text) {
  return text.replace(/[A-Z]/g, (c) => c.toLowerCase());
}

/** Whether a job's name holds `text` as the API's `?name=` finds it: in any case of the
 *  ASCII letters, `%` and `_` taken literally. */
export function nameHolds(name, text) {
  return asciiLower(name).includes(asciiLower(text));
}

/** A strictly increasing count, to order what the stream said against the start of an
 *  HTTP read: the read's answer may be older than an event that came while it was out. */
export function mark() {
  moment += 1;
  return moment;
}

/** Which copy of a job to show: `snapshot`, read by a request that started at `askedAt`,
 *  or `known`, last changed by the stream at `streamedAt` (undefined if never). Of two
 *  attempts, the copy the service wrote later is newer whatever its state: an ended job
 *  resumed, or run again after a crash, is queued again as a later attempt, and a resume
 *  cancelled before its attempt started is its earlier attempt, ended, again. Within one
 *  attempt the end is final, so an ended copy wins over a live one; otherwise the
 *  stream's copy wins if it changed after the read began. */
export function fresher(known, streamedAt, snapshot, askedAt) {
  if (!known) return snapshot;
  if (snapshot.attempts !== known.attempts) {
    // Its time of writing, as the service gives it (ISO in UTC; read as a time, not as
    // text: a time on the second has no fraction). Within one millisecond, the later
    // attempt, as attempts only go back when a resume is taken back, a later write.
    const [then, now] = [Date.parse(known.updated_at), Date.parse(snapshot.updated_at)];
    if (now !== then) return now > then ? snapshot : known;
    return snapshot.attempts > known.attempts ? snapshot : known;
  }
  const knownEnded = TERMINAL.has(known.state);
  const snapshotEnded = TERMINAL.has(snapshot.state);
  if (knownEnded !== snapshotEnded) return knownEnded ? known : snapshot;
  return streamedAt !== undefined && streamedAt > askedAt ? known : snapshot;
}

export function mountJobs(view, query) {
  const filter = STATES.includes(query.get("state")) ? query.get("state") : "";
  const runOrder = filter === "queued"; // the order they start in, not newest first
  let search = (query.get("name") || "").trim().slice(0, MAX_NAME); // "" for none
  listHash = listAddress(filter, search);
  let jobs = new Map(); // id -> job, in list order
  let count = 0;
  let nextCursor = null; // the API's cursor for the rows after those shown
  let wanted = PAGE; // how many rows to show
  let reads = 0; // reads started; an answer to any but the latest is dropped
  let timer = null;
  let ticker = null;
  let stopped = false;
  const rows = new Map(); // id -> {tr, cells}
  const streamed = new Map(); // id -> mark() of the stream's last change to the job
  const arrived = new Map(); // id -> mark() when the stream added the job as a new row
  const deleted = new Set(); // ids the stream said were deleted (ids are never reused)
  // Until the first read answers, where a job the stream names goes is not known: the
  // stream's jobs wait here (id -> {job, at: mark()}) for it.
  let loaded = false;
  const early = new Map();
  // Back to this list (the browser's Back from a job, a reload): as many rows as were shown
  // and scrolled where it was, as its own history entry keeps them; it came back with the
  // first page at its top, the rows of Show more and the place among them gone. A list
  // opened anew (a link, a chip: a new entry) starts at its top.
  const place = history.state && history.state.jobsList;
  if (place && Number.isInteger(place.wanted) && place.wanted > PAGE) {
    wanted = Math.min(place.wanted, 20 * MAX_LIMIT);
  }
  let scrollBack = place && Number.isFinite(place.scrollY) ? place.scrollY : null;
  let placeTimer = null;
  function keepPlace() {
    clearTimeout(placeTimer);
    placeTimer = null;
    if (stopped || (location.hash || "#/") !== listHash) return; // another entry by now
    history.replaceState({ ...history.state, jobsList: { wanted, scrollY: window.scrollY } }, "");
  }
  function keepPlaceSoon() {
    if (placeTimer === null) placeTimer = setTimeout(keepPlace, 200);
  }
  window.addEventListener("scroll", keepPlaceSoon, { passive: true });

  const chips = h("div", { class: "chips", role: "group", "aria-label": "Filter by state" },
    ["", ...STATES].map((state) => h("button", {
      type: "button",
      class: "chip",
      dataset: { state },
      "aria-pressed": String(state === filter),
      // The hash change mounts the table again, with this filter and the search as typed
      // (a chip pressed within the typing pause keeps what was typed).
      onclick: () => { location.hash = listAddress(state, searchBox.value.trim()); },
    }, state || "all")));
  // Typing reads the list again (after a pause) without mounting it again, so the field
  // keeps the focus; the address follows (replaced, not pushed: Back leaves the list).
  const searchBox = h("input", {
    type: "search", id: "jobs-search", class: "search", value: search,
    maxlength: String(MAX_NAME), placeholder: "Find by name", autocomplete: "off",
    spellcheck: "false", "aria-label": "Find jobs by name", "aria-controls": "jobs-table",
  });
  let typing = null;
  const searchNow = () => {
    clearTimeout(typing);
    typing = null;
    const text = searchBox.value.trim();
    if (text === search) return;
    search = text;
    listHash = listAddress(filter, search);
    history.replaceState(history.state, "", listHash);
    wanted = PAGE; // a new search starts from its first page
    keepPlace();
    refresh();
  };
  searchBox.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(searchNow, SEARCH_MS);
  });
  searchBox.addEventListener("keydown", (event) => {
    if (event.key === "Enter") searchNow();
    else if (event.key === "Escape" && searchBox.value) {
      event.preventDefault();
      searchBox.value = "";
      searchNow();
    }
  });
  const clearSearch = h("button", { type: "button", class: "clear-search",
    onclick: () => { searchBox.value = ""; searchNow(); searchBox.focus(); } }, "Clear search");
  // Focusable from script only: where the keyboard goes on when the last row it was on goes.
  const summary = h("p", { class: "muted small", id: "jobs-summary", tabindex: "-1" }, "Loading…");
  const tbody = h("tbody");
  // Hidden until the first read answers: a bare header said nothing (and, refused for
  // want of a token, looked like an empty list).
  const table = h("table", { class: "jobs", id: "jobs-table", hidden: true },
    h("thead", {}, h("tr", {}, h("th", { class: "col-pick" }, h("span", { class: "visually-hidden" }, "Compare")),
      COLUMNS.map(([key, label]) => h("th", { class: `col-${key}`, title: HEADER_TITLES[key] }, label)))),
    tbody);
  const emptyText = h("p");
  const empty = h("div", { class: "empty", hidden: true },
    emptyText, h("a", { class: "button", href: "#/submit" }, "Submit a job"), clearSearch);
  const more = h("button", { type: "button", class: "more", hidden: true, onclick: showMore },
    "Show more");
  const error = h("p", { class: "error", role: "alert", hidden: true });
  // What a job page did before it came back here ("Job … deleted."). A status region that is
  // in the page before its text is set, so screen readers announce the text.
  const flash = h("p", { class: "flash", id: "jobs-notice", role: "status", tabindex: "-1",
    hidden: true });
  const notice = liveNotice(() => {
    closeStream();
    closeStream = follow();
  });
  // Compare in TensorBoard: the jobs picked, added to what the shared TensorBoard shows
  // (`merge`, as a job page's Open in TensorBoard: other users' jobs stay) and opened in a
  // new tab filtered to theirs. Always there, dimmed (still focusable) with none picked:
  // shown as the first box was ticked, it would move the rows under the pointer.
  const compare = tensorBoardOpener({
    jobIds: () => [...picked.keys()],
    button: { id: "compare-tensorboard", "aria-disabled": "true",
      title: "Add the jobs picked to the shared TensorBoard (the jobs it shows already stay) " +
        "and open it in a new tab, filtered to their runs" },
    label: "Compare in TensorBoard",
    statusId: "compare-status",
    noticeId: "compare-notice",
    again: "Show these jobs again",
    // A job deleted meanwhile, unseen (the service refused it as unknown): named as it was
    // picked, it leaves the picks, and the opener compares the rest.
    named: (id) => picked.get(id),
    deleted: (ids) => {
      for (const id of ids) unpick(id);
      showPicked();
    },
  });
  // Unseen with none picked, its room kept (shown, it would move what is beside it).
  const clearPicked = h("button", { type: "button", id: "compare-clear", class: "link",
    onclick: () => {
      picked.clear();
      savePicked();
      showPicked();
      compare.button.focus(); // this button is hidden now: the keyboard stays beside it
    } }, "Clear selection");

  view.append(
    h("div", { class: "view-head" }, h("h1", {}, "Jobs"),
      h("div", { class: "actions" }, clearPicked, compare.button,
        h("a", { class: "button primary", href: "#/submit" }, "New job"))),
    compare.status, compare.notice,
    flash, h("div", { class: "filters" }, chips, searchBox), error, notice.el, h("div", { class: "table-wrap" }, table), empty, summary,
    more,
  );
  if (pendingNotice) {
    const text = pendingNotice;
    pendingNotice = "";
    flash.hidden = false;
    // The button that was pressed has gone with its page: the keyboard goes on from here.
    flash.focus({ preventScroll: true });
    setTimeout(() => { if (!stopped) flash.textContent = text; }, 50);
  }

  function row(job) {
    let entry = rows.get(job.id);
    if (!entry) {
      const cells = Object.fromEntries(COLUMNS.map(([key, label]) =>
        [key, h("td", { class: `col-${key}`, dataset: { label } })]));
      cells.name.append(h("a", { href: jobLink(job), class: "job-name" }), h("span", { class: "job-id" }),
        h("span", { class: "job-reason", hidden: true }));
      const bar = progressBar(job);
      // Named by its job: a screen reader's list of the page's progress bars said
      // "Progress" for every row. (A job's name never changes.)
      bar.setAttribute("aria-label", `Progress of ${job.name}`);
      cells.progress.append(bar, h("span", { class: "step" }));
      for (const key of ["loss", "accuracy"]) {
        cells[key].append(h("span", { class: "value" }), h("span", { class: "kind" }));
      }
      // Its place in the queue, under the Queued filter (`render` writes it).
      cells.state.append(h("span", { class: "queue-place", hidden: true }));
      // Named by its job, by name and id (two jobs may share a name).
      const box = h("input", { type: "checkbox", class: "pick",
        "aria-label": `Compare ${job.name} (${job.id})`,
        onchange: () => {
          if (box.checked) picked.set(job.id, job.name);
          else picked.delete(job.id);
          savePicked();
          showPicked();
        } });
      const pick = h("td", { class: "col-pick" }, h("label", { class: "pick-target" }, box));
      const tr = h("tr", { dataset: { job: job.id } }, pick, Object.values(cells));
      entry = { tr, cells, bar, box };
      rows.set(job.id, entry);
    }
    const { cells, bar, box } = entry;
    if (box.checked !== picked.has(job.id)) box.checked = picked.has(job.id);
    const p = job.progress || {};
    entry.tr.dataset.state = job.state;
    const [name, id, why] = cells.name.children;
    // Each cell is written only where its text changes: at every report of the job, a
    // name or id being selected to copy lost its selection.
    setText(name, job.name);
    setText(id, job.id);
    // Why it failed or was cancelled, so the table answers that without opening the job;
    // two lines at most here, the whole reason on hover and on the job's page. A job
    // cancelled as asked has no error: where it stopped, from its result, in grey.
    // Its `quoted` names (keys, paths) as <code>, as the job's page and the submit form
    // show them: they read with literal backticks here. Its first letter a capital, as
    // every reason's is: a killed cancel's, "Cancelled: " taken off, began in lower case.
    const reason = capitalised(endReason(job) || stoppedText(job));
    if (entry.reason !== reason) {
      entry.reason = reason;
      why.replaceChildren(...withCode(reason));
      why.title = why.textContent; // as it reads, backticks and all gone
      why.hidden = !reason;
    }
    const badge = cells.state.querySelector(".state");
    if (!badge) cells.state.prepend(stateBadge(job.state));
    else if (badge.textContent !== job.state) badge.replaceWith(stateBadge(job.state));
    setProgress(bar, job);
    setText(cells.progress.lastChild, stepText(job));
    setMetric(cells.loss, num(p.loss), typeof p.loss === "number" ? "train" : "");
    const evaluated = job.eval && typeof job.eval.accuracy === "number";
    setMetric(cells.accuracy, percent(evaluated ? job.eval.accuracy : p.accuracy),
      evaluated ? "eval" : typeof p.accuracy === "number" ? "train" : "");
    const accuracyTitle = evaluated ? evalTitle(job.eval, p.accuracy) : "";
    if (cells.accuracy.title !== accuracyTitle) cells.accuracy.title = accuracyTitle;
    setText(cells.speed, rate(p.examples_per_sec));
    setText(cells.eta, eta(job));
    setText(cells.devices, devicesText(job));
    setText(cells.age, age(job.created_at));
    return entry.tr;
  }

  /** A loss or accuracy cell: its number, and under it which one it is. */
  function setMetric(cell, value, kind) {
    const [number, which] = cell.children;
    setText(number, value);
    setText(which, kind);
  }

  /** An eval's accuracy cell, on hover: of which step, on how many examples, and the
   *  last training batch's beside it. */
  function evalTitle(e, trainAccuracy) {
    const over = Number.isInteger(e.examples)
      ? ` on ${e.examples.toLocaleString("en-US")} held-out example${e.examples === 1 ? "" : "s"}`
      : "";
    const step = Number.isInteger(e.step) ? ` at step ${e.step}` : "";
    const train = typeof trainAccuracy === "number"
      ? `; the last training batch's: ${percent(trainAccuracy)}` : "";
    return `Eval accuracy${step}${over}${train}`;
  }

  function render() {
    const order = [...jobs.values()];
    // If the row the keyboard is on goes, the keyboard goes on from a row beside it (or
    // the summary, when none stays).
    arrangeInPlace(tbody, order.map(row),
      { focusIn: (tr) => tr.querySelector(".job-name"), fallback: summary });
    for (const id of rows.keys()) if (!jobs.has(id)) rows.delete(id);
    // The rows are the queue from its head as last read: each queued one's place is its
    // count among the queued rows down to it (one known to have started since counts
    // none). A search leaves jobs out, so there the places are not known.
    let place = 0;
    for (const job of order) {
      const el = rows.get(job.id).cells.state.querySelector(".queue-place");
      const shown = runOrder && !search && job.state === "queued";
      setText(el, shown ? ordinal(++place) : "");
      if (el.hidden === shown) el.hidden = !shown;
    }
    empty.hidden = order.length > 0;
    table.hidden = order.length === 0;
    emptyText.textContent = search ? `No ${filter ? `${filter} ` : ""}jobs match “${search}”.`
      : filter ? `No ${filter} jobs.` : "No jobs here yet.";
    clearSearch.hidden = !search;
    writeSummary();
    more.hidden = !nextCursor;
    for (const button of chips.children) {
      button.setAttribute("aria-pressed", String(button.dataset.state === filter));
    }
  }

  /** The line under the rows: how many of how many, and how many are picked to compare
   *  (those not in the list as filtered too: the button counts them). */
  function writeSummary() {
    const shown = jobs.size;
    const matching = search ? ` matching “${search}”` : "";
    const elsewhere = [...picked.keys()].filter((id) => !jobs.has(id)).length;
    const note = !picked.size ? ""
      : `; ${picked.size} picked to compare${elsewhere ? ` (${elsewhere} not in this list)` : ""}`;
    summary.textContent =
      `${shown} of ${count} job${count === 1 ? "" : "s"}${filter ? ` ${filter}` : ""}${matching}` +
      (runOrder && shown ? ", in the order they start" : "") + note;
  }

  /** The jobs picked, as the boxes, the button and the summary say them. */
  function showPicked() {
    for (const [id, { box }] of rows) if (box.checked !== picked.has(id)) box.checked = picked.has(id);
    const n = picked.size;
    setText(compare.button, `Compare in TensorBoard (${n})`); // "(0)": one width
    dim(compare.button, n === 0);
    clearPicked.classList.toggle("unseen", n === 0);
    if (loaded) writeSummary();
  }
  showPicked();

  // Picks restored by a reload: a job deleted while no page of this tab was open leaves
  // them quietly (its job answers 404). One not read (no answer) stays, to be refused, and
  // then said, if it is gone.
  for (const id of unchecked) {
    getJSON(`/api/v1/jobs/${encodeURIComponent(id)}`).catch((e) => {
      if (e.status === 404 && unpick(id) && !stopped) showPicked();
    });
  }
  unchecked = [];

  /** Whether the list as filtered holds `job` (its name never changes; its state may). */
  function shows(job) {
    return (!filter || job.state === filter) && (!search || nameHolds(job.name, search));
  }

  // Re-read the list soon, once for a burst of events (a queue of submissions, say), and
  // at most once a REREAD_MS however long the burst goes on.
  let soon = null;
  let lastRead = -Infinity; // Date.now() when the latest re-read began
  function refreshSoon() {
    if (soon !== null) return;
    const wait = Math.max(250, lastRead + REREAD_MS - Date.now());
    soon = setTimeout(() => { soon = null; refresh(); }, wait);
  }

  /** Whether `job` came after `other` (the list is newest first; not used under the
   *  Queued filter, whose rows are in the queue's order). */
  const newer = (job, other) => Date.parse(job.created_at) > Date.parse(other.created_at);

  /** Whether a job's `state` event may change who holds a device: the job starts, or
   *  stops, holding devices (the devices panel reads them again; a queued job's events,
   *  most of a queue's, change nothing there). A job not shown may have been running if it
   *  has run: ended after a start, or queued again (its `started_at` then null) after an
   *  attempt, whose worker may have been lost. */
  function movesDevices(known, job) {
    if (job.state === "running") {
      return known?.state !== "running" || String(known.devices) !== String(job.devices);
    }
    if (known) return known.state === "running";
    return job.state === "queued" ? job.attempts > 1 : Boolean(job.started_at);
  }

  // The stream was refused or ended for good (EventSource gives no reason): the re-read
  // that follows says whether for want of a token (then only the token is asked for: a
  // Reload could not help) or not (then the notice says live updates stopped).
  let streamEnded = false;
  const follow = () => followAllJobs({
    open: () => { // (re)connected: whatever happened meanwhile is in the list
      streamEnded = false;
      notice.clear();
      refreshSoon();
      window.dispatchEvent(new CustomEvent("towerboard:devices")); // and in the devices
    },
    error: (readyState) => {
      if (readyState !== EventSource.CLOSED) {
        notice.error(readyState);
        return;
      }
      streamEnded = true;
      refresh();
    },
    state: (job) => {
      const known = jobs.get(job.job_id);
      if (movesDevices(known, job)) window.dispatchEvent(new CustomEvent("towerboard:devices"));
      if (known) {
        jobs.set(job.job_id, job);
        streamed.set(job.job_id, mark());
        // Left the filter: a row from further down may take its place, as the list says.
        // Until it has said (a slow read, or a failed one: the next poll's, 15 s on), the
        // row shows its new state, and under the Queued filter those still queued their
        // places: one that started read "running 1st" and the rows below it a place too far.
        if (filter && job.state !== filter) refreshSoon();
        // Its priority changed (PATCH /jobs/{id}): in the queue's order it has moved, to
        // where the list says (among the jobs of its new priority, by when it joined).
        else if (runOrder && known.priority !== job.priority) refreshSoon();
        if (runOrder) render();
        else row(job);
        return;
      }
      // Not shown. One that is not in the list as filtered (its name never changes; its
      // state is not the filter's) cannot be shown either.
      if (deleted.has(job.job_id) || !shows(job)) return;
      if (!loaded) {
        early.set(job.job_id, { job, at: mark() });
        return;
      }
      // Newer than every row (just submitted): it goes on top, as the list would have it.
      // In the queue's order, where it goes (at the end, or ahead of the jobs of a lower
      // priority) the read below says.
      const first = jobs.values().next().value;
      if (!runOrder && (!first || newer(job, first))) {
        jobs = new Map([[job.job_id, job], ...jobs]);
        streamed.set(job.job_id, mark());
        arrived.set(job.job_id, streamed.get(job.job_id));
        count += 1;
        render();
        return;
      }
      // Older than the top row and not shown: without a state filter it was in the list
      // all along, below the rows shown, and nothing shown changes (a queue of hundreds
      // draining re-read the whole list at each of its events). With one, it has entered
      // the filter (or, running, been asked to cancel): where it goes the list says, and
      // so does the count, which said one too few until the next poll when it went below
      // the rows shown. A burst of them reads once a REREAD_MS. (One that leaves the
      // filter from down there is not known to have been in it: the count catches up at
      // the next poll.)
      if (filter) refreshSoon();
    },
    deleted: (event) => forget(event.job_id),
    // An ended job's worker has gone: the devices it held are free (its row is as it was).
    exited: () => window.dispatchEvent(new CustomEvent("towerboard:devices")),
    any: (name, event) => {
      if (name === "state" || name === "deleted" || name === "exited" || !jobs.has(event.job_id)) {
        return;
      }
      jobs.set(event.job_id, applyProgressEvent(jobs.get(event.job_id), event));
      streamed.set(event.job_id, mark());
      row(jobs.get(event.job_id));
    },
  });
  let closeStream = follow();

  /** A job deleted for good: its row goes, and the count with it. One not shown may still
   *  be counted (further down the list, or in the filter): a re-read says. */
  function forget(id) {
    deleted.add(id);
    if (unpick(id)) showPicked();
    streamed.delete(id);
    arrived.delete(id);
    if (!jobs.has(id)) {
      refreshSoon();
      return;
    }
    jobs.delete(id);
    count = Math.max(0, count - 1);
    render(); // the keyboard, if it was on the row that went, goes on from a row beside it
    // Every row shown went, with more to show: read them rather than say "No jobs".
    if (jobs.size === 0 && nextCursor) refreshSoon();
  }

  /** The jobs of a read that are not deleted, and how many were (to take off its count). */
  function live(data) {
    const kept = data.filter((job) => !deleted.has(job.id));
    return { kept, dropped: data.length - kept.length };
  }

  /** Read `limit` rows from `cursor` on (the top for null), MAX_LIMIT at a time, unless a
   *  newer read starts meanwhile (then null). */
  async function read(id, limit, cursor) {
    const data = [];
    let page;
    do {
      const params = new URLSearchParams({ limit: String(Math.min(MAX_LIMIT, limit - data.length)) });
      if (filter) params.set("state", filter);
      if (search) params.set("name", search);
      if (cursor) params.set("cursor", cursor);
      page = await getJSON(`/api/v1/jobs?${params}`);
      if (stopped || id !== reads) return null;
      data.push(...page.data);
      cursor = page.next_cursor;
    } while (cursor && data.length < limit);
    return { data, count: page.count, nextCursor: cursor };
  }

  /** The rows of `data`, each the list's copy or the stream's (see fresher). */
  function merge(data, asked) {
    return data.map((job) => [job.id, fresher(jobs.get(job.id), streamed.get(job.id), job, asked)]);
  }

  async function refresh() {
    clearTimeout(timer);
    clearTimeout(soon); // this read answers for the events that asked for one so far
    soon = null;
    lastRead = Date.now();
    const id = ++reads;
    let retry = false; // failed, and may pass if asked again soon (RETRY_MS, not POLL_MS)
    try {
      const asked = mark();
      const page = await read(id, wanted, null);
      if (page === null) return;
      // A read that was out when a job was deleted may still list it.
      const { kept, dropped } = live(page.data);
      const next = new Map(merge(kept, asked));
      // What the stream said before the first read answered: its copy where it is newer,
      // and one the read lacks goes on top (below), as one the stream adds meanwhile does.
      const waiting = new Map(); // id -> job, of those the read lacks
      let again = false; // one the read lacks, in the queue's order: where it goes, a read says
      for (const [job, { job: said, at }] of early) {
        if (deleted.has(job)) continue;
        if (next.has(job)) next.set(job, fresher(said, at, next.get(job), asked));
        else if (shows(said) && runOrder) {
          again = true;
          continue;
        } else if (shows(said)) {
          waiting.set(job, said);
          arrived.set(job, at);
        } else continue;
        streamed.set(job, at);
      }
      early.clear();
      loaded = true;
      // Rows the stream added while the list was read are not in it yet: those that came
      // after its top row (it lists every job older than that down to its end).
      const top = next.values().next().value;
      const copy = (job) => jobs.get(job) || waiting.get(job);
      const added = [...arrived].filter(([job, at]) => at > asked && !next.has(job) &&
        copy(job) && shows(copy(job)) && (!top || newer(copy(job), top)))
        .sort(([a], [b]) => Date.parse(copy(b).created_at) - Date.parse(copy(a).created_at));
      const shown = [...jobs.keys()];
      jobs = new Map([...added.map(([job]) => [job, copy(job)]), ...next]);
      for (const job of streamed.keys()) if (!jobs.has(job)) streamed.delete(job);
      for (const [job, at] of arrived) if (at <= asked) arrived.delete(job);
      count = Math.max(0, page.count - dropped) + added.length;
      nextCursor = page.nextCursor;
      error.hidden = true;
      if (streamEnded) notice.error(EventSource.CLOSED);
      const onMore = document.activeElement === more;
      render();
      // A Show more overlapped by this read (a poll, the stream reconnecting) is dropped,
      // and this read brings its rows: the keyboard goes on from the first of them, as
      // after Show more's own read, not from the page's top (<body>), where it fell once
      // the button hid.
      if (onMore && more.hidden) offMore(shown);
      if (again) refreshSoon();
      if (scrollBack !== null) {
        window.scrollTo(0, scrollBack);
        scrollBack = null;
      }
    } catch (e) {
      if (stopped || id !== reads) return;
      // Refused for want of a token (a first visit to a service that needs one, or one
      // changed under the page): the token bar asks for it, and this says so once, with
      // none of the refusal's wording. Once it is given, the view is mounted anew.
      // No answer (a lossy network, the service restarting) or a server error: read again
      // in RETRY_MS, as a job's page does, not at the next poll (15 s of the error over a
      // list that may be empty, when the stream's reconnecting read failed too).
      const unauthorized = e.status === 401;
      retry = mayPass(e);
      error.textContent = unauthorized ? "Enter the service's token above to see its jobs."
        : `Could not load jobs: ${e.message}${retry ? " Trying again…" : ""}`;
      error.hidden = false;
      if (unauthorized) notice.clear();
      else if (streamEnded) notice.error(EventSource.CLOSED);
      if (summary.textContent === "Loading…") summary.textContent = ""; // it is not loading
    } finally {
      clearTimeout(timer); // one poll pending, however many reads overlapped
      if (!stopped) timer = setTimeout(refresh, retry ? RETRY_MS : POLL_MS);
    }
  }

  /** The keyboard, on Show more as it hides, goes on from the first row below those that
   *  were `shown` (ids, in order) before: the first the read brought. */
  function offMore(shown) {
    const before = new Set(shown);
    const ids = [...jobs.keys()];
    let last = -1; // the last row that was shown before
    ids.forEach((id, i) => { if (before.has(id)) last = i; });
    const first = ids.slice(last + 1).find((id) => !before.has(id));
    const entry = first ? rows.get(first) : null;
    (entry ? entry.tr.querySelector(".job-name") : summary).focus({ preventScroll: true });
  }

  async function showMore() {
    if (!nextCursor || dimmed(more)) return;
    wanted = jobs.size + PAGE; // a re-read meanwhile reads these rows too
    const id = ++reads;
    dim(more, true);
    try {
      const asked = mark();
      const page = await read(id, PAGE, nextCursor);
      if (page === null) return;
      const { kept, dropped } = live(page.data);
      jobs = new Map([...jobs, ...merge(kept, asked)]);
      count = Math.max(0, page.count - dropped);
      nextCursor = page.nextCursor;
      error.hidden = true;
      const focused = document.activeElement === more;
      render();
      // The last page read, the button hides: the keyboard goes on from the first row it
      // brought (or the summary, if it brought none).
      if (focused && more.hidden) {
        const first = kept.length ? rows.get(kept[0].id) : null;
        (first ? first.tr.querySelector(".job-name") : summary).focus({ preventScroll: true });
      }
      keepPlace();
    } catch (e) {
      if (stopped || id !== reads) return;
      error.textContent = `Could not load more jobs: ${e.message}`;
      error.hidden = false;
    } finally {
      dim(more, false);
    }
  }

  // Ages and ETAs count on between updates.
  ticker = setInterval(() => {
    for (const job of jobs.values()) {
      const entry = rows.get(job.id);
      if (!entry) continue;
      setText(entry.cells.age, age(job.created_at));
      setText(entry.cells.eta, eta(job));
    }
  }, 1000);

  // The host's kind, first known (or changed): a queued job's wait is said in its units.
  const hostKnown = () => {
    for (const [id, job] of jobs) {
      const entry = rows.get(id);
      if (entry) setText(entry.cells.devices, devicesText(job));
    }
  };
  window.addEventListener("towerboard:host", hostKnown);

  refresh();
  return () => {
    stopped = true;
    window.removeEventListener("scroll", keepPlaceSoon);
    window.removeEventListener("towerboard:host", hostKnown);
    clearTimeout(placeTimer);
    clearTimeout(timer);
    clearTimeout(soon);
    clearTimeout(typing);
    clearInterval(ticker);
    closeStream();
    compare.destroy();
  };
}
