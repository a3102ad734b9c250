// A job page's "Trace next 5 steps": asks the running job's worker for a device trace
// (POST /jobs/{id}/profile), then says when it was taken (the job's `trace` event), or
// that the job ended first. The per-tower times beside it come from that trace.

import { TERMINAL, api, mayPass } from "./api.js";
import { dim, dimmed, h, sentence } from "./format.js";

export const PROFILE_STEPS = 5;

/** The button and its status line for `jobId`'s page. `render(job)` shows the button
 *  while the job can be traced; `traced(event)` takes the job's `trace` event. */
export function profileControl(jobId) {
  const base = `/api/v1/jobs/${encodeURIComponent(jobId)}`;
  const button = h("button", { type: "button", id: "profile-job", hidden: true,
    title: "Device trace of the next steps: each tower's step time here, the trace in " +
      "TensorBoard's profile tab", onclick: ask }, `Trace next ${PROFILE_STEPS} steps`);
  const status = h("p", { class: "action-status small", id: "profile-status", role: "status" });
  let waiting = false; // asked, and no trace has come since
  // Asked, and no answer came (a lossy network): the worker may have been asked all the
  // same. A requested trace that comes then answers it; the line said "Could not ask for a
  // trace" beside the times of the trace it took.
  let unanswered = false;
  let gone = false;

  function say(state, text) {
    status.dataset.state = state;
    status.classList.toggle("error", state === "failed");
    status.textContent = text;
  }

  async function ask() {
    if (dimmed(button)) return; // asked already, and not answered yet
    dim(button, true);
    say("asking", "Asking the worker for a trace…");
    try {
      const { data } = await api(`${base}/profile`, { method: "POST", body: { steps: PROFILE_STEPS } });
      if (gone) return;
      waiting = true;
      unanswered = false;
      say("waiting", `Tracing the next ${data.steps} steps: the worker starts at its next ` +
        "report, and the per-tower times below update when the trace is taken.");
    } catch (error) {
      if (gone) return;
      say("failed", `Could not ask for a trace: ${error.message}`);
      unanswered = !waiting && mayPass(error);
    } finally {
      dim(button, false);
    }
  }

  return {
    button,
    status,
    render(job) {
      const ended = TERMINAL.has(job.state);
      button.hidden = job.state !== "running" || Boolean(job.cancel_requested);
      if (ended) unanswered = false; // the line keeps the failure
      if (waiting && ended) {
        waiting = false;
        say("ended", `The job ${job.state} before the trace was taken.`);
      }
    },
    traced(event) {
      // Only a trace holding steps a request asked for (`requested`) answers this one: the
      // spec's own trace_steps, traced meanwhile, were taken for this page's request.
      if (!(waiting || unanswered) || !event.requested) return;
      waiting = false;
      unanswered = false;
      // Written, but its times could not be read (no CUPTI on a GPU host, say): answered
      // all the same, with why, where the page waited on until the job's end.
      if (!Array.isArray(event.tower_ms) && typeof event.tower_ms_error === "string") {
        say("traced", `Traced up to step ${event.step}; no per-tower times from it: ` +
          `${sentence(event.tower_ms_error)} The trace is in TensorBoard's profile tab.`);
        return;
      }
      say("traced", `Traced up to step ${event.step}: the per-tower times below are from ` +
        "it, and the trace is in TensorBoard's profile tab.");
    },
    destroy() {
      gone = true;
    },
  };
}
