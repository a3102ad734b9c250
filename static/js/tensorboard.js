// A job page's "Open in TensorBoard", and the jobs list's "Compare in TensorBoard (N)":
// asks the service's one, shared TensorBoard to show the jobs (adding them to what it
// shows, never taking other users' jobs away), opens it filtered to those jobs' runs, then
// follows its status: starting, running, why it failed, and whether another start
// replaced it with one that no longer shows them.

import { api, getJSON, mayPass } from "./api.js";
import { h } from "./format.js";

const STARTING_POLL_MS = 1000; // until it answers (it imports TensorFlow: seconds)
const RUNNING_POLL_MS = 5000; // then: has it stopped, or been replaced?
const SHOWN_IDS = 5; // a notice names this many of the jobs it shows now

/** The jobs of `ids` that TensorBoard's status `tb` does not show. */
function missing(tb, ids) {
  return tb.job_ids === null ? [] : ids.filter((id) => !tb.job_ids.includes(id));
}

function jobList(ids) {
  const named = ids.slice(0, SHOWN_IDS).join(", ");
  const more = ids.length > SHOWN_IDS ? ` and ${ids.length - SHOWN_IDS} more` : "";
  return `${ids.length === 1 ? "job" : "jobs"} ${named}${more}`;
}

/** TensorBoard's address, its run filter set to the runs of `ids` alone. TensorBoard
 *  names a job's runs `<name> · <id>/train` (service/tensorboard.py), and its run filter
 *  is a regular expression: the id then `/` or the end matches that job's runs alone, not
 *  those of another job whose name holds the id ("finetune of <id>"). Ids are lower-case
 *  letters and digits: nothing in them to escape. */
export function tensorBoardUrl(ids) {
  const either = ids.length === 1 ? ids[0] : `(${ids.join("|")})`;
  return `/tensorboard/?runFilter=${encodeURIComponent(`${either}(/|$)`)}#timeseries`;
}

/** The button, its status line and its notice, for `jobId`'s page; `destroy()` stops
 *  following the status, and closes a tab still waiting for the service's answer. */
export function tensorBoardControl(jobId) {
  return tensorBoardOpener({
    jobIds: () => [jobId],
    button: { id: "open-tensorboard" },
    label: "Open in TensorBoard",
    statusId: "tensorboard-status",
    noticeId: "tensorboard-notice",
    again: "Show this job again",
    lost: () => "this job",
  });
}

/** The jobs of `ids` that a refusal of a start (`error`) says are unknown to the service
 *  (each of its field errors `job_ids.N: Unknown job…`: deleted since they were picked);
 *  null for a refusal of anything else, or of none of them. */
export function unknownJobs(error, ids) {
  const errors = error.status === 422 && Array.isArray(error.errors) ? error.errors : [];
  const unknown = errors.map(({ field, message }) => {
    const index = /^job_ids\.(\d+)$/.exec(field || "");
    return index && /^Unknown job\b/.test(message || "") ? ids[Number(index[1])] : undefined;
  });
  return unknown.length && unknown.every((id) => id !== undefined) ? [...new Set(unknown)] : null;
}

/** "Job mnist (3fkkyci9jr) was deleted" or "Jobs a (…), b (…) were deleted", of `jobs`
 *  (id -> name, undefined where it is not known). */
function deletedText(jobs) {
  const ids = [...jobs.keys()];
  const each = ids.map((id) => (jobs.get(id) ? `${jobs.get(id)} (${id})` : id));
  const shown = each.slice(0, SHOWN_IDS).join(", ");
  const more = each.length > SHOWN_IDS ? ` and ${each.length - SHOWN_IDS} more` : "";
  return ids.length === 1 ? `Job ${shown} was deleted` : `Jobs ${shown}${more} were deleted`;
}

/** A button that opens TensorBoard over the jobs `jobIds()` names as it is pressed, the
 *  line that follows it (with the ids `statusId`, `noticeId`), and the notice shown when
 *  another start leaves some out (`lost(ids)` names them; the notice's `again` button
 *  opens those jobs again). A start refused because some of the jobs are gone (deleted
 *  while nothing on the page saw it) says which, by name where `named(id)` knows it, tells
 *  `deleted(ids)`, and opens TensorBoard over the rest, if any. */
export function tensorBoardOpener({
  jobIds, button: attrs, label, statusId, noticeId, again: againText,
  lost = jobList, named = () => undefined, deleted = () => {},
}) {
  let ids = []; // the jobs of the last press: what the line follows
  const leftOut = new Map(); // the last press's jobs found deleted, id -> name: said first
  const button = h("button", { type: "button", ...attrs, onclick: () => press(jobIds()) }, label);
  const status = h("p", { class: "action-status small", id: statusId, role: "status" });
  const noticeText = h("span", {});
  const again = h("button", { type: "button", class: "link", onclick: () => press(ids) }, againText);
  const notice = h("div", { class: "tb-notice", id: noticeId, role: "alert", hidden: true },
    noticeText, " ", again);
  let pid = null; // the TensorBoard asked to show the jobs
  let wasRunning = false;
  let timer = null;
  let gone = false;
  const waiting = new Set(); // tabs opened for an answer not yet come, still blank

  /** Close the tabs still waiting for an answer: the page that would point them at
   *  TensorBoard has gone (left, or the dashboard reloaded or closed), and they stayed
   *  blank for good. */
  function closeWaiting() {
    for (const tab of waiting) tab.close();
    waiting.clear();
  }
  window.addEventListener("pagehide", closeWaiting);

  let said = null; // what the line says now (its state and text), to leave it alone

  /** Write the line, unless it says that already: it is a live region (role=status), and
   *  rewritten at each 5 s poll with the same words, a screen reader read them out again
   *  every 5 s for as long as TensorBoard ran. The jobs of the press found deleted are
   *  said first. */
  function say(state, ...words) {
    const parts = leftOut.size ? [`${deletedText(leftOut)}.`, " ", ...words] : words;
    const key = JSON.stringify([state, ...parts.map((part) =>
      (part instanceof Node ? part.outerHTML : String(part)))]);
    if (key === said) return;
    said = key;
    status.dataset.state = state;
    status.classList.toggle("error", state === "failed");
    status.replaceChildren(...parts);
  }

  function link() {
    return h("a", { href: tensorBoardUrl(ids), target: "_blank", rel: "noopener" }, "open it");
  }

  /** Show what the service says of its TensorBoard; follow it while it may change. */
  function show(tb) {
    clearTimeout(timer);
    if (gone) return;
    if (tb.state === "stopped") {
      pid = null;
      if (tb.last_error) {
        say("failed", `${wasRunning ? "TensorBoard stopped" : "TensorBoard failed to start"}: ` +
          tb.last_error);
      } else {
        say("stopped", "TensorBoard has stopped (unused for a while, or stopped on request).");
      }
      return;
    }
    if (tb.pid !== pid) {
      // Another start restarted it. Still showing these jobs: carry on with the new one.
      const left = missing(tb, ids);
      if (left.length) {
        pid = null;
        say("replaced", "");
        noticeText.textContent = `TensorBoard was restarted by another start over ` +
          `${jobList(tb.job_ids)}, and no longer shows ${lost(left)}.`;
        notice.hidden = false;
        return;
      }
      pid = tb.pid;
    }
    wasRunning = wasRunning || tb.state === "running";
    say(tb.state, `TensorBoard is ${tb.state}: `, link(), ".");
    timer = setTimeout(watch, tb.state === "starting" ? STARTING_POLL_MS : RUNNING_POLL_MS);
  }

  async function watch() {
    try {
      const tb = await getJSON("/api/v1/tensorboard");
      show(tb);
    } catch {
      // No answer this time (a restart, say): ask again; the line keeps what it said.
      if (!gone) timer = setTimeout(watch, RUNNING_POLL_MS);
    }
  }

  let asks = 0; // starts asked from this page: a check of an older one's outcome is dropped

  /** A start that got no answer (or a 5xx) may have reached the service all the same:
   *  if its TensorBoard shows these jobs, the line says so, with the link, and follows it.
   *  It said "Could not start TensorBoard" beside a TensorBoard running for the job. */
  async function checkStarted(ask) {
    let tb;
    try {
      tb = await getJSON("/api/v1/tensorboard");
    } catch {
      return; // the line keeps the failure
    }
    if (gone || ask !== asks || tb.state === "stopped" || missing(tb, ids).length) return;
    pid = tb.pid;
    wasRunning = false;
    show(tb);
  }

  function press(jobs) {
    leftOut.clear();
    open(jobs);
  }

  /** Start TensorBoard over `jobs` and point a tab at it: `reuse`, one opened for a start
   *  refused a moment ago, or a new one. */
  async function open(jobs, reuse) {
    if (!jobs.length) return;
    const ask = ++asks;
    ids = [...jobs];
    const url = tensorBoardUrl(ids);
    // Opened now, inside the click, so a popup blocker lets it through; pointed at
    // TensorBoard once it shows these jobs. The proxy holds the first request until
    // TensorBoard has loaded.
    const tab = reuse === undefined ? window.open("", "_blank") : reuse;
    if (tab) waiting.add(tab);
    clearTimeout(timer);
    notice.hidden = true;
    say("asking", "Starting TensorBoard…");
    try {
      // merge: it is shared; the jobs it shows for others stay, these are added.
      const { data } = await api("/api/v1/tensorboard", {
        method: "POST", body: { job_ids: ids, merge: true } });
      waiting.delete(tab);
      if (gone) return; // its tab was closed
      pid = data.pid;
      wasRunning = false;
      if (tab) {
        tab.opener = null;
        tab.location.href = url;
      }
      show(data);
    } catch (error) {
      waiting.delete(tab);
      const unknown = gone || ask !== asks ? null : unknownJobs(error, ids);
      if (unknown) {
        // Deleted since they were picked, unseen: said in plain words (not the service's
        // `job_ids.0: Unknown job`), taken out, and the rest shown in the same tab.
        for (const id of unknown) leftOut.set(id, named(id));
        deleted(unknown);
        const rest = ids.filter((id) => !unknown.includes(id));
        if (rest.length) {
          open(rest, tab);
          return;
        }
        ids = rest;
      }
      if (tab) tab.close();
      if (gone || ask !== asks) return;
      if (unknown) say("failed", "Nothing left to open in TensorBoard.");
      else say("failed", `Could not start TensorBoard: ${error.message}`);
      if (mayPass(error)) checkStarted(ask);
    }
  }

  return {
    button,
    status,
    notice,
    destroy() {
      gone = true;
      clearTimeout(timer);
      closeWaiting();
      window.removeEventListener("pagehide", closeWaiting);
    },
  };
}
