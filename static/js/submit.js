// The submit form: a preset or another job's spec as editable JSON; the service's 422
// field errors are listed beside it. What the editor holds is kept in sessionStorage until
// the job is submitted, and comes back when the form is opened again. The user's own
// edit is kept apart, as the "Draft" start: picking a preset or another job's spec after
// editing never throws the edit away; picking "Draft" brings it back.

import { api, getJSON } from "./api.js";
import { dim, dimmed, h, jobLink, withCode } from "./format.js";
import { PRESETS } from "./presets.js";

const DRAFT_KEY = "towerboard.draft"; // what the editor holds
const EDIT_KEY = "towerboard.edit"; // the user's last edit: the "Draft" start
const FROM_KEY = "towerboard.from"; // {id, text}: the last job spec loaded to edit

function stored(key) {
  return sessionStorage.getItem(key);
}

function storedFrom() {
  try {
    const from = JSON.parse(stored(FROM_KEY) || "null");
    return from && typeof from.id === "string" && typeof from.text === "string" ? from : null;
  } catch {
    return null;
  }
}

/** Where JSON.parse stopped, as an offset into `text`, from its message; null if it
 *  does not say. */
export function parseErrorOffset(message, text) {
  const position = message.match(/position (\d+)/);
  if (position) return Math.min(Number(position[1]), text.length);
  const lineColumn = message.match(/line (\d+) column (\d+)/);
  if (!lineColumn) return null;
  const lines = text.split("\n").slice(0, Number(lineColumn[1]) - 1);
  const start = lines.reduce((n, line) => n + line.length + 1, 0);
  return Math.min(start + Number(lineColumn[2]) - 1, text.length);
}

export function mountSubmit(view, query) {
  // Besides the presets, two starts that are no preset: "Draft" (the user's edit) and
  // "From job <id>" (Edit & resubmit); each is listed once there is one.
  const draftOption = h("option", { value: "draft", hidden: true }, "Draft");
  const fromOption = h("option", { value: "from", hidden: true });
  let editText = stored(EDIT_KEY);
  let fromText = "";
  const select = h("select", { id: "preset" }, draftOption, fromOption,
    PRESETS.map((preset) => h("option", { value: preset.id }, preset.label)));
  const editor = h("textarea", {
    id: "spec", spellcheck: "false", autocomplete: "off", rows: "24", "aria-label": "Job spec (JSON)",
  });
  const submit = h("button", { type: "submit", class: "primary", id: "submit-job" }, "Submit job");
  const errors = h("div", { class: "form-errors", id: "form-errors", role: "alert", hidden: true });
  const form = h("form", { class: "submit-form", novalidate: true },
    h("div", { class: "form-main" },
      h("label", { class: "field" }, h("span", {}, "Start from"), select),
      h("label", { class: "field grow" }, h("span", {}, "Job spec (JSON)"), editor),
      h("div", { class: "form-actions" }, submit,
        h("span", { class: "muted small" }, "Unknown keys are errors. Every field is in ",
          h("a", { href: "/docs#/jobs/create_job_api_v1_jobs_post", target: "_blank", rel: "noopener" },
            "the API docs"), "."))),
    h("div", { class: "form-side" }, errors,
      h("div", { class: "help muted small" },
        h("p", {}, "towers: devices the global batch is split across; batch_size is global."),
        h("p", {}, "Give steps or epochs, not both."),
        h("p", {}, "data.path must be inside the service's data roots."))));

  view.append(h("div", { class: "view-head" }, h("h1", {}, "Submit a job")), form);
  let stopped = false; // the form has been left

  const presetText = (preset) => JSON.stringify(preset.spec, null, 2);

  function setEditor(text) {
    editor.value = text;
    sessionStorage.setItem(DRAFT_KEY, text);
    clearErrors();
  }

  function showDraftOption() {
    draftOption.hidden = editText === null;
  }

  function usePreset(id) {
    const preset = PRESETS.find((p) => p.id === id) || PRESETS[0];
    select.value = preset.id;
    setEditor(presetText(preset));
  }

  function useEdit() {
    select.value = "draft";
    setEditor(editText ?? "");
  }

  function useFrom(id, text) {
    fromOption.textContent = `From job ${id}`;
    fromOption.hidden = false;
    fromText = text;
    select.value = "from";
    setEditor(text);
  }

  /** What the editor held last (under its start's name), else the first preset. */
  function restore() {
    const text = stored(DRAFT_KEY);
    const preset = text !== null && PRESETS.find((p) => presetText(p) === text);
    const earlier = storedFrom();
    if (preset) usePreset(preset.id);
    else if (text !== null && earlier && earlier.text === text) useFrom(earlier.id, text);
    else if (text !== null) {
      editText = text;
      showDraftOption();
      useEdit();
    } else usePreset(PRESETS[0].id);
  }

  function clearErrors() {
    errors.hidden = true;
    errors.replaceChildren();
  }

  function showErrors(detail, list) {
    errors.hidden = false;
    errors.replaceChildren(h("p", { class: "form-errors-detail" }, h("strong", {}, detail)),
      list.length ? h("ul", {}, list.map((e) => h("li", { dataset: { field: e.field } },
        h("code", { class: "field-name" }, e.field), " ", withCode(e.message)))) : "");
  }

  select.addEventListener("change", () => {
    if (select.value === "draft") useEdit();
    else if (select.value === "from") setEditor(fromText);
    else usePreset(select.value);
  });
  editor.addEventListener("input", () => {
    // Typed into: the editor now holds the user's draft, whatever it started from.
    editText = editor.value;
    sessionStorage.setItem(EDIT_KEY, editText);
    sessionStorage.setItem(DRAFT_KEY, editText);
    showDraftOption();
    select.value = "draft";
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (dimmed(submit)) return; // submitted, and not answered yet
    clearErrors();
    const text = editor.value;
    try {
      JSON.parse(text); // said here, with the caret where it broke; sent as it is below
    } catch (error) {
      showErrors("The spec is not valid JSON.", [{ field: "(json)", message: error.message }]);
      // The caret goes where parsing stopped (Chromium and Firefox say "position N" or
      // "line L column C"), so a long spec's typo is found without counting.
      const at = parseErrorOffset(error.message, editor.value);
      if (at !== null) {
        editor.focus();
        editor.setSelectionRange(at, at);
      }
      return;
    }
    dim(submit, true);
    submit.textContent = "Submitting…";
    try {
      // The text as typed: parsed and sent again, a key given twice would lose a value
      // silently (JSON.parse keeps the last); the service names it instead.
      const { data: job } = await api("/api/v1/jobs", { method: "POST", json: text });
      // Submitted: the job's page has it, and Edit & resubmit brings it back.
      for (const key of [DRAFT_KEY, EDIT_KEY, FROM_KEY]) sessionStorage.removeItem(key);
      // Left meanwhile (a slow answer), the page the user went to stays: it took them off
      // it to the job's page. The job is in the jobs list.
      if (!stopped) location.hash = jobLink(job);
    } catch (error) {
      showErrors(error.status === 422 ? "The service rejected this spec:" : error.detail,
        error.errors || []);
    } finally {
      dim(submit, false);
      submit.textContent = "Submit job";
    }
  });

  const from = query.get("from");
  showDraftOption();
  if (from) {
    fromOption.textContent = `From job ${from}`;
    fromOption.hidden = false;
    // This form again (a reload, Back from another page: the same history entry, marked
    // below), after the editor was changed: it shows what it held, as the form without
    // `from` does, and the job's spec stays a start to pick; the edit went under "Draft",
    // out of sight. A new Edit & resubmit (a new entry) starts from the job's spec.
    const again = history.state && history.state.towerboardFrom === from;
    history.replaceState({ ...history.state, towerboardFrom: from }, "");
    const earlier = storedFrom();
    const held = stored(DRAFT_KEY);
    if (again && earlier && earlier.id === from && held !== null && held !== earlier.text) {
      fromText = earlier.text;
      restore();
    } else {
      select.value = "from";
      editor.value = "Loading…";
    }
    getJSON(`/api/v1/jobs/${encodeURIComponent(from)}`).then((job) => {
      const text = JSON.stringify(job.spec, null, 2);
      if (stopped) return;
      sessionStorage.setItem(FROM_KEY, JSON.stringify({ id: from, text }));
      if (select.value === "from") useFrom(from, text);
      else fromText = text; // another start was picked, or typed into, meanwhile: keep it
    }).catch((error) => {
      if (stopped) return;
      fromOption.hidden = true;
      if (select.value === "from") restore();
      showErrors(`Could not load job ${from}: ${error.message}`, []);
    });
  } else if (query.has("preset")) {
    usePreset(query.get("preset"));
  } else {
    restore();
  }
  return () => {
    stopped = true;
  };
}
