// What the service gives its jobs, as the devices panel (app.js) last read it: whole GPUs,
// one a tower, or on a CPU-only host job slots, one a job whatever its towers. A queued
// job's Devices say what it waits for in those units, as its queue line and `towerboard
// status ID` do; a view redraws them at `towerboard:host`, fired when it is first known
// (the devices are read as the page opens, beside the view's own first read) and if it
// changes (the service restarted with other settings).

let gpus = null; // unknown until the devices are read

/** True on a GPU host, false on a CPU-only one, null until known. */
export function hostGpus() {
  return gpus;
}

export function setHostGpus(value) {
  if (value === gpus) return;
  gpus = value;
  window.dispatchEvent(new CustomEvent("towerboard:host"));
}
