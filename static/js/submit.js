// The submit form: a preset or another job's spec as editable JSON; the service's 422
// field errors are listed beside it. What the editor holds is kept as a draft in
// sessionStorage until the job is submitted, and comes back when the form is opened again.

import { api, getJSON } from "./api.js";
import { h, jobLink } from "./format.js";
import { PRESETS } from "./presets.js";

const DRAFT_KEY = "towerboard.draft";

export function mountSubmit(view, query) {
  // "Draft" or "From job <id>": a start that is no preset; picking it again brings back
  // the text it started with.
  const custom = h("option", { value: "", hidden: true });
  let customText = "";
  const select = h("select", { id: "preset", "aria-label": "Preset" }, custom,
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
    h("aside", { class: "form-side" }, errors,
      h("div", { class: "help muted small" },
        h("p", {}, "towers: devices the global batch is split across; batch_size is global."),
        h("p", {}, "Give steps or epochs, not both."),
        h("p", {}, "data.path must be inside the service's data roots."))));

  view.append(h("div", { class: "view-head" }, h("h1", {}, "Submit a job")), form);

  const presetText = (preset) => JSON.stringify(preset.spec, null, 2);

  function setEditor(text) {
    editor.value = text;
    sessionStorage.setItem(DRAFT_KEY, text);
    clearErrors();
  }

  function usePreset(id) {
    const preset = PRESETS.find((p) => p.id === id) || PRESETS[0];
    select.value = preset.id;
    setEditor(presetText(preset));
  }

  function useCustom(label, text) {
    custom.textContent = label;
    custom.hidden = false;
    customText = text;
    select.value = "";
    setEditor(text);
  }

  /** The draft if there is one (under its preset's name if it is one unchanged), else
   *  the first preset. */
  function useDraft() {
    const draft = sessionStorage.getItem(DRAFT_KEY);
    const preset = draft && PRESETS.find((p) => presetText(p) === draft);
    if (preset) usePreset(preset.id);
    else if (draft) useCustom("Draft", draft);
    else usePreset(PRESETS[0].id);
  }

  function clearErrors() {
    errors.hidden = true;
    errors.replaceChildren();
  }

  function showErrors(detail, list) {
    errors.hidden = false;
    errors.replaceChildren(h("p", { class: "form-errors-detail" }, h("strong", {}, detail)),
      list.length ? h("ul", {}, list.map((e) => h("li", { dataset: { field: e.field } },
        h("code", { class: "field-name" }, e.field), " ", e.message))) : "");
  }

  select.addEventListener("change", () => {
    if (select.value) usePreset(select.value);
    else setEditor(customText);
  });
  editor.addEventListener("input", () => sessionStorage.setItem(DRAFT_KEY, editor.value));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    let body;
    try {
      body = JSON.parse(editor.value);
    } catch (error) {
      showErrors("The spec is not valid JSON.", [{ field: "(json)", message: error.message }]);
      return;
    }
    submit.disabled = true;
    submit.textContent = "Submitting…";
    try {
      const { data: job } = await api("/api/v1/jobs", { method: "POST", body });
      sessionStorage.removeItem(DRAFT_KEY);
      location.hash = jobLink(job);
    } catch (error) {
      showErrors(error.status === 422 ? "The service rejected this spec:" : error.message,
        error.errors || []);
    } finally {
      submit.disabled = false;
      submit.textContent = "Submit job";
    }
  });

  const from = query.get("from");
  let stopped = false;
  if (from) {
    custom.textContent = `From job ${from}`;
    custom.hidden = false;
    select.value = "";
    editor.value = "Loading…";
    getJSON(`/api/v1/jobs/${encodeURIComponent(from)}`).then((job) => {
      const text = JSON.stringify(job.spec, null, 2);
      if (stopped) return;
      if (select.value === "") useCustom(`From job ${from}`, text);
      else customText = text; // a preset was picked meanwhile: keep it
    }).catch((error) => {
      if (stopped || select.value !== "") return;
      custom.hidden = true;
      useDraft();
      showErrors(`Could not load job ${from}: ${error.message}`, []);
    });
  } else if (query.has("preset")) {
    usePreset(query.get("preset"));
  } else {
    useDraft();
  }
  return () => {
    stopped = true;
  };
}
