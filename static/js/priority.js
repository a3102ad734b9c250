// A queued or running job's priority, on its page beside its place in the queue: a number
// field and Set priority (PATCH /api/v1/jobs/{id}), Enter in the field sends it, the
// arrow keys step it. A queued job moves in the queue at once (keeping when it joined it:
// where it would be had it been submitted at that priority); a running one's counts if
// it is requeued or resumed. The line under it says what came of it, or why it was
// refused. Hidden once the job has ended: a resume takes a priority instead (the Priority
// field of the form Train longer opens, resume.js, built and read by the helpers here).

import { TERMINAL, api } from "./api.js";
import { dim, dimmed, h, setText } from "./format.js";
import { mark } from "./jobs.js";

// The spec's range (trainer/spec.py PRIORITY_MIN, PRIORITY_MAX).
const LEAST = -1000;
const MOST = 1000;
/** What a priority field takes, as a refusal of one says it. */
export const PRIORITY_EXPECTED = `a whole number from ${LEAST} to ${MOST}`;

/** A number field for a priority, `id` and any other `attrs`: the spec's range, whole
 *  steps (the arrow keys step it), the numeric keypad on a phone. Here and in the resume
 *  form (resume.js), which queues an ended job again at one. */
export function priorityInput(id, attrs = {}) {
  return h("input", { type: "number", id, name: "priority", min: String(LEAST), max: String(MOST),
    step: "1", inputmode: "numeric", autocomplete: "off", ...attrs });
}

/** The whole number typed into priority field `input`; null where there is none (a letter
 *  typed into a number field reads as "" too). One out of the range is the service's to
 *  refuse: its message names the range and what it received. */
export function typedPriority(input) {
  const text = input.value.trim();
  const value = Number(text);
  return text === "" || !Number.isInteger(value) ? null : value;
}

/** The control for `jobId`'s page: `form` (beside the queue place) and `status` (the
 *  line under it). `changed(job, asked)` takes the service's answer (the
 *  job with its new priority) to a request begun at mark() `asked`; `missing()` runs when
 *  the job is no more (404). `render(job)` shows the job's priority (not over a number
 *  being typed) and hides the control once the job has ended. */
export function priorityControl(jobId, { changed, missing }) {
  const base = `/api/v1/jobs/${encodeURIComponent(jobId)}`;
  const input = priorityInput("job-priority", { "aria-describedby": "priority-status" });
  const button = h("button", { type: "submit", id: "set-priority" }, "Set priority");
  const status = h("p", { class: "small priority-status", id: "priority-status", role: "status" });
  const form = h("form", { class: "priority-form", id: "priority-form", novalidate: true,
    hidden: true },
  h("label", { for: "job-priority" }, "Priority"), input, button);
  let job = null;
  let edited = false; // a number typed and not sent: the job's own does not replace it
  let busy = false;
  let gone = false;

  input.addEventListener("input", () => {
    edited = job === null || input.value !== String(job.priority);
    input.removeAttribute("aria-invalid");
  });
  // Escape puts the job's own priority back.
  input.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || !job) return;
    edited = false;
    input.value = String(job.priority);
    input.removeAttribute("aria-invalid");
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });

  function say(text, isError = false) {
    status.classList.toggle("error", isError);
    setText(status, text);
  }

  function refuse(text) {
    say(text, true);
    input.setAttribute("aria-invalid", "true");
  }

  async function send() {
    if (busy || !job || dimmed(button)) return;
    const value = typedPriority(input);
    if (value === null) {
      refuse(`Not changed: enter ${PRIORITY_EXPECTED}.`);
      return;
    }
    if (value === job.priority) {
      edited = false;
      say(`Its priority is ${value} already.`);
      return;
    }
    busy = true;
    dim(button, true);
    say("Setting the priority…");
    const asked = mark();
    try {
      const { data } = await api(base, { method: "PATCH", body: { priority: value } });
      if (gone) return;
      edited = false;
      input.removeAttribute("aria-invalid");
      say(data.state === "queued"
        ? `Priority set to ${data.priority}: it moved in the queue, placed among the jobs of ` +
          "that priority by when it joined the queue."
        : data.state === "running"
          ? `Priority set to ${data.priority}: the job runs on, and the new priority counts ` +
            "if it is requeued or resumed."
          : `Priority set to ${data.priority}; the job has ended since.`);
      changed(data, asked);
    } catch (error) {
      if (gone) return;
      if (error.status === 404) {
        missing();
        return;
      }
      const fields = (error.errors || []).map((e) => e.message);
      const why = fields.length ? fields.join(" ") : error.detail || error.message;
      if (error.status === 422) refuse(`Not changed: ${why}`);
      else say(`Could not set the priority: ${why}`, true);
    } finally {
      if (!gone) {
        busy = false;
        dim(button, false);
      }
    }
  }

  return {
    form,
    status,
    render(next) {
      job = next;
      const ended = TERMINAL.has(job.state);
      if (ended) {
        // The keyboard, if it was here, goes on from the line, which says why it went.
        const focused = form.contains(document.activeElement);
        if (!form.hidden) form.hidden = true;
        edited = false;
        if (focused && status.textContent) {
          status.tabIndex = -1;
          status.focus({ preventScroll: true });
        }
        return;
      }
      if (form.hidden) form.hidden = false;
      if (!edited && input.value !== String(job.priority)) input.value = String(job.priority);
    },
    destroy() {
      gone = true;
    },
  };
}
