// Line charts of metric series over steps, drawn with the vendored uPlot (static/vendor/).
//
// To assistive technology a chart is a figure named by its caption, holding a line of text
// that says each series' latest value (and its first); its plot is an image named by its
// caption too, reached by Tab to zoom and pan its steps from the keyboard (zoomKey). Its
// legend is a row of toggle buttons, one a series (uPlot's own, a table that a click
// alone toggled, is not made), and "Reset zoom" shows beside it while the steps are zoomed.
// A finger's (or a pen's) drag across the plot zooms its steps as the mouse's does
// (touchDown).

import { h } from "./format.js";

const HEIGHT = 190;
// A chart draws at most about 2 × THIN_BUCKETS points a series, whatever a job reported: a
// job of 200k steps reports some 100k points a series, and uPlot took seconds to draw them
// (the page froze at every progress event). See thin().
const THIN_BUCKETS = 600;
// A dot on each point only while the points in view are this few: dense, they are a band.
const MAX_DOTS = 300;
// Steps are whole numbers: the step axis never ticks between them.
const STEP_INCRS = [1, 2, 5].flatMap((m) => Array.from({ length: 10 }, (_, e) => m * 10 ** e))
  .sort((a, b) => a - b);
// The axes' labels are measured, so they fit however long they grow. At uPlot's fixed sizes
// a job in the millions of steps drew "9,200,000" over "9,300,000" and cut its last label
// at the right edge, and a loss near 1e-5 drew "0.000005" as "000005".
const STEP_LABEL = new Intl.NumberFormat().format; // as uPlot writes numbers
const LABEL_GAP = 12; // px, at least, between two step labels
const VALUE_AXIS_MIN = 56; // px: the value axes of most charts line up
const RIGHT_PAD_MIN = 25; // px: uPlot's own, past the plot's right edge
// A log value axis labels a power of ten at least every this many px (a label is about 12).
const LOG_LABEL_SPACE = 18;
// Where a chart's scale ("log" or "linear") is remembered, per chart (data-chart: "loss").
const SCALE_KEY = "towerboard.chart-scale.";
// The keys' zoom: a press of + halves the span of steps shown (− doubles it), never to
// fewer than MIN_ZOOM_STEPS; ← and → move it by PAN_FRACTION of itself.
const MIN_ZOOM_STEPS = 4;
const PAN_FRACTION = 0.25;
// A finger's drag narrower than this zooms nothing: a tap wobbles by a pixel or two.
const MIN_TOUCH_DRAG_PX = 10;

// The charts on the page, drawn again in the other scheme's colours when the browser's
// changes (the canvas keeps the colours it was drawn in; app.css sets --chart-* per scheme).
const shown = new Set();
window.matchMedia?.("(prefers-color-scheme: dark)").addEventListener("change", () => {
  for (const chart of shown) chart.restyle();
});

/** The colour app.css gives custom property `name` ("--chart-grid") in the scheme the page
 *  is in now. */
export function themeColour(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

/** Whether chart `kind` was last set to a log scale (false where storage is refused). */
function storedLog(kind) {
  try {
    return localStorage.getItem(SCALE_KEY + kind) === "log";
  } catch {
    return false;
  }
}

function storeLog(kind, log) {
  try {
    localStorage.setItem(SCALE_KEY + kind, log ? "log" : "linear");
  } catch {
    // Not remembered (storage refused): the page still switches.
  }
}

/** How wide `text` is drawn in axis `axisIdx`'s font, in CSS pixels. */
function labelWidth(u, axisIdx, text) {
  u.ctx.font = u.axes[axisIdx].font[0]; // scaled by the pixel ratio, as uPlot draws it
  return u.ctx.measureText(text).width / uPlot.pxRatio; // eslint-disable-line no-undef
}

/** The step axis's widest label between `min` and `max` (steps are not negative). */
function widestStep(u, min, max) {
  return Math.max(...[min, max].map((v) => (Number.isFinite(v) ? labelWidth(u, 0, STEP_LABEL(v)) : 0)));
}

/** The step axis's span. With every point at one step (a job's first report), uPlot
 *  spans 0 to twice the step (0–600 for step 300), which says nothing, and it hands that
 *  span here rather than the step: so it is read from the data. Centred on the step, a
 *  round half-decade either side (250–350), never below step 0. */
export function stepRange(u, min, max) {
  const steps = u.data[0];
  if (!steps || steps.length !== 1) return [min, max];
  const step = steps[0];
  const pad = Math.max(1, 10 ** Math.floor(Math.log10(Math.max(1, step))) / 2);
  const low = Math.max(0, step - pad);
  return [low, low + 2 * pad];
}

/** Series that share the x axis (steps) but not their steps (train vs eval) are joined
 *  on the union of steps, with null where a series has no point; lines span the gaps. */
export function align(keys, seriesMap) {
  const lists = keys.map((key) => seriesMap[key] || []);
  // Each list in step order (as the page keeps them): one merge, no sort of every step.
  const ordered = lists.every((list) =>
    list.every((point, i) => i === 0 || list[i - 1].step < point.step));
  if (!ordered) {
    const steps = new Set();
    const byKey = lists.map((list) => {
      const points = new Map();
      for (const point of list) {
        points.set(point.step, point.value);
        steps.add(point.step);
      }
      return points;
    });
    const xs = [...steps].sort((a, b) => a - b);
    return [xs, ...byKey.map((points) => xs.map((x) => (points.has(x) ? points.get(x) : null)))];
  }
  const xs = [];
  const ys = lists.map(() => []);
  const at = lists.map(() => 0); // each list's next point
  for (;;) {
    let step = Infinity;
    for (let k = 0; k < lists.length; k++) {
      if (at[k] < lists[k].length) step = Math.min(step, lists[k][at[k]].step);
    }
    if (step === Infinity) break;
    xs.push(step);
    for (let k = 0; k < lists.length; k++) {
      const next = lists[k][at[k]];
      ys[k].push(next !== undefined && next.step === step ? lists[k][at[k]++].value : null);
    }
  }
  return [xs, ...ys];
}

/** What a chart says in words: each series' latest value and its first, with their steps
 *  ("train 0.0001 at step 2900 (first 1.23 at step 1); eval 0.0008 at step 2000"); a
 *  series with no point is left out, and "" when none has one. `data` is aligned (align). */
export function summarize(series, data, format) {
  const steps = data[0];
  const parts = [];
  series.forEach((s, k) => {
    const ys = data[k + 1];
    let first = -1;
    let last = -1;
    for (let i = 0; i < ys.length; i++) {
      if (ys[i] === null || ys[i] === undefined) continue;
      if (first < 0) first = i;
      last = i;
    }
    if (last < 0) return;
    let text = `${s.label} ${format(ys[last])} at step ${steps[last]}`;
    if (first !== last) text += ` (first ${format(ys[first])} at step ${steps[first]})`;
    parts.push(text);
  });
  return parts.length ? `${parts.join("; ")}.` : "";
}

/** `data` (aligned) with at most about 2 × `buckets` points a series: the steps are cut
 *  into `buckets` equal spans, and in each a series keeps its lowest and its highest point
 *  (a spike stays, as a chart of every point would show it), and its first and last point
 *  overall (its line ends where the job is). A point kept for one series keeps the other
 *  series' values at that step too: every value drawn is a reported one. Fewer points than
 *  that come back as they are. */
export function thin(data, buckets = THIN_BUCKETS) {
  const kept = keptIndices(data, buckets);
  return kept ? data.map((column) => kept.map((i) => column[i])) : data;
}

/** `points` ({step, value}, in step order: one series as the job page holds it) thinned
 *  as thin() thins a chart's, to at most about 2 × `buckets` of them, in step order; the
 *  points kept are the very objects given. Fewer than that come back as they are. */
export function thinPoints(points, buckets) {
  const kept = keptIndices([points.map((p) => p.step), points.map((p) => p.value)], buckets);
  return kept ? kept.map((i) => points[i]) : points;
}

/** The indices of the steps thin() keeps of `data`, in order; null when it keeps all. */
function keptIndices(data, buckets) {
  const xs = data[0];
  const n = xs.length;
  if (n <= 2 * buckets) return null;
  const low = xs[0];
  const span = xs[n - 1] - low || 1;
  const keep = new Uint8Array(n);
  for (const ys of data.slice(1)) {
    let bucket = -1;
    let lo = -1;
    let hi = -1;
    let first = -1;
    let last = -1;
    for (let i = 0; i < n; i++) {
      const y = ys[i];
      if (y === null || y === undefined) continue;
      if (first < 0) first = i;
      last = i;
      const b = Math.min(buckets - 1, Math.floor(((xs[i] - low) / span) * buckets));
      if (b !== bucket) {
        if (lo >= 0) keep[lo] = keep[hi] = 1;
        bucket = b;
        lo = hi = i;
      } else if (y < ys[lo]) lo = i;
      else if (y > ys[hi]) hi = i;
    }
    if (lo >= 0) keep[lo] = keep[hi] = keep[first] = keep[last] = 1;
  }
  const kept = [];
  for (let i = 0; i < n; i++) if (keep[i]) kept.push(i);
  return kept;
}

/** What the pointer at step index `idx` of `data` (aligned) is over, a line each: "step
 *  1,500", then each series at its nearest point `idxs[k + 1]` (uPlot's cursor), with that
 *  point's step where it is not `idx`'s ("eval 0.019 at 1,000"), but those whose keys are
 *  in `hidden` (toggled off in the legend); none with no index (the pointer has left). */
export function readoutLines(series, data, idx, idxs, hidden = new Set()) {
  if (idx === null || idx === undefined || !data[0] || data[0][idx] === undefined) return [];
  const steps = data[0];
  const lines = [`step ${STEP_LABEL(steps[idx])}`];
  series.forEach((s, k) => {
    if (hidden.has(s.key)) return;
    const i = idxs ? idxs[k + 1] : idx;
    const v = i === null || i === undefined ? null : data[k + 1][i];
    if (v === null || v === undefined) return;
    lines.push(`${s.label} ${pointText(v)}${i === idx ? "" : ` at ${STEP_LABEL(steps[i])}`}`);
  });
  return lines;
}

/** A value as the readout says it: five significant digits, and a small one (a loss near
 *  1e-6) as 1.1418e-6, not 0.0000011418, which is read by counting its zeros. */
function pointText(v) {
  return v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential(4).replace(/\.?0+e/, "e") : valueText(v);
}

/** A log axis's label: as the readout writes a value (0.01, 1, 10; 1e-4, 2e-7 below 1e-3). */
export function logTickText(v) {
  return v < 1e-3 ? v.toExponential(0) : Number(v.toPrecision(4)).toString();
}

/** Which of a log axis's `splits` (uPlot's 1 to 9 times each power of ten in view, from
 *  one power to another) it labels, the rest null: each power of ten, or every 2nd, 3rd...
 *  down from the top where the decades are too short for a label each, and 2 and 5 as
 *  well in a decade tall enough for them. Its grid lines and ticks are these too: at
 *  every split, eight decades were a grey wash. */
function logLabelled(u, splits, axisIdx) {
  const scale = u.axes[axisIdx].scale;
  const decade = Math.abs(u.valToPos(1, scale) - u.valToPos(10, scale)) || 1; // CSS px
  const every = Math.ceil(LOG_LABEL_SPACE / decade);
  const mids = decade >= 3 * LOG_LABEL_SPACE;
  const top = Math.round(Math.log10(u.scales[scale].max));
  return splits.map((v) => {
    if (v === null || !(v > 0)) return null;
    const e = Math.floor(Math.log10(v) + 1e-9);
    const m = Math.round(v / 10 ** e); // 1 to 9
    if (m === 1) return (top - e) % every === 0 ? v : null;
    return mids && (m === 2 || m === 5) ? v : null;
  });
}

/** A log axis's span: from the power of ten at or below the least value to the one at or
 *  above the greatest (1e-7 to 10 for a loss from 5e-7 to 2), so that its ends are labelled;
 *  uPlot's own began at the least value (5e-7), unlabelled. 0.1 to 1 with no value drawn. */
function logRange(u, min, max) {
  if (!(min > 0) || !(max > 0)) return [0.1, 1];
  return uPlot.rangeLog(min, max, 10, true); // eslint-disable-line no-undef
}

/** `data` (aligned) as a log scale draws it: a value at or below 0 has no place on it, so
 *  it is not drawn (null: the line spans it as it spans an eval's missing steps), rather
 *  than clamped to a floor that would read as a value. The chart says how many (update). */
export function positiveOnly(data) {
  return data.map((column, k) =>
    k === 0 ? column : column.map((y) => (y === null || y === undefined || y > 0 ? y : null)));
}

/** A value as the legend and the summary say it: five significant digits. */
function valueText(v) {
  return v === null || v === undefined ? "—" : Number(v.toPrecision(5)).toString();
}

/** Where key `key` takes the span of steps shown, [min, max], within the data's [lo, hi]:
 *  "+" ("=" unshifted) halves it about its middle, "-" doubles it, ← and → move it by a
 *  quarter of itself, Home and End to the data's first and last step, "0" shows every step;
 *  each kept within [lo, hi], and at least MIN_ZOOM_STEPS wide. null: not a key of the
 *  zoom's, or one that would change nothing (← at the first step, say). */
export function zoomKey(key, [min, max], [lo, hi]) {
  const span = max - min;
  const fit = (a, b) => {
    const width = Math.min(hi - lo, Math.max(MIN_ZOOM_STEPS, b - a));
    const start = Math.min(Math.max(lo, a), hi - width);
    return [start, start + width];
  };
  let next = null;
  if (key === "+" || key === "=") next = fit(min + span / 4, max - span / 4);
  else if (key === "-") next = fit(min - span / 2, max + span / 2);
  else if (key === "ArrowLeft") next = fit(min - span * PAN_FRACTION, max - span * PAN_FRACTION);
  else if (key === "ArrowRight") next = fit(min + span * PAN_FRACTION, max + span * PAN_FRACTION);
  else if (key === "Home") next = fit(lo, lo + span);
  else if (key === "End") next = fit(hi - span, hi);
  else if (key === "0") next = [lo, hi];
  return next && (next[0] !== min || next[1] !== max) ? next : null;
}

export class LineChart {
  /** `series`: [{key, label, stroke, dash?}] read from the map given to update(); `stroke`
   *  names the CSS custom property of its colour ("--chart-train"), so it follows the scheme.
   *  `logScale`: it has a Log scale switch (a chart of a value that falls by decades, as a
   *  loss does: on a linear axis a loss from 2 to 5e-7 lay on the floor after its first few
   *  hundred steps), remembered per chart in localStorage; `yRange` is for its linear scale. */
  constructor(container, {
    title, series, yDigits = 4, yRange = null, logScale = false, describedBy = null,
  }) {
    this.series = series;
    this.yDigits = yDigits;
    this.yRange = yRange;
    this.kind = title.toLowerCase();
    this.log = logScale && storedLog(this.kind);
    this.plot = null;
    this.points = 0;
    this.drawn = null; // the data drawn (thinned), every value as reported
    this.hidden = new Set(); // the keys of the series toggled off in the legend
    this.zoom = null; // {min, max}: the steps shown, while zoomed in on them
    // Named by its caption (a figure is); the plot, canvas and legend, is for the eye only:
    // the summary says it in words, changed only when a value it says changes (not a live
    // region: a running job's charts change every report).
    this.root = h("figure", { class: "chart", dataset: { chart: this.kind, points: "0" } },
      h("figcaption", {}, title));
    // A checkbox by the caption: reached by Tab, switched by Space, and named by its label.
    if (logScale) {
      this.logBox = h("input", { type: "checkbox", class: "chart-scale-box" });
      this.logBox.checked = this.log;
      this.logBox.addEventListener("change", () => this.setLog(this.logBox.checked));
      this.root.append(h("label", { class: "chart-scale small muted" }, this.logBox, "Log scale"));
    }
    this.root.dataset.scale = this.log ? "log" : "linear";
    // The plot: an image to assistive technology (its canvas says nothing), named by the
    // caption and described by the page's line on the keys (describedBy); reached by Tab
    // for them (the keys move nothing else: Tab leaves it as it came).
    this.canvas = h("div", { class: "chart-plot", role: "img", tabindex: "0",
      "aria-label": `${title} plot`, "aria-describedby": describedBy,
      "aria-keyshortcuts": "+ - ArrowLeft ArrowRight Home End 0" });
    this.canvas.addEventListener("keydown", (event) => this.zoomKeyDown(event));
    // uPlot's drag answers the mouse alone: a finger on a phone selected nothing. Its
    // plot area's `touch-action: pan-y pinch-zoom` (app.css) leaves an up-or-down swipe to
    // the page, which scrolls (and cancels the pointer), and gives a sideways one here.
    this.touch = null; // {id, from}: the pointer dragging, and where it went down (px)
    this.canvas.addEventListener("pointerdown", (event) => this.touchDown(event));
    this.canvas.addEventListener("pointermove", (event) => this.touchMove(event));
    for (const type of ["pointerup", "pointercancel"]) {
      this.canvas.addEventListener(type, (event) => this.touchUp(event));
    }
    // The legend: a toggle button a series, its line's colour and dash beside its name.
    this.keys = this.series.map((s) => {
      const key = h("button", { type: "button", class: "chart-key", "aria-pressed": "true",
        dataset: { series: s.key } },
      h("span", { class: "chart-key-line", "aria-hidden": "true",
        style: `border-top-color: var(${s.stroke}); border-top-style: ${s.dash ? "dashed" : "solid"}` }),
      s.label);
      key.addEventListener("click", () => this.toggle(s.key));
      return key;
    });
    // While zoomed: which steps are shown (said as it changes: a key press, a drag) and
    // the button that shows them all again (as a double-click on the plot does).
    this.zoomText = h("span", { class: "chart-zoom-text", role: "status" });
    this.resetButton = h("button", { type: "button", class: "chart-reset link", hidden: true },
      "Reset zoom");
    this.resetButton.addEventListener("click", () => this.resetZoom());
    this.legend = h("div", { class: "chart-legend", hidden: true },
      h("span", { class: "chart-keys" }, this.keys),
      h("span", { class: "chart-zoom small" }, this.zoomText, this.resetButton));
    this.root.append(
      this.canvas,
      this.legend,
      (this.summary = h("p", { class: "chart-summary visually-hidden" })),
      (this.empty = h("p", { class: "chart-empty muted" }, "No data yet")),
      (this.single = h("p", { class: "chart-note muted small", hidden: true })),
      (this.unplotted = h("p", { class: "chart-unplotted muted small", hidden: true })));
    container.append(this.root);
    // What the pointer is over: the step and each series' value there (its nearest point,
    // with its own step where that is another), beside the pointer in the plot, as
    // TensorBoard shows it; hidden while the pointer is elsewhere. For the eye only, as the
    // plot is (the summary says the values in words). The legend says none (it jumped as
    // they changed), and without this a value could only be guessed from the axis.
    this.readout = h("div", { class: "chart-readout small", hidden: true });
    this.resizer = new ResizeObserver(() => {
      if (this.plot) this.plot.setSize({ width: this.width(), height: HEIGHT });
    });
    this.resizer.observe(this.root);
    shown.add(this);
  }

  /** uPlot's options for the scale the chart is on now (a plot's scale is fixed when it is
   *  made: setLog makes a new one). */
  plotOptions() {
    const yDigits = this.yDigits;
    const valueAxis = this.log
      ? {
          values: (u, ticks) => {
            const labels = ticks.map((v) => (v === null ? null : logTickText(v)));
            this.noteTicks(labels);
            return labels;
          },
          filter: logLabelled,
        }
      : {
          values: (u, ticks) => {
            const labels = ticks.map((v) => Number(v.toPrecision(yDigits)).toString());
            this.noteTicks(labels);
            return labels;
          },
        };
    const y = this.log ? { distr: 3, log: 10, range: logRange }
      : this.yRange ? { range: this.yRange } : {};
    // The scheme's colours, as the plot is made (restyle() makes it again when they change).
    const axis = themeColour("--chart-axis");
    const grid = themeColour("--chart-grid");
    const tick = themeColour("--chart-tick");
    const dotFill = themeColour("--panel");
    return {
      width: this.width(),
      height: HEIGHT,
      legend: { show: false }, // the chart's own, of buttons (the constructor)
      // The pointer finds each series' nearest point, past the steps where it has none (an
      // eval series has a point every `eval.every_steps` alone).
      cursor: { drag: { x: true, y: false }, hover: { skip: [null, undefined] } },
      scales: { x: { time: false, range: stepRange }, y },
      // Half the last step label goes past the plot's right edge.
      padding: [null, (u) => Math.max(RIGHT_PAD_MIN,
        Math.ceil(widestStep(u, u.scales.x.min, u.scales.x.max) / 2) + 2), null, null],
      axes: [
        {
          stroke: axis,
          grid: { stroke: grid },
          ticks: { stroke: tick },
          incrs: STEP_INCRS,
          values: (u, ticks) => ticks.map(STEP_LABEL),
          space: (u, axisIdx, min, max) => widestStep(u, min, max) + LABEL_GAP,
        },
        {
          stroke: axis,
          // As wide as its widest label (uPlot sizes its axes again until they settle).
          size: (u, values, axisIdx, cycle) => {
            const axis = u.axes[axisIdx];
            if (cycle > 1) return axis._size;
            const widest = Math.max(0, ...(values || []).map((v) => (v ? labelWidth(u, axisIdx, v) : 0)));
            return Math.max(VALUE_AXIS_MIN, Math.ceil(axis.ticks.size + axis.gap + widest + 2));
          },
          grid: { stroke: grid, ...(this.log ? { filter: logLabelled } : {}) },
          ticks: { stroke: tick, ...(this.log ? { filter: logLabelled } : {}) },
          ...valueAxis,
        },
      ],
      // data-x-range: the step axis's span, as drawn; and whether it is zoomed (noteZoom).
      hooks: {
        setScale: [(u, key) => {
          if (key !== "x") return;
          this.root.dataset.xRange = `${u.scales.x.min}..${u.scales.x.max}`;
          this.noteZoom(u);
        }],
        setCursor: [(u) => this.showReadout(u)],
      },
      series: [
        { label: "step" },
        ...this.series.map((s) => ({
          label: s.label,
          show: !this.hidden.has(s.key),
          stroke: themeColour(s.stroke),
          width: 2,
          dash: s.dash,
          spanGaps: true,
          // Dots filled with the panel's colour (uPlot's own white glared on the dark one).
          points: { show: (u, si, i0, i1) => i1 - i0 < MAX_DOTS, size: 5, fill: dotFill },
          value: (u, v) => valueText(v),
        })),
      ],
    };
  }

  /** data-y-ticks: the value axis's labels, as drawn ("1e-6 1e-4 0.01 1"), bottom up. */
  noteTicks(labels) {
    const said = labels.filter((label) => label).join(" ");
    if (this.root.dataset.yTicks !== said) this.root.dataset.yTicks = said;
  }

  /** Switch to a log scale (or back), remembered for this chart on every job's page. */
  setLog(log) {
    if (log === this.log) return;
    this.log = log;
    storeLog(this.kind, log);
    this.root.dataset.scale = log ? "log" : "linear";
    if (this.logBox) this.logBox.checked = log;
    this.restyle();
  }

  /** Make the plot again, from the options and colours in force now: a new scale, or the
   *  browser's scheme changed. The steps it was zoomed to stay so. */
  restyle() {
    const zoom = this.zoom;
    if (this.plot) {
      this.plot.destroy();
      this.plot = null;
    }
    this.draw();
    // Drawn with the new plot's first data (uPlot draws in a microtask): its hooks see the
    // zoom alone, and the status line is not said again.
    if (zoom && this.plot) this.plot.setScale("x", zoom);
  }

  /** Show series `key` or hide it (its legend button), as uPlot's legend did on a click. */
  toggle(key) {
    const index = this.series.findIndex((s) => s.key === key);
    const show = this.hidden.has(key);
    if (show) this.hidden.delete(key);
    else this.hidden.add(key);
    this.keys[index].setAttribute("aria-pressed", String(show));
    if (this.plot) this.plot.setSeries(index + 1, { show });
  }

  /** The steps of the data drawn, first and last; null with fewer than two (no zoom). */
  stepSpan(u = this.plot) {
    const steps = u && u.data[0];
    return steps && steps.length > 1 ? [steps[0], steps[steps.length - 1]] : null;
  }

  /** After the step axis's span changed (a drag, a double-click, a key, new data): zoomed
   *  while it shows less than every step. Says which steps, and shows Reset zoom. */
  noteZoom(u) {
    const all = this.stepSpan(u);
    const { min, max } = u.scales.x;
    const slack = all ? (all[1] - all[0]) * 1e-9 : 0;
    this.zoom = all && (min > all[0] + slack || max < all[1] - slack) ? { min, max } : null;
    const text = this.zoom
      ? `Steps ${STEP_LABEL(Math.ceil(min))}–${STEP_LABEL(Math.floor(max))} shown` : "";
    if (this.zoomText.textContent !== text) this.zoomText.textContent = text;
    if (this.zoom) this.root.dataset.zoom = `${min}..${max}`;
    else delete this.root.dataset.zoom;
    if (this.resetButton.hidden === Boolean(this.zoom)) {
      // Hidden with the keyboard's focus on it (it was pressed), the focus goes to the plot,
      // not to the page's top.
      if (!this.zoom && document.activeElement === this.resetButton) this.canvas.focus();
      this.resetButton.hidden = !this.zoom;
    }
  }

  /** Every step shown again. */
  resetZoom() {
    const all = this.stepSpan();
    if (all) this.plot.setScale("x", { min: all[0], max: all[1] });
  }

  /** Where pointer `event` is across the plot area, in CSS px from its left edge, within
   *  it; null where it is not over the plot area (its axes, say) and `within` is false. */
  plotX(event, within = false) {
    const over = this.plot.over.getBoundingClientRect();
    const x = event.clientX - over.left;
    const inside = x >= 0 && x <= over.width && event.clientY >= over.top
      && event.clientY <= over.bottom;
    if (!inside && !within) return null;
    return Math.min(over.width, Math.max(0, x));
  }

  /** A finger (or a pen) down on the plot area: a sideways drag from here selects steps,
   *  shown as the mouse's selection is. The mouse's own is uPlot's. */
  touchDown(event) {
    if (event.pointerType === "mouse" || !event.isPrimary || !this.plot || !this.stepSpan()) return;
    const from = this.plotX(event);
    if (from === null) return;
    this.touch = { id: event.pointerId, from };
    // Its moves and its end come here even once the finger has left the plot.
    this.canvas.setPointerCapture(event.pointerId);
  }

  touchMove(event) {
    if (!this.touch || event.pointerId !== this.touch.id || !this.plot) return;
    const x = this.plotX(event, true);
    const { from } = this.touch;
    this.plot.setSelect({ left: Math.min(from, x), width: Math.abs(x - from), top: 0,
      height: this.plot.over.clientHeight }, false);
  }

  /** The finger lifted: the steps it spanned are shown, as a mouse drag's are. Cancelled
   *  (the page took the swipe to scroll), or barely moved (a tap), nothing changes. */
  touchUp(event) {
    if (!this.touch || event.pointerId !== this.touch.id) return;
    const { from } = this.touch;
    this.touch = null;
    if (!this.plot) return;
    this.plot.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
    if (event.type === "pointercancel") return;
    const x = this.plotX(event, true);
    if (Math.abs(x - from) < MIN_TOUCH_DRAG_PX) return;
    const min = this.plot.posToVal(Math.min(from, x), "x");
    const max = this.plot.posToVal(Math.max(from, x), "x");
    this.plot.setScale("x", { min, max });
  }

  /** A key on the focused plot (zoomKey's); others, and any with Ctrl, Alt or Meta (the
   *  browser's own zoom is Ctrl and +), are left to the page. */
  zoomKeyDown(event) {
    if (event.ctrlKey || event.altKey || event.metaKey || !this.plot) return;
    const all = this.stepSpan();
    if (!all) return;
    const { min, max } = this.plot.scales.x;
    const next = zoomKey(event.key, [min, max], all);
    if (!next) return;
    event.preventDefault();
    this.plot.setScale("x", { min: next[0], max: next[1] });
  }

  /** Show what the pointer is over (readoutLines) beside it, on the side with room; hide
   *  it once the pointer has left. On a log scale it says a value that is not drawn (0 at
   *  a step the pointer is on) from the data as reported. */
  showReadout(u) {
    const data = this.drawn || u.data;
    const idx = u.cursor.idx;
    const idxs = u.cursor.idxs && this.log && idx !== null && idx !== undefined
      ? u.cursor.idxs.map((i, k) => (k > 0 && data[k][idx] !== null ? idx : i))
      : u.cursor.idxs;
    const lines = readoutLines(this.series, data, idx, idxs, this.hidden);
    const tip = this.readout;
    if (lines.length === 0 || u.cursor.left < 0) {
      if (!tip.hidden) tip.hidden = true;
      return;
    }
    const text = lines.join("\n");
    if (tip.textContent !== text) tip.textContent = text;
    tip.hidden = false;
    const gap = 12;
    const { left, top } = u.cursor;
    const right = left + gap + tip.offsetWidth <= u.over.clientWidth;
    tip.style.left = `${right ? left + gap : Math.max(0, left - gap - tip.offsetWidth)}px`;
    tip.style.top = `${Math.max(0, Math.min(top + gap, u.over.clientHeight - tip.offsetHeight))}px`;
  }

  /** What the chart says while it has no point ("No data yet" while more may come). */
  setEmptyText(text) {
    if (this.empty.textContent !== text) this.empty.textContent = text;
  }

  width() {
    return Math.max(200, Math.floor(this.root.clientWidth || 300));
  }

  update(seriesMap) {
    const data = align(this.series.map((s) => s.key), seriesMap);
    // data-points: the points the page holds (every one the job reported, unless the page
    // read them thinned or thinned them itself: job.js); data-points-<key>: each series'
    // own (eval vs train); data-drawn: the points drawn, at most about 2 × THIN_BUCKETS a
    // series.
    const counts = data.slice(1).map((ys) => ys.filter((y) => y !== null).length);
    this.series.forEach((s, i) => this.root.setAttribute(`data-points-${s.key}`, String(counts[i])));
    this.points = counts.reduce((n, c) => n + c, 0);
    this.root.dataset.points = String(this.points);
    this.empty.hidden = this.points > 0;
    this.canvas.hidden = this.points === 0;
    this.legend.hidden = this.points === 0;
    // One step so far (a job's first report): the lone dot is easy to miss, so say it.
    const steps = data[0];
    this.single.hidden = steps.length !== 1;
    this.single.textContent = steps.length === 1 ? `One report so far, at step ${steps[0]}.` : "";
    const said = summarize(this.series, data, valueText);
    if (this.summary.textContent !== said) this.summary.textContent = said;
    this.drawn = thin(data);
    this.draw();
  }

  /** Draw the data kept by update() on the scale the chart is on. */
  draw() {
    if (!this.drawn) return;
    const data = this.log ? positiveOnly(this.drawn) : this.drawn;
    const count = (columns) => columns.slice(1)
      .reduce((n, ys) => n + ys.filter((y) => y !== null && y !== undefined).length, 0);
    const drawn = count(data);
    this.root.dataset.drawn = String(drawn);
    // What a log scale leaves out is said under it, not left to be noticed as a gap.
    const left = count(this.drawn) - drawn;
    this.unplotted.hidden = left === 0;
    const note = left === 0 ? "" : `${left === 1 ? "1 value" : `${left} values`} at or below 0 ` +
      "not drawn on the log scale.";
    if (this.unplotted.textContent !== note) this.unplotted.textContent = note;
    if (this.points === 0 || typeof uPlot === "undefined") return;
    if (!this.plot) {
      this.plot = new uPlot(this.plotOptions(), data, this.canvas); // eslint-disable-line no-undef
      this.plot.over.append(this.readout);
    } else if (this.zoom) {
      // New points keep the steps zoomed to: setData alone showed every step again (a
      // running job's chart unzoomed itself at its next report).
      const zoom = this.zoom;
      this.plot.batch(() => {
        this.plot.setData(data);
        this.plot.setScale("x", zoom);
      });
    } else {
      this.plot.setData(data);
    }
  }

  destroy() {
    shown.delete(this);
    this.resizer.disconnect();
    if (this.plot) this.plot.destroy();
    this.root.remove();
  }
}
