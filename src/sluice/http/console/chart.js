// Line charts on a canvas, about a hundred lines with no library: a few series over time, a
// value axis with round ticks, a time axis, a legend. Redrawn whole on each update.

import { h } from "./dom.js";

const COLORS = ["#2f6fdf", "#e0663a", "#2aa876", "#9b59b6", "#c0392b"];

function niceStep(range) {
  const raw = range / 4;
  const power = 10 ** Math.floor(Math.log10(raw || 1));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

/**
 * A chart: `series` are `{label, color?}`; `update(times, values)` redraws it with `times` (ms)
 * and one array of numbers per series. `format` writes the value axis.
 */
export function lineChart(title, series, { format = (v) => String(v), height = 160 } = {}) {
  const canvas = h("canvas", { class: "chart", height, width: 480, role: "img", "aria-label": title });
  canvas.style.height = `${height}px`; // CSS pixels, whatever the backing store's resolution
  const legend = h(
    "div",
    { class: "legend" },
    series.map((s, i) =>
      h("span", {}, h("span", { class: `swatch swatch-${i}` }), s.label),
    ),
  );
  const box = h("figure", { class: "chart-box" }, h("figcaption", {}, title), canvas, legend);
  let last = null;

  function draw(times, values) {
    last = [times, values];
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(240, canvas.clientWidth || 480);
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const left = 64;
    const right = width - 8;
    const top = 8;
    const bottom = height - 22;
    let max = 0;
    for (const list of values) for (const v of list) if (v > max) max = v;
    const step = niceStep(Math.max(max, 4));
    const top_value = Math.max(step, Math.ceil(max / step) * step);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#667";
    ctx.strokeStyle = "#e3e6ea";
    ctx.lineWidth = 1;
    for (let v = 0; v <= top_value + step / 2; v += step) {
      const y = bottom - (v / top_value) * (bottom - top);
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(right, y);
      ctx.stroke();
      ctx.textAlign = "right";
      ctx.fillText(format(v), left - 6, y + 4);
    }
    if (times.length < 2) {
      ctx.textAlign = "center";
      ctx.fillText("collecting samples…", (left + right) / 2, (top + bottom) / 2);
      return;
    }
    const t0 = times[0];
    const t1 = times[times.length - 1];
    const x = (t) => left + ((t - t0) / (t1 - t0 || 1)) * (right - left);
    ctx.textAlign = "left";
    ctx.fillText(new Date(t0).toLocaleTimeString(), left, height - 6);
    ctx.textAlign = "right";
    ctx.fillText(new Date(t1).toLocaleTimeString(), right, height - 6);
    values.forEach((list, i) => {
      ctx.strokeStyle = series[i].color || COLORS[i % COLORS.length];
      ctx.lineWidth = 2;
      ctx.beginPath();
      list.forEach((v, j) => {
        const y = bottom - (v / top_value) * (bottom - top);
        if (j === 0) ctx.moveTo(x(times[j]), y);
        else ctx.lineTo(x(times[j]), y);
      });
      ctx.stroke();
    });
  }

  // Redrawn at its new width when the page's layout changes (the window is resized).
  new ResizeObserver(() => {
    if (last) draw(...last);
  }).observe(canvas);

  return {
    element: box,
    update: draw,
    redraw: () => last && draw(...last),
  };
}

/** Samples kept in the page while it is open: `push(time, [v1, v2, ...])`, at most `size`. */
export class Series {
  constructor(size = 150) {
    this.size = size;
    this.times = [];
    this.values = [];
  }

  push(t, values) {
    this.times.push(t);
    values.forEach((v, i) => {
      (this.values[i] ||= []).push(v);
    });
    if (this.times.length > this.size) {
      this.times.shift();
      this.values.forEach((list) => list.shift());
    }
  }
}
