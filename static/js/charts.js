// Line charts of metric series over steps, drawn with the vendored uPlot (static/vendor/).

import { h } from "./format.js";

const HEIGHT = 190;
// Steps are whole numbers: the step axis never ticks between them.
const STEP_INCRS = [1, 2, 5].flatMap((m) => Array.from({ length: 10 }, (_, e) => m * 10 ** e))
  .sort((a, b) => a - b);

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
function align(keys, seriesMap) {
  const steps = new Set();
  const byKey = keys.map((key) => {
    const points = new Map();
    for (const point of seriesMap[key] || []) {
      points.set(point.step, point.value);
      steps.add(point.step);
    }
    return points;
  });
  const xs = [...steps].sort((a, b) => a - b);
  return [xs, ...byKey.map((points) => xs.map((x) => (points.has(x) ? points.get(x) : null)))];
}

export class LineChart {
  /** `series`: [{key, label, stroke, dash?}] read from the map given to update(). */
  constructor(container, { title, series, yDigits = 4, yRange = null }) {
    this.series = series;
    this.plot = null;
    this.points = 0;
    this.root = h("figure", { class: "chart", dataset: { chart: title.toLowerCase(), points: "0" } },
      h("figcaption", {}, title),
      (this.canvas = h("div", { class: "chart-plot" })),
      (this.empty = h("p", { class: "chart-empty muted" }, "No data yet")),
      (this.single = h("p", { class: "chart-note muted small", hidden: true })));
    container.append(this.root);
    this.options = {
      width: this.width(),
      height: HEIGHT,
      legend: { show: true, live: false },
      cursor: { drag: { x: true, y: false } },
      scales: yRange
        ? { x: { time: false, range: stepRange }, y: { range: yRange } }
        : { x: { time: false, range: stepRange } },
      axes: [
        { stroke: "#667", grid: { stroke: "#e7e9ee" }, ticks: { stroke: "#d7dae0" }, incrs: STEP_INCRS },
        {
          stroke: "#667",
          size: 56,
          grid: { stroke: "#e7e9ee" },
          ticks: { stroke: "#d7dae0" },
          values: (u, ticks) => ticks.map((v) => Number(v.toPrecision(yDigits)).toString()),
        },
      ],
      // data-x-range: the step axis's span, as drawn.
      hooks: { setScale: [(u, key) => {
        if (key === "x") this.root.dataset.xRange = `${u.scales.x.min}..${u.scales.x.max}`;
      }] },
      series: [
        { label: "step" },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.stroke,
          width: 2,
          dash: s.dash,
          spanGaps: true,
          points: { show: true, size: 5 },
          value: (u, v) => (v === null || v === undefined ? "—" : Number(v.toPrecision(5)).toString()),
        })),
      ],
    };
    this.resizer = new ResizeObserver(() => {
      if (this.plot) this.plot.setSize({ width: this.width(), height: HEIGHT });
    });
    this.resizer.observe(this.root);
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
    // data-points: every point drawn; data-points-<key>: each series' own (eval vs train).
    const counts = data.slice(1).map((ys) => ys.filter((y) => y !== null).length);
    this.series.forEach((s, i) => this.root.setAttribute(`data-points-${s.key}`, String(counts[i])));
    this.points = counts.reduce((n, c) => n + c, 0);
    this.root.dataset.points = String(this.points);
    this.empty.hidden = this.points > 0;
    this.canvas.hidden = this.points === 0;
    // One step so far (a job's first report): the lone dot is easy to miss, so say it.
    const steps = data[0];
    this.single.hidden = steps.length !== 1;
    this.single.textContent = steps.length === 1 ? `One report so far, at step ${steps[0]}.` : "";
    if (this.points === 0 || typeof uPlot === "undefined") return;
    if (!this.plot) {
      this.options.width = this.width();
      this.plot = new uPlot(this.options, data, this.canvas); // eslint-disable-line no-undef
    } else {
      this.plot.setData(data);
    }
  }

  destroy() {
    this.resizer.disconnect();
    if (this.plot) this.plot.destroy();
    this.root.remove();
  }
}
