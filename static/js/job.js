// One job: live progress and charts, its place in the queue while it is queued (queue.js)
// and its priority while it is queued or running (priority.js),
// per-tower step time, spec, log tail, checkpoints, Cancel, Resume, Finish at step N and
// Train longer (resume.js) and Delete job (once it has ended) and "Open in TensorBoard" (tensorboard.js).
//
// A job's own event stream ends with the job, so an ended job's page follows the all-jobs
// stream for this job's `deleted` (someone else deleted it), `state` (someone resumed it)
// and `exited` (its worker, still exiting at the end, has gone: Resume, Finish, Train longer
// and Delete job wait for it). A job resumed, here or elsewhere, is followed live again: its
// stream, log and charts.

import { RETRY_MS, TERMINAL, api, followAllJobs, followJob, getJSON, mayPass } from "./api.js";
import { LineChart, thinPoints } from "./charts.js";
import { applyProgressEvent, fresher, jobsListHash, mark, noticeOnJobs, unselect } from "./jobs.js";
import { priorityControl } from "./priority.js";
import { profileControl } from "./profile.js";
import { queuePlaceControl } from "./queue.js";
import { resumeControl } from "./resume.js";
import { tensorBoardControl } from "./tensorboard.js";
import {
  age, bytes, dataText, devicesText, dim, dimmed, duration, endReason, eta, h, liveNotice, localTime,
  noStepText, num, percent, phaseText, progressBar, rate, sentence, setProgress, setText, stateBadge,
  stepText, stoppedText, withCode,
} from "./format.js";
import { arrangeInPlace } from "./inplace.js";

// How the trainer says a run diverged (trainer/divergence.py): a loss, gradient norm or
// weight that became NaN or infinite, at a step.
const DIVERGED = /^(Loss|Gradients|Weights) became non-finite /;
const LOG_LINES = 200;
// Points a series is read with (GET /metrics?points=): a chart draws about 1,200 at most
// (charts.js), and a job of 200k steps has some 100k a series, 32 MB to read whole.
const CHART_POINTS = 2000;
// The most points the page holds a series. A page left open on a job of a week took in
// some 300k a series from its stream, and each report aligned and thinned every one of
// them again (65-160 ms a report at 270k here, and 32 MiB of them held; bench/
// job_page_bench.py). Past this, a series is thinned
// where it is held by the charts' own rule (charts.js thinPoints: in each of CHART_POINTS
// equal step spans its lowest and highest point; its first and last), to about
// 2 × CHART_POINTS, and again some 4,000 reports later. A chart thins that to its 1,200 or
// so as it thinned every point, and a noisy loss of 300k steps was drawn within a pixel of
// the same; with half as many spans, their edges cut a chart's spans often enough to move
// one pixel column in ten by a few pixels.
const HELD_POINTS = 4 * CHART_POINTS;
const LOG_POLL_MS = 3000;
const CONFIRM_MS = 4000; // Cancel and Delete job wait this long for the second press
// An ended job's worker may still be exiting (TensorFlow's teardown: a second or so, more
// on a busy host), and until it has gone the service refuses a resume or a delete (409,
// after waiting 5 s). The devices list marks the devices it still holds `exiting`, and the
// all-jobs stream says `exited` once it has gone. The list is read again this often only
// while that cannot come: a read of it failed, or the stream was given up for good.
const EXITING_RECHECK_MS = 3000;
// The series the charts draw (the learning rate is a stat, not a chart).
const SERIES = ["loss", "accuracy", "examples_per_sec", "eval_loss", "eval_accuracy"];

/** "step 5", "steps 20, 21, 22". */
function stepsText(steps) {
  return `step${steps.length === 1 ? "" : "s"} ${steps.join(", ")}`;
}

/** "812.4 MiB": a peak of device memory, to the tenth the worker reports. */
function mib(value) {
  return `${value.toFixed(1)} MiB`;
}

function stat(label, key, wide = false) {
  return h("div", { class: wide ? "stat stat-wide" : "stat" }, h("span", { class: "stat-label" }, label),
    h("span", { class: "stat-value", dataset: { stat: key } }, "—"));
}

/** Keep box `pre` (a log) at its newest lines: until the reader scrolls up from its end,
 *  and again once they scroll back down to it; a resize that wraps its lines again (a phone
 *  turned) keeps it at the end. Judged at each read from where the box stood, such a
 *  resize left it mid-log, and it stopped following for good. The window's resize is
 *  heard too, as it comes before the scroll its layout made: Chromium's full-page
 *  screenshot lays the page out at 1×1 for a moment, and the scroll that clamped the box
 *  there, heard once the page was back, read as the reader's and left it a line short of
 *  its end. keep(): to its end now, if it follows (its text changed); stop(): no more. */
function followEnd(pre) {
  let follow = true;
  const toEnd = () => {
    if (follow) pre.scrollTop = pre.scrollHeight;
  };
  pre.addEventListener("scroll", () => {
    follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
  });
  const resized = new ResizeObserver(toEnd);
  resized.observe(pre);
  window.addEventListener("resize", toEnd);
  return {
    keep: toEnd,
    stop: () => {
      resized.disconnect();
      window.removeEventListener("resize", toEnd);
    },
  };
}

export function mountJob(view, jobId) {
  const base = `/api/v1/jobs/${encodeURIComponent(jobId)}`;
  let job = null;
  let streamedAt; // mark() of the stream's last change to `job`
  let stopped = false;
  let closeStream = null;
  let closeWatch = null; // the all-jobs stream, followed for this job's `deleted` and `state`
  let deleting = false; // this page's DELETE is out: its own `deleted` event is no news
  let deletedMeanwhile = false; // ... but said while it was out: it was deleted, answer or not
  let gone = false; // deleted elsewhere while this page was open
  let logTimer = null;
  let checkpointTimer = null;
  let loadTimer = null;
  let metricsTimer = null; // reads the series again after a failed read
  let exitingTimer = null;
  let exiting = false; // the job has ended and its worker is still exiting
  let exitingAsk = 0; // the latest checkExiting(), or `exited`: an older answer is not acted on
  let watchLost = false; // the all-jobs stream was given up for good: no `exited` will come
  let ticker = null;
  let drawQueued = false;
  const series = Object.fromEntries(SERIES.map((key) => [key, []]));
  // The metrics reads out, each with the stream's events since it was asked (loadMetrics).
  const metricReads = new Set();
  let metricsAsked = 0;
  let metricsShown = 0; // the latest read whose answer the charts show

  const title = h("h1", { class: "job-title" }, jobId);
  let badge = h("span", { class: "state" });
  const bar = progressBar({ state: "queued", progress: null });
  bar.classList.add("bar-large");
  const barText = h("p", { class: "bar-text", id: "job-progress-text" });
  const queuePlace = queuePlaceControl(jobId);
  // Its priority, changed here while it is queued or running, beside its place.
  const priority = priorityControl(jobId, {
    changed: (data, asked) => take(fresher(job, streamedAt, data, asked)),
    missing: () => showDeleted(),
  });
  const tensorBoard = tensorBoardControl(jobId);
  const profile = profileControl(jobId);
  let traceStep = null; // the step a trace seen on the stream ended at
  const cancelButton = h("button", { type: "button", class: "danger", id: "cancel-job", onclick: cancel },
    "Cancel");
  // Shown once the job has ended (only an ended job can be deleted), where Cancel was.
  const deleteButton = h("button", { type: "button", class: "danger", id: "delete-job",
    hidden: true, onclick: remove }, "Delete job");
  // The exported SavedModel, there once the job has succeeded (the service streams it).
  const modelLink = h("a", { class: "button", id: "download-model", hidden: true,
    href: `${base}/export`, download: `${jobId}-export.tar.gz`,
    title: "The trained model as a SavedModel (.tar.gz)" }, "Download model");
  // Focusable: a resume hides the control the keyboard was on, and it goes on from here.
  const actionStatus = h("p", { class: "action-status small", id: "action-status", role: "status",
    tabindex: "-1" });
  const resume = resumeControl(jobId, {
    say: (action, text, isError) => {
      actionStatus.dataset.action = action;
      delete actionStatus.dataset.attempt;
      actionStatus.classList.toggle("error", isError);
      actionStatus.textContent = text;
    },
    resumed: (data, asked, focused) => {
      deletePresses.disarm();
      actionStatus.dataset.attempt = String(data.attempts); // renderResumed() says its end
      take(fresher(job, streamedAt, data, asked));
      // The control the keyboard was on is hidden now (maybe already, by the stream): it
      // goes on from the line that says what happened.
      const lost = document.activeElement === document.body || resume.hasFocus();
      if (focused && lost) actionStatus.focus({ preventScroll: true });
    },
    missing: () => showDeleted(),
    refused: (error, attempt) => {
      if (error.status === 409) checkExiting();
      // No answer, or a server error: it may have reached the service all the same.
      if (!mayPass(error)) return;
      actionStatus.dataset.action = "resume-failed";
      actionStatus.dataset.attempt = String(attempt);
      if (job) renderResumeTook(); // the stream may have said so already
    },
  });
  // Said while the job's worker is still exiting, and named by the controls that wait for
  // it (Resume, Finish, Train longer, Delete job: dimmed, not hidden, so the page does not
  // jump).
  const exitingHint = h("p", { class: "muted small exiting-hint", id: "exiting-hint",
    hidden: true }, "The job has ended but its worker is still exiting… Resume, Finish, Train " +
    "longer and Delete job wait until it has gone.");
  // The job's id, then what ticks (its age): the id is a node of its own, which the 1 s
  // tick leaves alone, so it can be selected to copy (`towerboard status ID`).
  const metaId = h("span");
  const metaRest = h("span");
  const meta = h("p", { class: "meta muted small" }, metaId, metaRest);
  const errorBox = h("div", { class: "job-error", role: "alert", hidden: true });
  // Where a cancelled job stopped (its result says; or its error, where its worker was
  // killed after the grace), and what Resume would do. In the failure box's place, but no
  // alert and no red: nothing failed.
  const outcomeBox = h("div", { class: "job-outcome", id: "job-outcome", hidden: true });
  let latestCheckpoint; // its step, null when none was saved, undefined until read
  const stats = h("div", { class: "stats" },
    // The last training batch's, marked train as the jobs table marks them: a bare
    // "Accuracy" beside "Eval accuracy" read as the model's.
    stat("Train loss", "loss"), stat("Train accuracy", "accuracy"),
    stat("Eval loss", "eval_loss"), stat("Eval accuracy", "eval_accuracy"),
    stat("Examples/s", "examples_per_sec"), stat("ETA", "eta"),
    stat("Learning rate", "learning_rate"), stat("Devices", "devices"), stat("Data", "data", true));
  const chartGrid = h("div", { class: "charts" });
  // How to zoom a chart's steps, by mouse and by keys: the plots are described by it.
  const chartKeys = h("p", { class: "chart-hint muted small", id: "chart-keys" },
    "Drag across a chart to zoom in on its steps; double-click it or press Reset zoom to see " +
    "them all. With a chart focused (Tab): + and − zoom, ← and → move, 0 shows every step.");
  // The charted series as a CSV file (GET /metrics.csv: every point, as `towerboard metrics
  // ID --name ...` prints them), saved under the name the service gives it. A plain link,
  // as the checkpoints' downloads are: the browser sends the token cookie along (api.js).
  const csvLink = h("a", { class: "small", id: "download-metrics", download: true,
    href: `${base}/metrics.csv?${SERIES.map((key) => `name=${key}`).join("&")}`,
    "aria-label": "Download CSV of the charted metrics" }, "Download CSV");
  const towers = h("div", { class: "towers", id: "towers" });
  // Each tower's GPU's peak memory: what the column beside each tower's time is, or each
  // tower's where there are no times; hidden where the worker said none (towers on CPUs).
  const towerMemory = h("p", { class: "muted small", id: "tower-memory", hidden: true });
  // "and memory" only where there is some: towers on CPUs report none.
  const towersHeading = h("h2", {}, "Per-tower step time");
  const checkpoints = h("div", { id: "checkpoints" });
  const logs = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "Worker log" }, "");
  const logFollow = followEnd(logs);
  // A failed read is said here, and the lines already read stay below it.
  const logError = h("p", { class: "error small log-error", id: "log-error", role: "status",
    hidden: true });
  const spec = h("pre", { class: "spec", id: "spec", tabindex: "0", "aria-label": "Job spec" }, "");
  // "No job …", why it could not be read, or "This job was deleted." (it then takes the
  // focus if the control that had it is hidden).
  const notFound = h("p", { class: "error", id: "job-load-error", role: "alert", tabindex: "-1",
    hidden: true });
  const notice = liveNotice(() => {
    closeStream();
    follow();
    reread();
  });

  view.append(
    // Back to the list as it was last shown, its state filter and name search kept.
    h("p", { class: "crumbs" }, h("a", { href: jobsListHash() }, "← Jobs")),
    notFound,
    h("div", { class: "job-head" },
      h("div", { class: "job-heading" }, title, badge),
      h("div", { class: "actions" }, modelLink, tensorBoard.button, cancelButton, ...resume.buttons,
        deleteButton)),
    exitingHint, resume.form, actionStatus, tensorBoard.status, tensorBoard.notice, notice.el, meta, bar,
    barText, h("div", { class: "queue-row" }, queuePlace.el, priority.form), priority.status,
    errorBox, outcomeBox, stats,
    h("section", { class: "section" },
      h("div", { class: "section-head" }, h("h2", {}, "Metrics"), csvLink), chartKeys, chartGrid),
    h("section", { class: "section" },
      h("div", { class: "section-head" }, towersHeading, profile.button),
      profile.status, towers, towerMemory),
    h("section", { class: "section" }, h("h2", {}, "Checkpoints"), checkpoints),
    h("section", { class: "section" },
      h("div", { class: "section-head" }, h("h2", {}, "Log"),
        h("span", { class: "muted small" }, `last ${LOG_LINES} lines of worker.log`)),
      logError, logs),
    h("section", { class: "section" },
      h("div", { class: "section-head" }, h("h2", {}, "Spec"),
        h("a", { href: `#/submit?from=${encodeURIComponent(jobId)}`, class: "small" }, "Edit & resubmit")),
      spec),
  );

  const charts = [
    new LineChart(chartGrid, { title: "Loss", logScale: true, describedBy: "chart-keys", series: [
      { key: "loss", label: "train", stroke: "--chart-train" },
      { key: "eval_loss", label: "eval", stroke: "--chart-eval", dash: [6, 4] }] }),
    new LineChart(chartGrid, { title: "Accuracy", yRange: [0, 1], describedBy: "chart-keys", series: [
      { key: "accuracy", label: "train", stroke: "--chart-train" },
      { key: "eval_accuracy", label: "eval", stroke: "--chart-eval", dash: [6, 4] }] }),
    new LineChart(chartGrid, { title: "Examples/s", yDigits: 5, describedBy: "chart-keys", series: [
      { key: "examples_per_sec", label: "examples/s", stroke: "--chart-rate" }] }),
  ];

  function drawCharts() {
    if (drawQueued) return;
    drawQueued = true;
    requestAnimationFrame(() => {
      drawQueued = false;
      if (!stopped) for (const chart of charts) chart.update(series);
    });
  }

  function renderTowers() {
    const p = (job && job.progress) || {};
    const mb = Array.isArray(p.memory_mb) && p.memory_mb.length ? p.memory_mb : null;
    const rows = renderTimes(p, mb);
    towerMemory.hidden = mb === null;
    setText(towersHeading, mb === null ? "Per-tower step time" : "Per-tower step time and memory");
    if (mb === null) return;
    // Since the worker started: a resume's worker starts its own peak.
    setText(towerMemory, rows
      ? "Beside each tower's time, the most memory TensorFlow's allocator has held on its " +
        "GPU since the job's worker started."
      : "Peak GPU memory, the most TensorFlow's allocator has held on each tower's GPU since " +
        `the job's worker started: ${mb.map((value, i) => `tower ${i} ${mib(value)}`).join(", ")}.`);
  }

  /** Each tower's time from the latest device trace, with its peak memory `mb` beside it
   *  where given, or why there are none; whether the towers' rows were drawn. */
  function renderTimes(p, mb) {
    const ms = Array.isArray(p.tower_ms) ? p.tower_ms : null;
    // The trace may be one asked for (here or elsewhere), not the spec's trace_steps: the
    // stream's trace event, or the service's record of it for a page opened since, says.
    const tracedAt = traceStep !== null ? traceStep
      : Number.isInteger(p.trace_step) ? p.trace_step : null;
    if ((!ms || ms.length === 0) && typeof p.tower_ms_error === "string") {
      // Written, but its times could not be read (no CUPTI on a GPU host, say).
      const which = tracedAt !== null ? ` that ended at step ${tracedAt}` : "";
      towers.replaceChildren(h("p", { class: "muted" }, `The device trace${which} gave no ` +
        `per-tower times: ${sentence(p.tower_ms_error)} The trace is in TensorBoard's profile tab.`));
      return false;
    }
    if (!ms || ms.length === 0) {
      const traced = job && job.spec && job.spec.summaries && job.spec.summaries.trace_steps;
      const which = traced && traced.length ? stepsText(traced) : "";
      towers.replaceChildren(h("p", { class: "muted" }, !which
        ? "No device trace in this job's spec (summaries.trace_steps), so no per-tower times."
        : job && TERMINAL.has(job.state)
          ? `The job ended before the device trace of ${which} was taken.`
          : `Measured from the device trace of ${which}; not taken yet.`));
      return false;
    }
    const most = Math.max(...ms, 1e-9);
    const traced = job.spec.summaries && job.spec.summaries.trace_steps;
    const which = tracedAt !== null ? ` that ended at step ${tracedAt}`
      : traced && traced.length ? ` of ${stepsText(traced)}` : "";
    const row = mb ? "tower with-memory" : "tower";
    towers.replaceChildren(...ms.map((value, i) => h("div", { class: row },
      h("span", { class: "tower-label" }, `tower ${i}`),
      h("span", { class: "tower-bar" }, h("span", { style: `width:${(100 * value) / most}%` })),
      h("span", { class: "tower-value" }, `${value.toFixed(2)} ms`),
      ...(mb ? [h("span", { class: "tower-memory" }, i < mb.length ? mib(mb[i]) : "")] : []))),
    h("p", { class: "muted small" }, "Device compute time of one step on each tower, from the " +
      `device trace${which}.`));
    return true;
  }

  function renderJob() {
    if (!job) return;
    const p = job.progress || {};
    const e = job.eval || {};
    const ended = TERMINAL.has(job.state);
    // Each part is written only where its text changes (here at every report): the job's
    // name or a number, selected to copy, lost its selection.
    setText(title, job.name);
    if (badge.textContent !== job.state) {
      const fresh = stateBadge(job.state);
      badge.replaceWith(fresh);
      badge = fresh;
    }
    document.title = `${job.name} · ${job.state} · Towerboard`;
    setProgress(bar, job);
    const parts = [stepText(job)];
    if (typeof p.percent === "number") parts.push(`${p.percent.toFixed(1)}%`);
    // Without a step, stepText is the phase already.
    if (p.phase && Number.isInteger(p.step) && !TERMINAL.has(job.state)) parts.push(phaseText(p));
    setText(barText, parts.join(" · "));
    queuePlace.render(job);
    priority.render(job);
    const set = (key, text) => setText(stats.querySelector(`[data-stat="${key}"]`), text);
    set("loss", num(p.loss));
    set("accuracy", percent(p.accuracy));
    set("eval_loss", num(e.loss));
    // Over how many examples: `eval.batches` may read only the first of the eval set. Said
    // as such, small, under the value: a bare "on 640" named no unit.
    const evalStat = stats.querySelector('[data-stat="eval_accuracy"]');
    const over = typeof e.examples === "number" && e.accuracy != null
      ? ` on ${e.examples.toLocaleString("en-US")} example${e.examples === 1 ? "" : "s"}` : "";
    if (evalStat.textContent !== percent(e.accuracy) + over) {
      evalStat.replaceChildren(percent(e.accuracy),
        ...(over ? [h("span", { class: "stat-sub" }, over)] : []));
    }
    set("examples_per_sec", rate(p.examples_per_sec));
    set("eta", eta(job));
    set("learning_rate", num(p.learning_rate, 6));
    set("devices", devicesText(job, { ranOn: true }));
    set("data", dataText(p));
    renderMeta();
    // Hidden once the job has ended: the keyboard, if it was on it, goes on from the line
    // that says how the job ended (or from Delete job, which takes its place).
    const cancelFocused = document.activeElement === cancelButton;
    // Armed as the job ends, Cancel stayed armed while hidden: a resume within its 4 s
    // showed "Confirm cancel", and one press cancelled the new run.
    if (ended && cancelPresses.armed) cancelPresses.withdraw();
    cancelButton.hidden = ended;
    deleteButton.hidden = !ended;
    resume.render(job);
    if (ended) watchEnded();
    modelLink.hidden = job.state !== "succeeded";
    if (TERMINAL.has(job.state)) notice.clear(); // no more live updates to miss
    dim(cancelButton, cancelling || Boolean(job.cancel_requested));
    renderError();
    renderOutcome();
    renderCancelTook();
    renderCancelled();
    if (cancelFocused && ended) {
      (actionStatus.textContent ? actionStatus : deleteButton).focus({ preventScroll: true });
    }
    renderResumeTook();
    renderResumed();
    profile.render(job);
    // Ended, a job reports nothing more: "yet" would promise what will not come.
    for (const chart of charts) chart.setEmptyText(ended ? "No data reported." : "No data yet");
    const text = JSON.stringify(job.spec, null, 2);
    if (spec.textContent !== text) spec.textContent = text;
    renderTowers();
  }

  function renderMeta() {
    // A queued job's `started_at` is null (a resumed or requeued one's next attempt has
    // not started); one read before that was so kept the last attempt's, which beside
    // "attempt 2" read as this one's.
    const started = job.started_at && job.state !== "queued"
      ? ` · started ${localTime(job.started_at)}` : "";
    // When its latest attempt ended, as its start is said (a job cancelled while queued
    // ended without starting).
    const ended = job.finished_at && TERMINAL.has(job.state)
      ? ` · ended ${localTime(job.finished_at)}` : "";
    const ran = job.started_at && job.finished_at
      ? ` · ran ${duration((Date.parse(job.finished_at) - Date.parse(job.started_at)) / 1000)}` : "";
    const noStep = noStepText(job);
    setText(metaId, job.id);
    metaRest.textContent = ` · submitted ${age(job.created_at)} ago${started}${ended}${ran}` +
      ` · priority ${job.priority} · attempt ${job.attempts}` +
      // Finished at its checkpoint ("Finish at step N"): its "20 / 20" read as trained.
      (noStep ? ` (${noStep})` : "") +
      (job.cancel_requested && !TERMINAL.has(job.state) ? " · cancel requested" : "");
  }

  /** A cancel of this page's that failed, seen to have been taken all the same (the job
   *  says cancel_requested, or has been cancelled): a lost answer (a lossy network) of a
   *  cancel that reached the service, say. "Could not cancel" stayed beside the cancelled
   *  job; the line is now a cancel's asked for, which says where the job stopped at its end. */
  function renderCancelTook() {
    if (actionStatus.dataset.action !== "cancel-failed") return;
    if (!job.cancel_requested && job.state !== "cancelled") return;
    actionStatus.dataset.action = "cancel";
    actionStatus.textContent = "Cancel requested: the worker checkpoints and stops.";
  }

  /** A cancel asked for on this page, once the job has ended: the line under Cancel said
   *  the worker checkpoints and stops, and now says where it stopped (or that the job
   *  ended otherwise first). */
  function renderCancelled() {
    if (actionStatus.dataset.action !== "cancel" || !TERMINAL.has(job.state)) return;
    const step = job.progress && Number.isInteger(job.progress.step)
      ? ` at step ${job.progress.step}` : "";
    setText(actionStatus, job.state === "cancelled"
      ? `Cancelled${step}.` : `The job ${job.state}${step} before the cancel took effect.`);
  }

  /** A resume of this page's that got no answer (or a 5xx), seen to have been taken all
   *  the same: the job is on a later attempt than when it was asked. "Could not resume:
   *  The service did not answer", in red, stayed beside the job training on. */
  function renderResumeTook() {
    if (actionStatus.dataset.action !== "resume-failed") return;
    if (job.attempts <= Number(actionStatus.dataset.attempt)) return;
    actionStatus.dataset.action = "resume";
    actionStatus.dataset.attempt = String(job.attempts); // renderResumed() says its end
    actionStatus.classList.remove("error");
    actionStatus.textContent = `Resumed as attempt ${job.attempts}.`;
  }

  /** A resume asked for on this page, once that attempt has ended: the line said it
   *  trains on, and now says how that went. */
  function renderResumed() {
    if (actionStatus.dataset.action !== "resume" || !TERMINAL.has(job.state)) return;
    if (String(job.attempts) !== actionStatus.dataset.attempt) return; // a refusal's line
    const step = job.progress && Number.isInteger(job.progress.step)
      ? ` at step ${job.progress.step}` : "";
    setText(actionStatus, `Attempt ${job.attempts} ${job.state}${step}.`);
  }

  let shownError = null; // the job.error the box shows, as JSON
  let tailFollow = null; // its log tail's followEnd()

  /** What to do about a run that diverged: Resume, beside it, would train the same steps
   *  from the checkpoint before, at the same rate, and most likely diverge again. */
  function divergedHint() {
    return h("p", { class: "job-error-hint", id: "diverged-hint" },
      "The run diverged: resumed as it is, it would most likely diverge again. Lower ",
      h("code", {}, "optimizer.learning_rate"), " or set ", h("code", {}, "clip_norm"), ", then ",
      h("a", { href: `#/submit?from=${encodeURIComponent(jobId)}` }, "Edit & resubmit"), ".");
  }

  function renderError() {
    // A cancel's error says how it ended (its worker killed after the grace, say): said in
    // the outcome's box, as a cancel, since nothing failed (renderOutcome).
    const failure = job.state === "cancelled" ? null : job.error;
    const key = JSON.stringify(failure || null);
    if (key === shownError) return; // redrawn, it would lose its scroll position
    shownError = key;
    tailFollow?.stop();
    tailFollow = null;
    if (!failure) {
      errorBox.hidden = true;
      errorBox.replaceChildren();
      return;
    }
    // Named, as the Log section's is: it takes the keyboard's focus (to scroll it), and a
    // screen reader said no more of it than its text.
    const tail = job.error.log_tail && job.error.log_tail.length
      ? h("pre", { class: "log", tabindex: "0", "aria-label": "Last lines of the worker's log" },
        job.error.log_tail.join("\n")) : "";
    errorBox.hidden = false;
    errorBox.replaceChildren(
      h("strong", {}, "Failed: "),
      // Its `quoted` names (a key, an array's name) as code, as the submit form shows them.
      ...withCode(endReason(job)),
      job.error.exit_code !== null && job.error.exit_code !== undefined
        ? ` (exit code ${job.error.exit_code})` : "",
      job.state === "failed" && DIVERGED.test(endReason(job)) ? divergedHint() : "",
      tail);
    // The cause is in the last lines (TensorFlow's start-up chatter comes first): opened at
    // its end, and kept there through a resize, as the Log section's box is. Scrolled there
    // once alone, a resize that wrapped its lines again (a phone turned, a window narrowed)
    // left its last lines out of sight, and Chromium's full-page screenshot cut the last one.
    if (tail) {
      tailFollow = followEnd(tail);
      tailFollow.keep();
    }
  }

  /** A cancelled job: where it stopped, or how its cancel ended where its worker did not
   *  checkpoint and exit in time (`stoppedText`), and what Resume would do, by the latest
   *  checkpoint the page has read (the one a resume restores). */
  function renderOutcome() {
    const stopped = job ? stoppedText(job) : "";
    outcomeBox.hidden = !stopped;
    if (!stopped) return;
    const resumes = latestCheckpoint === undefined ? "Resume trains on from its latest checkpoint."
      : latestCheckpoint === null ? "Resume trains again from step 0, as no checkpoint was saved."
        : `Resume trains on from step ${latestCheckpoint}'s checkpoint.`;
    const text = `Cancelled: ${stopped} ${resumes}`;
    if (outcomeBox.textContent === text) return; // rewritten, a selection in it would go
    outcomeBox.replaceChildren(h("strong", {}, "Cancelled: "), ...withCode(stopped), " ",
      h("span", { id: "job-outcome-resume" }, resumes));
  }

  // Reads of the log and of the checkpoints may overlap (a poll's, and the one made as the
  // job ends) and, on a slow network, be answered out of order: an answer older than one
  // shown is dropped. Shown last, a poll's answer from before the end hid the log's last
  // lines and the final checkpoint for good (nothing reads an ended job's again).
  let logAsks = 0;
  let logShown = 0;
  let checkpointAsks = 0;
  let checkpointShown = 0;

  async function loadLogs() {
    clearTimeout(logTimer);
    const ask = ++logAsks;
    let failure = null;
    try {
      const text = await getJSON(`${base}/logs?tail=${LOG_LINES}`);
      if (stopped || ask < logShown) return;
      logShown = ask;
      const next = text || (job && TERMINAL.has(job.state) ? "(no output)" : "(no output yet)");
      // Unchanged, it is left alone: rewriting it would drop a selection being copied.
      if (logs.textContent !== next) logs.textContent = next;
      logFollow.keep();
      if (!logError.hidden) logError.hidden = true;
    } catch (error) {
      if (stopped || ask < logShown) return;
      failure = error;
      // No answer (a restart, say): what was read stays, for the user reading it. The
      // line (a live region) is written only when it changes: rewritten at each 3 s poll,
      // a screen reader said it again and again while the service was down.
      const text = `Could not read the log: ${error.message}` +
        (logs.textContent ? " The lines below are from the last read." : "");
      if (logError.textContent !== text) logError.textContent = text;
      if (logError.hidden) logError.hidden = false;
    }
    // The latest read alone asks again: every LOG_POLL_MS while the job is live; an ended
    // job's log, polled no more, until it has been read (the failure stayed, over the lines
    // from before the end, until the page was reloaded).
    if (stopped || ask !== logAsks || !job) return;
    if (!TERMINAL.has(job.state)) logTimer = setTimeout(loadLogs, LOG_POLL_MS);
    else if (failure && mayPass(failure)) logTimer = setTimeout(loadLogs, RETRY_MS);
  }

  // The checkpoints table, made once and then updated in place, a row per step: rebuilt
  // at each checkpoint, it took the keyboard's focus off a Download link (back to the
  // page's top) within a second of a new checkpoint.
  const checkpointRows = h("tbody");
  const checkpointTable = h("div", { class: "scroll-x" }, h("table", { class: "plain" },
    h("thead", {}, h("tr", {}, h("th", {}, "Step"), h("th", {}, "Saved"), h("th", {}, "Size"),
      h("th", {}, h("span", { class: "visually-hidden" }, "Download")))),
    checkpointRows));
  // "Loading…", "No checkpoint yet.", or why the list could not be read; the table is put
  // beside it once there is a row.
  const checkpointNote = h("p", { class: "muted" }, "Loading…");
  checkpoints.append(checkpointNote);
  const rowsByStep = new Map(); // step -> its <tr>

  function checkpointRow(c) {
    return h("tr", { dataset: { step: String(c.step) } },
      h("td", { dataset: { label: "Step" } }, String(c.step)),
      h("td", { dataset: { label: "Saved", field: "time" } }),
      h("td", { dataset: { label: "Size", field: "size" } }),
      h("td", {}, h("a", {
        href: new URL(c.url, location.href).pathname,
        download: `${jobId}-ckpt-${c.step}.tar.gz`,
        // Read aloud, every link would be the same "Download .tar.gz".
        "aria-label": `Download .tar.gz of step ${c.step}`,
        class: "download",
        dataset: { step: String(c.step) },
      }, "Download .tar.gz")));
  }

  /** Show `text` (or nothing) in the note above the table; untouched when it says it. */
  function noteCheckpoints(text, isError = false) {
    checkpointNote.classList.toggle("muted", !isError);
    checkpointNote.classList.toggle("error", isError);
    if (checkpointNote.textContent !== text) checkpointNote.textContent = text;
    checkpointNote.hidden = !text;
  }

  /** The table's rows made those of `list`, newest first: a row kept is neither moved nor
   *  rebuilt, only its cells' text changed where it differs (a step saved again after a
   *  resume from an older one). A row whose checkpoint is gone (the retention's `keep`)
   *  goes; if the keyboard was on it, it goes on from the nearest row that stays. */
  function showCheckpoints(list) {
    const sorted = [...list].sort((a, b) => b.step - a.step);
    // Steps keep their order: only a new row is ever inserted, none moved.
    arrangeInPlace(checkpointRows, sorted.map((c) => {
      let tr = rowsByStep.get(c.step);
      if (!tr) {
        tr = checkpointRow(c);
        rowsByStep.set(c.step, tr);
      }
      const set = (field, text) => {
        const cell = tr.querySelector(`[data-field="${field}"]`);
        if (cell.textContent !== text) cell.textContent = text;
      };
      set("time", localTime(c.time));
      set("size", bytes(c.size_bytes));
      return tr;
    }), { focusIn: (tr) => tr.querySelector("a.download") });
    const steps = new Set(sorted.map((c) => c.step));
    for (const step of rowsByStep.keys()) if (!steps.has(step)) rowsByStep.delete(step);
    if (sorted.length === 0) checkpointTable.remove(); // its header alone says nothing
    else if (checkpointTable.parentNode !== checkpoints) checkpoints.append(checkpointTable);
  }

  async function loadCheckpoints() {
    clearTimeout(checkpointTimer); // this read answers for a read asked soon, or again
    const ask = ++checkpointAsks;
    try {
      const list = await getJSON(`${base}/checkpoints`);
      if (stopped || ask < checkpointShown) return;
      checkpointShown = ask;
      // Where a resume trains on from: Train longer's hint and least step.
      latestCheckpoint = list.data.length ? Math.max(...list.data.map((c) => c.step)) : null;
      resume.checkpoint(latestCheckpoint);
      if (job) renderOutcome();
      showCheckpoints(list.data);
      noteCheckpoints(list.data.length ? ""
        : job && TERMINAL.has(job.state) ? "No checkpoint was saved." : "No checkpoint yet.");
    } catch (error) {
      if (stopped || ask < checkpointShown) return;
      // The rows already read stay (the keyboard may be on one), the failure said above them,
      // and they are read again: an ended job's would be read no more, and the note stayed.
      noteCheckpoints(error.message, true);
      if (ask === checkpointAsks && mayPass(error)) {
        checkpointTimer = setTimeout(loadCheckpoints, RETRY_MS);
      }
    }
  }

  function checkpointsSoon() {
    clearTimeout(checkpointTimer);
    checkpointTimer = setTimeout(loadCheckpoints, 300);
  }

  function addPoints(name, event) {
    if (!Number.isInteger(event.step)) return;
    for (const read of metricReads) read.since.push([name, event]); // its answer may lack it
    fold(name, event);
    for (const key of SERIES) hold(key);
    drawCharts();
  }

  /** A stream's event into the series held: its points, and a `start`'s drop. */
  function fold(name, event) {
    if (name === "start") {
      // A run starting at this step (a resume, from its checkpoint): what the last run
      // reported past it was lost with it, and this run reports those steps again. The
      // service drops them from the job's metrics too.
      for (const key of SERIES) {
        series[key] = series[key].filter((point) => point.step <= event.step);
      }
    }
    for (const key of SERIES) {
      if (typeof event[key] === "number") put(series[key], { step: event.step, value: event[key] });
    }
  }

  /** `point` into `list` (in step order, one point a step): a step it has (the `end` line
   *  repeats its last step's numbers; a read's answer may hold what the stream brings
   *  again) takes the newer value. */
  function put(list, point) {
    const last = list[list.length - 1];
    if (!last || last.step < point.step) {
      list.push(point);
      return;
    }
    const i = list.findIndex((p) => p.step >= point.step);
    if (list[i].step === point.step) list[i] = point;
    else list.splice(i, 0, point);
  }

  /** Series `key` kept to HELD_POINTS: past it, thinned to about 2 × CHART_POINTS, in step
   *  order still (a `start`'s filter and the charts' align() rely on that). Each series on
   *  its own: one of fewer points (an eval's, sparse) keeps every one. */
  function hold(key) {
    if (series[key].length > HELD_POINTS) series[key] = thinPoints(series[key], CHART_POINTS);
  }

  // Said in the status line as well as on the button: a screen reader announces the line
  // (role=status), not a button's new label.
  const cancelPresses = twoPresses(cancelButton, "Cancel", "Confirm cancel",
    "Press Confirm cancel within 4 s to stop this job.");

  let cancelling = false; // this page's cancel is out

  /** A button that acts on its second press within CONFIRM_MS (Cancel, Delete job): the
   *  first arms it, relabelled `armedLabel`, and says `armedLine` in the status line;
   *  unconfirmed, it disarms itself and takes the line back. */
  function twoPresses(button, label, armedLabel, armedLine) {
    let timer = null;
    function disarm() {
      clearTimeout(timer);
      button.dataset.armed = "";
      button.textContent = label;
    }
    /** Disarmed, and its line taken back if it is still the one shown. */
    function withdraw() {
      disarm();
      if (actionStatus.textContent === armedLine) actionStatus.textContent = "";
    }
    return {
      disarm,
      withdraw,
      get armed() { return button.dataset.armed === "1"; },
      /** This press: the second (true, and it is disarmed), or the first, which arms it. */
      confirmed() {
        if (button.dataset.armed === "1") {
          disarm();
          return true;
        }
        button.dataset.armed = "1";
        button.textContent = armedLabel;
        actionStatus.textContent = armedLine;
        timer = setTimeout(withdraw, CONFIRM_MS);
        return false;
      },
      stop() { clearTimeout(timer); }, // the page is gone
    };
  }

  /** Cancel, pressed: the first press arms it, a second within CONFIRM_MS cancels. Sent,
   *  it is disarmed (as Delete job is): a cancel that fails is armed afresh, for 4 s of
   *  its own, rather than confirmed by the next press or disarmed by the first's timer. */
  async function cancel() {
    if (dimmed(cancelButton)) return; // asked for already
    if (!cancelPresses.confirmed()) return;
    cancelling = true;
    dim(cancelButton, true);
    // Confirmed: on a slow network the line said "Press Confirm cancel within 4 s" until
    // the answer came, beside a Cancel that did nothing more.
    actionStatus.classList.remove("error");
    actionStatus.textContent = "Cancelling…";
    try {
      const asked = mark();
      const { status, data } = await api(`${base}/cancel`, { method: "POST" });
      if (stopped) return;
      let next = fresher(job, streamedAt, data, asked);
      if (data.cancel_requested && !TERMINAL.has(next.state)) next = { ...next, cancel_requested: true };
      actionStatus.classList.remove("error"); // a refused resume's, say
      // A resumed job whose attempt had not started goes back to how it was (a "train
      // longer" taken back leaves it succeeded, its model still served).
      const takenBack = status === 200 && data.state !== "cancelled";
      actionStatus.textContent = status === 202
        ? "Cancel requested: the worker checkpoints and stops."
        : takenBack
          ? `Resume taken back (its attempt had not started): the job is ${data.state} again.`
          : "Cancelled.";
      // renderCancelled() says how a cancelled job ended; a resume taken back is said here.
      actionStatus.dataset.action = takenBack ? "" : "cancel";
      // As a state from the stream: a job this answer ended (a queued one, cancelled at once)
      // has its log, checkpoints and metrics read as ended, and the devices panel is told.
      take(next);
    } catch (error) {
      actionStatus.textContent = `Could not cancel: ${error.message}`;
      actionStatus.dataset.action = "cancel-failed";
      dim(cancelButton, false);
      if (job && !stopped) renderCancelTook(); // the stream may have said so already
    } finally {
      cancelling = false;
    }
  }

  const deletePresses = twoPresses(deleteButton, "Delete job", "Confirm delete",
    "Press Confirm delete within 4 s to delete this job for good: its metrics, log, " +
    "checkpoints and model.");

  /** Delete job, pressed: the first press arms it (said in the status line, which a screen
   *  reader announces), a second within CONFIRM_MS deletes. Deleted, the page goes back to
   *  the jobs list, which says so; refused (a 409 while the worker is still exiting, say),
   *  the service's reason is said here and nothing else changes. */
  async function remove() {
    if (exiting || deleting) return; // dimmed (aria-disabled), it keeps the focus but does nothing
    if (!deletePresses.confirmed()) {
      actionStatus.dataset.action = "delete"; // no longer the line of a cancel asked for
      actionStatus.classList.remove("error");
      return;
    }
    dim(deleteButton, true);
    actionStatus.textContent = "Deleting…";
    deleting = true;
    deletedMeanwhile = false;
    try {
      await api(base, { method: "DELETE" });
    } catch (error) {
      deleting = false;
      if (stopped) return;
      // Its answer lost (a lossy network), the delete was done all the same: the stream
      // said so meanwhile. "Could not delete" stayed beside a job that was gone.
      if (deletedMeanwhile) {
        leaveDeleted();
        return;
      }
      dim(deleteButton, exiting);
      actionStatus.classList.add("error");
      actionStatus.textContent = `Could not delete: ${error.message}`;
      // Already gone (deleted elsewhere meanwhile): the page says so, as the stream would.
      if (error.status === 404) showDeleted();
      // Its worker still exiting (the devices read that would have said so failed, say):
      // the button waits for it from now on.
      if (error.status === 409) checkExiting();
      // No answer: it may have been done, and the stream say so no more (read, a 404 says).
      if (mayPass(error)) checkStillThere();
      return;
    }
    if (stopped) return;
    leaveDeleted();
  }

  /** Deleted by this page: back to the jobs list, which says so. */
  function leaveDeleted() {
    const name = job && job.name !== jobId ? `${job.name} (${jobId})` : jobId;
    unselect(jobId); // no longer one to compare in the list
    noticeOnJobs(`Job ${name} deleted.`);
    location.hash = jobsListHash();
  }

  /** While the job has ended, follow the all-jobs stream for its `deleted`, its `exited`,
   *  and a `state` that is not an end: resumed elsewhere (another user, `towerboard
   *  resume`) (idempotent). Each (re)connection reads the job and the devices once: what
   *  happened while it was not connected is then seen too. The service subscribes the
   *  stream as it sends the answer's head, which is what fires `open`: a read made then
   *  sees whatever the stream will not bring (an `exited` sent before it was subscribed). */
  function watchEnded() {
    if (closeWatch || stopped) return;
    closeWatch = followAllJobs({
      open: () => {
        watchLost = false;
        checkStillThere();
        checkExiting();
        window.dispatchEvent(new CustomEvent("towerboard:devices")); // an exit it missed
      },
      error: (readyState) => {
        if (readyState !== EventSource.CLOSED) return; // reconnecting: `open` reads again
        // Given up for good (an HTTP error): no `exited` will come, so a wait shown reads
        // the devices again, every EXITING_RECHECK_MS, until it has ended.
        watchLost = true;
        if (exiting) checkExiting();
      },
      deleted: (event) => {
        if (event.job_id !== jobId) return;
        if (deleting) deletedMeanwhile = true;
        else showDeleted();
      },
      exited: (event) => {
        window.dispatchEvent(new CustomEvent("towerboard:devices")); // any job's: the panel
        if (event.job_id !== jobId || stopped) return;
        exitingAsk += 1; // a devices read still out may have been answered before the exit
        clearTimeout(exitingTimer);
        setExiting(false);
      },
      state: (event) => {
        if (event.job_id !== jobId || stopped) return;
        const { job_id: _, ...copy } = event;
        const next = fresher(job, streamedAt, copy, mark());
        if (next === job) return;
        streamedAt = mark();
        take(next);
      },
    });
  }

  /** Whether the ended job's worker is still exiting, as the devices list says: while it
   *  is, Resume, Train longer and Delete job wait (dimmed, with the hint) for the stream's
   *  `exited` (watchEnded). Run when the page sees the job end, when it opens on an ended
   *  job, when the all-jobs stream (re)connects, and when the service refuses a resume or
   *  delete. */
  async function checkExiting() {
    clearTimeout(exitingTimer);
    const ask = ++exitingAsk;
    if (stopped || !job || !TERMINAL.has(job.state)) {
      setExiting(false);
      return;
    }
    let devices;
    try {
      devices = await getJSON("/api/v1/devices");
    } catch {
      if (ask !== exitingAsk) return;
      // Not known this time: a wait already shown is kept and asked after again (this may
      // have been the read after a reconnection, for an `exited` the stream missed);
      // otherwise the controls stay usable, and the service's refusal says why if it refuses.
      if (!stopped && exiting) exitingTimer = setTimeout(checkExiting, EXITING_RECHECK_MS);
      return;
    }
    if (stopped || ask !== exitingAsk) return;
    const still = Boolean(job && TERMINAL.has(job.state) &&
      devices.data.some((device) => device.job_id === jobId && device.exiting));
    setExiting(still);
    // The stream's `exited` ends the wait; asked again only where no stream can say it.
    if (still && watchLost) exitingTimer = setTimeout(checkExiting, EXITING_RECHECK_MS);
  }

  function setExiting(value) {
    if (exiting === value) return;
    exiting = value;
    exitingHint.hidden = !value;
    dim(deleteButton, value || deleting);
    if (value) {
      deletePresses.disarm();
      deleteButton.setAttribute("aria-describedby", exitingHint.id);
    } else {
      deleteButton.removeAttribute("aria-describedby");
    }
    resume.waitForExit(value ? exitingHint.id : null);
  }

  function unwatchEnded() {
    if (closeWatch) closeWatch();
    closeWatch = null;
    watchLost = false;
  }

  async function checkStillThere() {
    const asked = mark();
    try {
      const snapshot = await getJSON(base);
      if (!stopped) take(fresher(job, streamedAt, snapshot, asked));
    } catch (error) {
      if (error.status === 404 && !deleting) showDeleted();
    }
  }

  /** The job was deleted elsewhere: say so instead of its last numbers, and stop every live
   *  update, poll and stream of this page. */
  function showDeleted() {
    if (stopped || gone) return;
    gone = true;
    unselect(jobId); // no longer one to compare in the list
    const focused = view.contains(document.activeElement);
    halt();
    showOnly("This job was deleted.");
    view.removeAttribute("aria-busy"); // a read still out is dropped (halted): this is said
    notFound.classList.replace("error", "job-gone");
    document.title = `${job ? job.name : jobId} · deleted · Towerboard`;
    // The control the keyboard was on is hidden now: it goes on from the message.
    if (focused) notFound.focus({ preventScroll: true });
  }

  /** Take `next` as the job. If that ends it while this page watches, read what it wrote
   *  last (a job that had ended before the page opened is read once, by load()). If it
   *  was ended and is not (resumed), follow it live again. */
  function take(next, { reread = false } = {}) {
    const ended = job && !TERMINAL.has(job.state) && TERMINAL.has(next.state);
    const resumed = job && TERMINAL.has(job.state) && !TERMINAL.has(next.state);
    // Another attempt (from the resume's answer, the stream of every job, or a read): its
    // run drops the points past the step it starts at, and this page may have missed its
    // `start` (its own stream reopened only once it knew, maybe after that).
    const attempt = job && next.attempts !== job.attempts;
    if (job && job.state !== next.state) window.dispatchEvent(new CustomEvent("towerboard:devices"));
    job = next;
    if (resumed) unwatchEnded(); // before renderJob(), which watches an ended job
    renderJob();
    // A job followed again reads them once its new stream has said its first state
    // (follow): the stream is then subscribed, so a `start` the read misses, it brings.
    if (ended || reread || (attempt && !resumed)) loadMetrics();
    if (ended) {
      loadLogs();
      loadCheckpoints();
      checkExiting();
    }
    if (resumed) {
      checkExiting(); // not ended: nothing waits for an exit
      // Its own stream ended with the last attempt: a new one says this attempt's state
      // first, then its progress. The log is polled again while the job is live.
      closeStream();
      rereadAtState = true;
      follow();
      loadLogs();
      checkpointsSoon();
    }
  }

  let interrupted = false; // the stream dropped: what it missed is re-read once it is back
  // The charts are read again whole at the stream's next `state`, its first on a connection
  // (a job followed again after a resume, a stream back after a drop): the service sends
  // it once it has subscribed the stream, so every change to the job's metrics after that
  // read comes on the stream too, in order (loadMetrics).
  let rereadAtState = false;

  function follow() {
    closeStream = followJob(jobId, {
      open: () => {
        notice.clear();
        if (interrupted) {
          interrupted = false;
          rereadAtState = true;
          checkpointsSoon();
        }
      },
      error: (readyState) => {
        interrupted = true;
        if (job && TERMINAL.has(job.state)) return; // nothing more was to come
        notice.error(readyState);
        // Given up: the re-read shows the latest (and a 401 asks for the token).
        if (readyState === EventSource.CLOSED) reread();
      },
      state: (data) => {
        streamedAt = mark();
        const reread = rereadAtState;
        rereadAtState = false;
        take(data, { reread });
      },
      any: (name, event) => {
        if (name === "state" || name === "deleted" || name === "exited" || !job) return;
        job = applyProgressEvent(job, event);
        streamedAt = mark();
        if (name === "trace" && Number.isInteger(event.step)) traceStep = event.step;
        renderJob();
        if (name === "trace") profile.traced(event);
        addPoints(name, event);
        if (name === "checkpoint" || name === "end") checkpointsSoon();
      },
    });
  }

  async function reread() {
    const asked = mark();
    try {
      const snapshot = await getJSON(base);
      if (!stopped) take(fresher(job, streamedAt, snapshot, asked));
    } catch (error) {
      // A job read before and now missing was deleted. Otherwise the notice stays: live
      // updates have stopped.
      if (error.status === 404 && job && !deleting) showDeleted();
    }
  }

  let parked = []; // what showOnly() hid, to show again once the job is read

  /** Show only `message` (and the way back to the jobs). */
  function showOnly(message) {
    notFound.textContent = message;
    notFound.hidden = false;
    if (parked.length === 0) {
      parked = [...view.children].filter((el) =>
        el !== notFound && !el.classList.contains("crumbs") && !el.hidden);
    }
    for (const el of parked) el.hidden = true;
  }

  function showAll() {
    notFound.hidden = true;
    for (const el of parked) el.hidden = false;
    parked = [];
  }

  async function load() {
    // Busy until this read has filled the heading or said why it could not: a read again,
    // after one that got no answer, too, so that the page is said again once it is answered.
    view.setAttribute("aria-busy", "true");
    follow(); // first, then read: nothing falls between the snapshot and the stream
    const asked = mark();
    let snapshot;
    try {
      snapshot = await getJSON(base);
    } catch (error) {
      if (stopped) return;
      view.removeAttribute("aria-busy"); // what it says in the job's place is shown below
      closeStream();
      notice.clear(); // the message below says it all
      // No answer (the service is restarting, say) or a server error: it may answer soon,
      // so the page tries again rather than stay blank until the user reloads it.
      const again = mayPass(error);
      // Refused for want of a token: the token bar asks for it, and this says so once (it
      // showed the 401's own "Expected header 'Authorization: Bearer …'"), as the jobs do.
      showOnly(error.status === 404 ? `No job ${jobId}.`
        : error.status === 401 ? "Enter the service's token above to see this job."
          : again ? `Could not load job ${jobId}: ${error.message} Trying again…` : error.message);
      if (again) loadTimer = setTimeout(load, RETRY_MS);
      return;
    }
    if (stopped) return;
    showAll();
    // Only if the stream has said nothing newer meanwhile (it may have seen the job end).
    job = fresher(job, streamedAt, snapshot, asked);
    renderJob();
    view.removeAttribute("aria-busy"); // its heading has its name: the page can be said
    if (TERMINAL.has(job.state)) checkExiting(); // ended just now, its worker may be exiting
    await Promise.all([loadMetrics(), loadCheckpoints(), loadLogs()]);
  }

  /** The charts made the job's series as the service holds them: its answer, then what
   *  the stream brought since the read was asked, in order (each point and `start`, which
   *  may or may not be in the answer). Not merged into the points held: a resumed job's
   *  series lose the steps past where its new attempt started, which a `start` this page
   *  missed would not have taken away. An answer to a read older than one already shown
   *  is dropped. */
  async function loadMetrics() {
    clearTimeout(metricsTimer);
    const read = { id: ++metricsAsked, since: [] };
    metricReads.add(read);
    try {
      const metrics = await getJSON(`${base}/metrics?points=${CHART_POINTS}`);
      if (stopped || read.id < metricsShown) return;
      metricsShown = read.id;
      for (const key of SERIES) {
        series[key] = [...(metrics.series[key] || [])].sort((a, b) => a.step - b.step);
      }
      for (const [name, event] of read.since) fold(name, event);
      for (const key of SERIES) hold(key);
      drawCharts();
    } catch (error) {
      // The charts keep what they had, and what the stream gives them, and the latest read
      // is asked again: unread, an ended job's charts said "No data reported." and a live
      // one's lacked every point from before the page opened, until the page was reloaded.
      if (!stopped && read.id === metricsAsked && mayPass(error)) {
        metricsTimer = setTimeout(loadMetrics, RETRY_MS);
      }
    } finally {
      metricReads.delete(read);
    }
  }

  // The host's kind, first known (or changed): a queued job's wait is said in its units.
  const hostKnown = () => {
    if (job) setText(stats.querySelector('[data-stat="devices"]'), devicesText(job, { ranOn: true }));
  };
  window.addEventListener("towerboard:host", hostKnown);

  ticker = setInterval(() => {
    if (!job) return;
    renderMeta(); // "submitted 3m 05s ago" counts on
    if (job.state === "running") {
      setText(stats.querySelector('[data-stat="eta"]'), eta(job));
    }
  }, 1000);

  /** Stop every stream, poll and timer: the page changes no more. */
  function halt() {
    stopped = true;
    if (closeStream) closeStream();
    if (closeWatch) closeWatch();
    clearTimeout(logTimer);
    clearTimeout(checkpointTimer);
    clearTimeout(loadTimer);
    clearTimeout(metricsTimer);
    clearTimeout(exitingTimer);
    cancelPresses.stop();
    deletePresses.stop();
    clearInterval(ticker);
    window.removeEventListener("towerboard:host", hostKnown);
    logFollow.stop();
    tailFollow?.stop();
    tensorBoard.destroy();
    profile.destroy();
    resume.destroy();
    queuePlace.destroy();
    priority.destroy();
  }

  drawCharts();
  load();
  return () => {
    halt();
    for (const chart of charts) chart.destroy();
    document.title = "Towerboard";
  };
}
