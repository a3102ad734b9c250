// A queued job's place in the queue, under its page's progress bar, as `towerboard status
// ID` says it: "2nd of 5 in the queue (1 job ahead)", or for the first what it waits for.
//
// Read from GET /api/v1/queue (its largest page) when the page shows the job queued, and
// again at each change that can move it: any job's `state` on the all-jobs stream (a job
// ahead started, ended or was cancelled; one of higher priority submitted or resumed), and
// an ended job's worker gone (`exited`: its devices are free). The stream is followed only
// while the job is queued, and the first read is made as it opens (the service subscribes
// it as it answers): a change made before then is in that read, and one made after it
// comes as an event. A burst of events reads the queue once a READ_GAP_MS at most.
// The line is no live region: it changes with other people's jobs, and a screen reader
// would say it at each.

import { followAllJobs, getJSON } from "./api.js";
import { h, setText } from "./format.js";

export const QUEUE_MOST = 1000; // the API's largest page of the queue
const READ_GAP_MS = 1000;
// Read this often instead while the all-jobs stream has been given up for good (refused,
// or a proxy's error), when no event will say that the queue moved.
const POLL_MS = 5000;

/** 1st, 2nd, 3rd, 4th, 11th, 12th, 21st, ... */
export function ordinal(n) {
  const suffix = [11, 12, 13].includes(n % 100) ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th";
  return `${n}${suffix}`;
}

/** Where `jobId` stands in `answer` (GET /api/v1/queue): its place, or that it is past the
 *  page read; null when it is not queued (started or cancelled since). */
export function placeText(answer, jobId) {
  const { data, count } = answer;
  const row = data.find((job) => job.id === jobId);
  if (row) {
    if (row.position === 1) return `Next to start: it waits for ${answer.waiting_for}`;
    const ahead = row.position - 1;
    return `${ordinal(row.position)} of ${count} in the queue ` +
      `(${ahead} job${ahead === 1 ? "" : "s"} ahead)`;
  }
  return data.length < count ? `after the first ${data.length} of ${count} in the queue` : null;
}

/** The line for `jobId`'s page (`el`, hidden but while the job is queued): `render(job)`
 *  at each change of the job starts or stops following the queue; `destroy()` stops. */
export function queuePlaceControl(jobId) {
  const el = h("p", { class: "bar-text queue-place", id: "queue-place", hidden: true });
  let queued = false;
  let closeStream = null;
  let lost = false; // the stream was given up for good: the queue is polled instead
  let asks = 0; // the latest read: an older answer (or one from before a start) is dropped
  let readAt = -Infinity; // Date.now() when the latest read began
  let timer = null;
  let gone = false; // the page has gone: nothing starts again

  function hide() {
    if (!el.hidden) el.hidden = true;
  }

  async function read() {
    clearTimeout(timer);
    timer = null;
    const ask = ++asks;
    readAt = Date.now();
    let answer = null;
    try {
      answer = await getJSON(`/api/v1/queue?limit=${QUEUE_MOST}`);
    } catch {
      // Not known this time: a place shown may be wrong by now, so none is shown (a 401
      // has asked for the token, as every read does). The next change reads it again.
    }
    if (ask !== asks || !queued) return;
    // Not in the queue and not past the page read: it has left the queue since (its own
    // stream is about to say how).
    const text = answer && placeText(answer, jobId);
    if (text) {
      setText(el, text);
      if (el.hidden) el.hidden = false;
    } else hide();
    if (lost) timer = setTimeout(read, POLL_MS);
  }

  /** Read now if none was read within READ_GAP_MS, else once that long after the latest
   *  read, however many events ask meanwhile. */
  function readSoon() {
    if (timer !== null || !queued) return;
    timer = setTimeout(read, Math.max(0, readAt + READ_GAP_MS - Date.now()));
  }

  function start() {
    queued = true;
    lost = false;
    closeStream = followAllJobs({
      open: () => { // (re)connected: whatever moved meanwhile is in the queue now
        lost = false;
        readSoon();
      },
      error: (readyState) => {
        if (readyState !== EventSource.CLOSED) return; // reconnecting: `open` reads again
        lost = true;
        readSoon();
      },
      state: readSoon,
      exited: readSoon,
    });
  }

  function stop() {
    queued = false;
    asks += 1; // an answer still out is for a job that has left the queue
    clearTimeout(timer);
    timer = null;
    if (closeStream) closeStream();
    closeStream = null;
    hide();
  }

  return {
    el,
    render(job) {
      if (!gone && (job.state === "queued") !== queued) (queued ? stop : start)();
    },
    destroy() {
      gone = true;
      stop();
    },
  };
}
