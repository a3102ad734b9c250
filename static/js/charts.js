// Line charts of metric series over steps, drawn with the vendored uPlot (static/vendor/).

import { h } from "./format.js";

const HEIGHT = 190;

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
      (this.empty = h("p", { class: "chart-empty muted" }, "No data yet")));
    container.append(this.root);
    this.options = {
      width: this.width(),
      height: HEIGHT,
      legend: { show: true, live: false },
      cursor: { drag: { x: true, y: false } },
      scales: yRange ? { x: { time: false }, y: { range: yRange } } : { x: { time: false } },
      axes: [
        { stroke: "#667", grid: { stroke: "#e7e9ee" }, ticks: { stroke: "#d7dae0" } },
        {
          stroke: "#667",
          size: 56,
          grid: { stroke: "#e7e9ee" },
          ticks: { stroke: "#d7dae0" },
          values: (u, ticks) => ticks.map((v) => Number(v.toPrecision(yDigits)).toString()),
        },
      ],
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
