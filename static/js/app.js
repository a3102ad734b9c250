// The dashboard's entry: a hash router over three views, the devices panel, the token bar.
//
//   #/                 jobs table (#/?state=running filters it)
//   #/jobs/<id>        one job
//   #/submit           submit form (#/submit?preset=mnist-cnn, #/submit?from=<id>)

import { RETRY_MS, getJSON, getToken, mayPass, setToken } from "./api.js";
import { h, jobLink } from "./format.js";
import { setHostGpus } from "./host.js";
import { arrangeInPlace } from "./inplace.js";
import { mountJob } from "./job.js";
import { mountJobs } from "./jobs.js";
import { mountSubmit } from "./submit.js";

const DEVICES_POLL_MS = 5000;
// A job's start or end, or the exit of an ended job's worker (a device marked `exiting`
// until then: TensorFlow's teardown, a second or so), reads the devices again, as the view's
// event stream says so (`towerboard:devices`); a view that follows no stream of every job
// (the submit form, a running job's page) leaves it to the 5 s poll. A burst of them (a
// queue of quick jobs draining: 9 reads a second, each tab) reads them once a
// DEVICES_GAP_MS at most: one read at a time, and one more after it for whatever changed
// meanwhile.
const DEVICES_GAP_MS = 1000;
const view = document.getElementById("view");
let unmount = () => {};

/** A path segment, unescaped; as it is when its escapes are broken (a link cut short
 *  mid-`%XX`): decodeURIComponent would throw, and leave a blank view. */
function unescaped(segment) {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

// The view is no live region (its ages, ETAs and log tail tick): where a link led is said
// here instead, once, from the new page's heading, after it has had a moment to fill in.
// A page that shows a message in its place ("No job X.", its heading hidden) is said by
// that message: its hidden heading (the bare job id) is not what the page shows. A view
// whose heading waits on a read (a job's page: its name) is `aria-busy` until it has it,
// and is said once it is not: said at 400 ms alone, a read slower than that (a slow
// network, a loaded host) had the bare id said, or "nosuch" for "No job nosuch.". Busy
// again later (a read that got no answer, made again), it is said again once it is not,
// if it then shows something else: the job's name, once the read again is answered, which
// was never said (the failure's "Could not load job …" had been, and stayed).
const announcer = document.getElementById("route-announcer");
let announceTimer = null;
let announceWait = null; // the observer waiting for the view to be no longer busy
let firstRoute = true;

function announcePage() {
  clearTimeout(announceTimer);
  if (announceWait) announceWait.disconnect();
  announceWait = null;
  announcer.textContent = ""; // the same page again is a change too
  const say = () => {
    const shown = (el) => el.getClientRects().length > 0; // neither it nor a parent hidden
    const said = [...view.querySelectorAll("h1")].find(shown) ||
      [...view.querySelectorAll('[role="alert"]')].find(shown);
    const text = (said && said.textContent.trim()) || document.title;
    if (announcer.textContent !== text) announcer.textContent = text; // a failure again: once
  };
  announceTimer = setTimeout(() => {
    if (view.getAttribute("aria-busy") !== "true") say();
    // Until the next page switch (announcePage disconnects it).
    announceWait = new MutationObserver(() => {
      if (view.getAttribute("aria-busy") !== "true") say();
    });
    announceWait.observe(view, { attributes: true, attributeFilter: ["aria-busy"] });
  }, 400);
}

function route() {
  if (!firstRoute) announcePage(); // the page a browser opens is read out by the browser
  firstRoute = false;
  unmount();
  view.replaceChildren();
  view.removeAttribute("aria-busy"); // the view mounted next says whether it reads first
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, search = ""] = hash.split("?");
  const query = new URLSearchParams(search);
  let match;
  let current = "jobs";
  if ((match = path.match(/^\/jobs\/([^/]+)$/))) {
    current = "";
    unmount = mountJob(view, unescaped(match[1]));
  } else if (path === "/submit") {
    current = "submit";
    unmount = mountSubmit(view, query);
  } else {
    unmount = mountJobs(view, query);
  }
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", link.dataset.nav === current);
  }
  window.scrollTo(0, 0);
}

// --- devices panel --------------------------------------------------------------------

const devicesList = document.getElementById("devices");
const devicesNote = document.getElementById("devices-note");
let devicesReading = false; // a read is out
let devicesAgain = false; // something changed while it was out: read once more after it
let devicesReadAt = -Infinity; // Date.now() when the latest read began
let devicesSoonTimer = null;
let devicesRetryTimer = null; // a read that got no answer is made again

const EXITING_TITLE =
  "The job has ended and its worker process is exiting; the device is given out once it is gone.";
const NOT_CONFIGURED_TITLE =
  "Held by a job started before the service's settings named fewer devices; not given out again.";

/** Show who holds a device in its `holder` span: its job's link, named by the job's name
 *  with its id beside it (two jobs may share a name; `towerboard status ID` takes the
 *  id), and "exiting" once the job has ended; or "free". A link to the same job is kept,
 *  not made anew, so the keyboard's focus on it stays through every poll. */
function showHolder(holder, device) {
  if (!device.job_id) {
    holder.removeAttribute("title");
    if (!holder.querySelector(".device-free")) {
      holder.replaceChildren(h("span", { class: "muted device-free" }, "free"));
    }
    return;
  }
  let link = holder.querySelector("a");
  if (!link) {
    link = h("a", { class: "device-job-name" });
    holder.replaceChildren(link, h("span", { class: "muted device-job-id" }));
  }
  const href = jobLink({ id: device.job_id });
  if (link.getAttribute("href") !== href) link.setAttribute("href", href);
  // A service from before the devices said their jobs' names gives none: the id alone.
  const named = typeof device.job_name === "string" && device.job_name !== "";
  const name = named ? device.job_name : device.job_id;
  if (link.textContent !== name) link.textContent = name;
  const id = holder.querySelector(".device-job-id");
  const idText = named ? ` ${device.job_id}` : "";
  if (id.textContent !== idText) id.textContent = idText;
  const exiting = holder.querySelector(".device-exiting");
  if (device.exiting && !exiting) {
    holder.title = EXITING_TITLE;
    holder.append(h("span", { class: "device-exiting" }, " ", h("span", { class: "muted" }, "exiting")));
  } else if (!device.exiting && exiting) {
    holder.removeAttribute("title");
    exiting.remove();
  }
}

/** The panel's item for `device`, updated in place (keyed by `data-device`): an item whose
 *  device has not changed is left as it is, and none is taken out and put back. */
function showDevice(item, device) {
  const className = `device ${device.job_id ? "busy" : "free"}${device.exiting ? " exiting" : ""}`;
  if (item.className !== className) item.className = className;
  const holder = item.querySelector(".device-holder");
  const note = item.querySelector(".device-unconfigured");
  if (device.configured === false && !note) {
    holder.before(h("span", { class: "muted device-unconfigured", title: NOT_CONFIGURED_TITLE },
      "not configured"));
  } else if (device.configured !== false && note) note.remove();
  showHolder(holder, device);
}

function deviceItem(device) {
  return h("li", { dataset: { device: device.id } },
    h("span", { class: "device-id" }, device.id), h("span", { class: "device-holder" }));
}

/** The panel lists `devices` in their order, each item kept where it is when it may be.
 *  Any other item goes: "Loading…", an earlier failure, a device no longer listed. */
function showDevices(devices) {
  const items = new Map();
  for (const item of devicesList.children) {
    if (item.dataset.device) items.set(item.dataset.device, item);
  }
  arrangeInPlace(devicesList, devices.map((device) => {
    const item = items.get(device.id) || deviceItem(device);
    showDevice(item, device);
    return item;
  }));
}

/** Say `text` in the panel instead of its devices (one muted line). */
function devicesSay(text) {
  const [only] = devicesList.children;
  if (devicesList.children.length === 1 && !only.dataset.device && only.textContent === text) return;
  devicesList.replaceChildren(h("li", { class: "muted" }, text));
}

/** Read the devices again soon: now if none was read within DEVICES_GAP_MS, else once
 *  that long after the latest read, however many ask meanwhile. */
function refreshDevicesSoon() {
  if (devicesSoonTimer !== null) return;
  const wait = Math.max(0, devicesReadAt + DEVICES_GAP_MS - Date.now());
  devicesSoonTimer = setTimeout(() => {
    devicesSoonTimer = null;
    refreshDevices();
  }, wait);
}

async function refreshDevices() {
  if (devicesReading) {
    devicesAgain = true;
    return;
  }
  devicesReading = true;
  devicesReadAt = Date.now();
  clearTimeout(devicesSoonTimer); // this read answers for those who asked so far
  devicesSoonTimer = null;
  try {
    const devices = await getJSON("/api/v1/devices");
    showDevices(devices.data);
    const gpus = devices.data.some((d) => d.kind === "gpu");
    setHostGpus(gpus); // what a queued job waits for: GPUs, or a job slot
    const kind = gpus ? "GPU" : "CPU-only";
    const note = `${kind} host · up to ${devices.max_towers} towers a job`;
    if (devicesNote.textContent !== note) devicesNote.textContent = note;
  } catch (error) {
    // No answer (a lossy network, the service restarting) or a server error, with devices
    // shown: they stay, the note says they are not up to date, and the read is made again
    // in RETRY_MS, as the jobs list's is. One lost read replaced them with "Unavailable"
    // until the next poll. Refused for want of a token, they are not unavailable: the
    // token bar asks for it, and the jobs view says so.
    const shown = devicesList.querySelector("[data-device]") !== null;
    if (mayPass(error) && shown) {
      devicesNote.textContent = `Not up to date: ${error.message}`;
      clearTimeout(devicesRetryTimer);
      devicesRetryTimer = setTimeout(refreshDevicesSoon, RETRY_MS);
    } else {
      devicesSay(error.status === 401 ? "—" : `Unavailable: ${error.message}`);
      devicesNote.textContent = "";
    }
  } finally {
    devicesReading = false;
    if (devicesAgain) {
      devicesAgain = false;
      refreshDevicesSoon();
    }
  }
}

// --- token ----------------------------------------------------------------------------

const tokenBar = document.getElementById("token-bar");
const tokenInput = document.getElementById("token-input");
const tokenToggle = document.getElementById("token-toggle");
const tokenMessage = document.getElementById("token-message");

// Every 401 (the devices and log polls keep making them) asks for the token, but the bar
// takes the focus only when it opens, and once the user has closed it only the Token
// button opens it again.
let dismissed = false;

function showTokenBar() {
  tokenToggle.hidden = false;
  if (!tokenBar.hidden) return;
  tokenBar.hidden = false;
  // Opened by a poll's 401 (the token changed under the page), it took the focus from the
  // field being typed in, and what was typed next went into the token field: the focus
  // moves only from where nothing is typed.
  const active = document.activeElement;
  const typing = active && (active.isContentEditable ||
    (active.matches("input, textarea") && !active.readOnly && active !== tokenInput));
  if (!typing) tokenInput.focus();
}

function closeTokenBar() {
  dismissed = true;
  tokenBar.hidden = true;
}

window.addEventListener("towerboard:unauthorized", () => {
  tokenMessage.textContent = getToken() ? "That token was refused." : "";
  tokenToggle.classList.add("refused");
  if (dismissed) tokenToggle.hidden = false;
  else showTokenBar();
});
tokenToggle.addEventListener("click", () => {
  if (!tokenBar.hidden) closeTokenBar();
  else {
    dismissed = false;
    showTokenBar();
  }
});
// Escape closes it as the Token button does, and the keyboard goes on from that button.
tokenBar.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  event.preventDefault();
  closeTokenBar();
  tokenToggle.focus();
});
tokenBar.addEventListener("submit", (event) => {
  event.preventDefault();
  setToken(tokenInput.value);
  tokenInput.value = "";
  tokenMessage.textContent = "";
  tokenBar.hidden = true;
  tokenToggle.hidden = false;
  tokenToggle.classList.remove("refused");
  dismissed = false;
  refreshDevices();
  route();
});
document.getElementById("token-forget").addEventListener("click", () => {
  setToken("");
  tokenMessage.textContent = "Token forgotten.";
});
if (getToken()) {
  tokenToggle.hidden = false;
  setToken(getToken()); // refresh the cookie, which may have expired with the session
}

// "Skip to content", the first stop of the keyboard: the focus goes to the view, and the
// next Tab to its first control, past the top bar's links. Not by its href: the address's
// hash is the router's ("#view" would open the jobs list). The view takes the focus only
// then (no tabindex of its own, so a click on it leaves the focus where it was).
document.getElementById("skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  view.tabIndex = -1;
  view.focus();
});
view.addEventListener("blur", () => view.removeAttribute("tabindex"));

window.addEventListener("hashchange", route);
route();
refreshDevices();
setInterval(refreshDevices, DEVICES_POLL_MS);
// Who holds which device may have changed: a job started or stopped holding devices, or an
// ended job's worker has exited (jobs.js fires this only then, and as its stream
// (re)connects; a job's page at each change of its job's state, and while its job has
// ended, at any job's `exited` and as its stream of every job (re)connects).
window.addEventListener("towerboard:devices", refreshDevicesSoon);
