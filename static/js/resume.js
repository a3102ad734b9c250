// A job page's Resume, Finish at step N and Train longer (POST /jobs/{id}/resume): a
// cancelled or failed job goes back in the queue as it is, or to end at its latest
// checkpoint (its total made that checkpoint's step: restored, no step trained, its final
// eval and export: the model of a run stopped at a good point, or of one that failed past
// it), and any ended job, a succeeded one too, can be sent back to train on to a larger
// total of steps. Its next worker trains on from the job's latest checkpoint. All are
// hidden while the job is queued or running.
//
// The form Train longer opens has the job's priority too, to queue it again at another
// (sent only when changed): while the form is open, Resume and Finish at step N take it
// as well, and its hint says so. Each field's refusal is said under the form, beside the
// other's, and the form keeps what was typed.
//
// Nothing is lost by a resume, so none asks for a second press (as Cancel and Delete do).
// While the ended job's worker is still exiting (the service would refuse: 409), they are
// dimmed and say why (waitForExit).

import { TERMINAL, api } from "./api.js";
import { h } from "./format.js";
import { mark } from "./jobs.js";
import { PRIORITY_EXPECTED, priorityInput, typedPriority } from "./priority.js";

// The resume form's own refusal of what its Priority field holds.
const PRIORITY_REFUSAL = `Enter ${PRIORITY_EXPECTED}.`;

/** What a resume does, by the latest checkpoint's step (null: none was saved), the new
 *  total `to` (" to step 80", or ""). */
function trainsOn(latest, to) {
  return latest === null ? `it trains${to} from step 0, as no checkpoint was saved`
    : `it trains on${to} from its latest checkpoint`;
}

/** The Resume button, the Finish at step N button, the Train longer button and the form
 *  it opens, for `jobId`'s page.
 *  `say(action, text, isError)` writes the page's action status line; `resumed(job, asked,
 *  focused)` takes the service's answer (the job, queued again) to a request begun at
 *  mark() `asked`, pressed with the keyboard on these controls if `focused`; `missing()`
 *  runs when the job is no more (404), `refused(error, attempt)` on any other failure
 *  (`attempt`: the job's attempts when the resume was asked). `render(job)`
 *  shows what fits the job's state; `checkpoint(step)` takes the latest checkpoint's step
 *  (null: none was saved); `waitForExit(hintId)` dims the controls, described by the
 *  element `hintId`, until it is called with null. */
export function resumeControl(jobId, { say, resumed, missing, refused = () => {} }) {
  const base = `/api/v1/jobs/${encodeURIComponent(jobId)}`;
  const resumeButton = h("button", { type: "button", id: "resume-job", hidden: true,
    title: "Queue the job again: it trains on from its latest checkpoint", onclick: () => send() },
  "Resume");
  const longerButton = h("button", { type: "button", id: "train-longer", hidden: true,
    "aria-expanded": "false", "aria-controls": "resume-form", onclick: toggle }, "Train longer");
  // Named by its step, which `checkpoint()` tells: shown once there is one to end at.
  const finishButton = h("button", { type: "button", id: "finish-job", hidden: true,
    onclick: () => send({ steps: latest }) });
  const input = h("input", { type: "number", id: "resume-steps", name: "steps", min: "1", step: "1",
    inputmode: "numeric", required: true, autocomplete: "off",
    "aria-describedby": "resume-steps-error resume-steps-hint" });
  // The job's own priority when the form opens: a resume sends one only where it differs.
  const priorityField = priorityInput("resume-priority", {
    "aria-describedby": "resume-priority-error resume-priority-hint" });
  const submit = h("button", { type: "submit", class: "primary", id: "resume-submit" }, "Train on");
  const hint = h("p", { class: "muted small resume-hint", id: "resume-steps-hint" });
  const priorityHint = h("p", { class: "muted small resume-hint", id: "resume-priority-hint" });
  const fieldError = h("p", { class: "error small resume-error", id: "resume-steps-error",
    hidden: true });
  const priorityError = h("p", { class: "error small resume-error", id: "resume-priority-error",
    hidden: true });
  // Each field with the line its refusal goes in, by the service's field name.
  const fields = { steps: [input, fieldError], priority: [priorityField, priorityError] };
  // Named by its button, so a screen reader says "Train longer, form" on entering it.
  const form = h("form", { class: "resume-form", id: "resume-form", hidden: true, novalidate: true,
    "aria-labelledby": "train-longer" },
  h("div", { class: "resume-field" }, h("label", { for: "resume-steps" }, "To step"), input),
  h("div", { class: "resume-field" }, h("label", { for: "resume-priority" }, "Priority"),
    priorityField),
  submit, hint, priorityHint, fieldError, priorityError);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    trainLonger();
  });
  // Escape closes the form, and the keyboard goes on from the button that opened it.
  form.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    close();
    longerButton.focus();
  });

  /** Whether the keyboard is on one of these controls (they hide once the job resumes). */
  function hasFocus() {
    const active = document.activeElement;
    return active === resumeButton || active === finishButton || active === longerButton
      || form.contains(active);
  }

  let job = null;
  let latest; // the latest checkpoint's step; null when none was saved, undefined until read
  let busy = false;
  let waiting = null; // while the worker is still exiting: the id of the line that says so
  let gone = false;

  function showHint() {
    hint.textContent = latest === undefined ? "It trains on from its latest checkpoint."
      : latest === null ? "No checkpoint was saved: it trains again from step 0."
        : `It trains on from step ${latest}, its latest checkpoint: give a step past it.`;
    if (Number.isInteger(latest)) input.min = String(latest + 1);
    // Resume and Finish are beside Train longer, not in the form: said, as they take it too.
    priorityHint.textContent = "The highest priority starts first" + (stoppedShort()
      ? "; while this form is open, Resume and Finish take this priority too." : ".");
  }

  /** Twice the job's current total (the one its last worker reported, or its spec's),
   *  and past the latest checkpoint; empty when the total is not known (an epochs spec
   *  whose worker never reported). */
  function suggestion() {
    const p = (job && job.progress) || {};
    const total = Number.isInteger(p.total) ? p.total
      : job && Number.isInteger(job.spec.steps) ? job.spec.steps : null;
    if (total === null) return "";
    return String(Math.max(2 * total, Number.isInteger(latest) ? latest + 1 : 1));
  }

  function clearFieldError() {
    for (const [field, error] of Object.values(fields)) {
      error.hidden = true;
      error.textContent = "";
      field.removeAttribute("aria-invalid");
    }
  }

  /** Say `texts` ({steps, priority}: a refusal each) beside their fields; the first field
   *  refused takes the focus, read out with its description: the refusal. */
  function showFieldErrors(texts) {
    let first = null;
    for (const [name, [field, error]] of Object.entries(fields)) {
      if (!texts[name]) continue;
      error.textContent = texts[name];
      error.hidden = false;
      field.setAttribute("aria-invalid", "true");
      first = first || field;
    }
    if (first) first.focus();
  }

  function open() {
    form.hidden = false;
    longerButton.setAttribute("aria-expanded", "true");
    clearFieldError();
    showHint();
    input.value = suggestion();
    priorityField.value = String(job.priority);
    input.focus();
    input.select();
  }

  function close() {
    form.hidden = true;
    longerButton.setAttribute("aria-expanded", "false");
    clearFieldError();
  }

  function toggle() {
    if (busy || waiting) return;
    if (form.hidden) open();
    else close();
  }

  /** While a resume is out, or the worker is still exiting, presses are ignored.
   *  aria-disabled, not disabled: a disabled button loses the focus, and the keyboard
   *  would be back at the page's top. */
  function dim() {
    for (const button of [resumeButton, finishButton, longerButton, submit]) {
      if (busy || waiting) button.setAttribute("aria-disabled", "true");
      else button.removeAttribute("aria-disabled");
      if (waiting) button.setAttribute("aria-describedby", waiting);
      else button.removeAttribute("aria-describedby");
    }
  }

  function setBusy(value) {
    busy = value;
    dim();
  }

  async function trainLonger() {
    if (busy || waiting) return;
    const text = input.value.trim();
    if (text === "") {
      clearFieldError();
      // A letter typed into a number field reads as "" too. The priority's refusal is said
      // beside it now, not once the step is fixed.
      showFieldErrors({
        steps: input.validity.badInput ? "Enter a whole number of steps."
          : "Enter the step to train it to.",
        priority: typedPriority(priorityField) === null ? PRIORITY_REFUSAL : "",
      });
      return;
    }
    await send({ steps: Number(text) });
  }

  /** POST /resume, with `stepsBody` ({steps}) or none (a cancelled or failed job, as it
   *  is), and the form's priority where the form is open and it differs from the job's. */
  async function send(stepsBody) {
    if (busy || waiting) return;
    clearFieldError();
    const priority = form.hidden ? job.priority : typedPriority(priorityField);
    if (priority === null) {
      say("resume", "", false);
      showFieldErrors({ priority: PRIORITY_REFUSAL });
      return;
    }
    const reprioritised = priority !== job.priority;
    const body = reprioritised ? { ...stepsBody, priority } : stepsBody;
    // Where the keyboard was: the stream may hide these controls before the answer comes.
    const focused = hasFocus();
    setBusy(true);
    say("resume", "Resuming…", false);
    // The Finish button's step, or the same typed into To step: the service ends a
    // cancelled or failed job there. Read before the answer, which the stream may beat
    // (the job queued again).
    const finishes = Boolean(stepsBody) && stepsBody.steps === latest && stoppedShort();
    const attempt = job.attempts; // a later one seen after a failure: the resume took
    const asked = mark();
    try {
      const { data } = await api(`${base}/resume`, { method: "POST", body });
      if (gone) return;
      const to = stepsBody ? ` to step ${stepsBody.steps}` : "";
      const at = reprioritised ? ` at priority ${data.priority}` : "";
      say("resume", `Resumed as attempt ${data.attempts}${at}: ${finishes
        ? `it finishes at step ${stepsBody.steps}, its latest checkpoint, with its final eval and export`
        : trainsOn(latest, to)}.`, false);
      resumed(data, asked, focused);
      close();
    } catch (error) {
      if (gone) return;
      if (error.status === 404) {
        missing();
        return;
      }
      const errors = error.errors || [];
      // A field's refusal goes beside it (where the form is open to show it); anything
      // else (a spec that no longer passes admission, a 409's detail) in the line.
      const mine = form.hidden ? [] : errors.filter((e) => Object.hasOwn(fields, e.field));
      const others = errors.filter((e) => !mine.includes(e));
      const texts = {};
      for (const e of mine) texts[e.field] = [texts[e.field], e.message].filter(Boolean).join(" ");
      showFieldErrors(texts);
      if (others.length) {
        say("resume", `Could not resume: ${others.map((e) => `${e.field}: ${e.message}`)
          .join("; ")}`, true);
      } else if (mine.length) {
        say("resume", "", false);
      } else {
        say("resume", `Could not resume: ${error.detail || error.message}`, true);
      }
      refused(error, attempt);
    } finally {
      if (!gone) setBusy(false);
    }
  }

  /** Whether the job is cancelled or failed: one that may end at its latest checkpoint. */
  function stoppedShort() {
    return job !== null && (job.state === "cancelled" || job.state === "failed");
  }

  /** Finish at step N: for a cancelled or failed job with a checkpoint to end at. */
  function showFinish() {
    const at = Number.isInteger(latest) && latest > 0 && stoppedShort();
    finishButton.hidden = !at;
    if (!at) return;
    const name = `Finish at step ${latest}`;
    if (finishButton.textContent !== name) {
      finishButton.textContent = name;
      finishButton.title = `Export the model at step ${latest}, its latest checkpoint: the job ` +
        "ends there, with its final eval and no step trained";
    }
  }

  return {
    buttons: [resumeButton, finishButton, longerButton],
    form,
    hasFocus,
    render(next) {
      job = next;
      const ended = TERMINAL.has(job.state);
      resumeButton.hidden = !stoppedShort();
      showFinish();
      longerButton.hidden = !ended;
      if (!ended && !form.hidden) close();
    },
    waitForExit(hintId) {
      waiting = hintId;
      dim();
    },
    checkpoint(step) {
      latest = step;
      showFinish();
      if (!form.hidden) showHint();
    },
    destroy() {
      gone = true;
    },
  };
}
