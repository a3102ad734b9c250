"""WCAG 2 contrast, judged in the page as the browser has styled it (getComputedStyle).

`LOW_CONTRAST` returns what falls short, described ("" entries none): every visible text
against WCAG's AA minimum (4.5:1; 3:1 for large text: 24px, or bold and 18.66px), the text
a field holds included, and each field's edge (3:1, WCAG's non-text contrast) against what
is around it. A background that is not opaque (a readout at 94%) is laid over the ones
under it, walking up to the first opaque one; a colour with alpha, or under an `opacity`,
over its background. A disabled control (dimmed on purpose, and exempt in WCAG) is passed
over, as is text out of sight (hidden, or clipped to a pixel for screen readers alone).
"""

from __future__ import annotations

from playwright.sync_api import Page

LOW_CONTRAST = """() => {
  const low = [];
  const parse = (css) => {
    const m = /^rgba?\\(([^)]*)\\)$/.exec(css.trim());
    if (!m) { low.push(`a colour this check cannot read: ${css}`); return [0, 0, 0, 0]; }
    const p = m[1].split(/[\\s,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3])).concat(1);
  const canvas = matchMedia("(prefers-color-scheme: dark)").matches ? [18, 18, 18, 1] : [255, 255, 255, 1];
  // What shows behind `el`: its own background and its ancestors', to the first opaque one.
  const background = (el) => {
    const layers = [];
    for (let node = el; node; node = node.parentElement) {
      const colour = parse(getComputedStyle(node).backgroundColor);
      if (colour[3] > 0) layers.push(colour);
      if (colour[3] >= 1) break;
    }
    let colour = layers.length && layers[layers.length - 1][3] >= 1 ? layers.pop() : canvas;
    while (layers.length) colour = over(layers.pop(), colour);
    return colour;
  };
  const opacity = (el) => {
    let value = 1;
    for (let node = el; node; node = node.parentElement) value *= Number(getComputedStyle(node).opacity);
    return value;
  };
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const luminance = (c) => 0.2126 * channel(c[0]) + 0.7152 * channel(c[1]) + 0.0722 * channel(c[2]);
  const ratio = (a, b) => {
    const [x, y] = [luminance(a), luminance(b)];
    return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
  };
  const css = (c) => `rgb(${c.slice(0, 3).map(Math.round).join(", ")})`;
  const name = (el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}` +
    `${typeof el.className === "string" && el.className ? "." + el.className.trim().split(/\\s+/).join(".") : ""}`;
  const shown = (el) => {
    const box = el.getBoundingClientRect();
    return el.getClientRects().length && box.width > 1 && box.height > 1 &&
      getComputedStyle(el).visibility === "visible";
  };
  const FIELDS = "input:not([type=checkbox]):not([type=radio]):not([type=hidden]), select, textarea";
  for (const el of document.querySelectorAll("body *")) {
    const field = el.matches(FIELDS);
    const text = field ? el.value || el.placeholder || ""
      : [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent).join("").trim();
    if (!text || !shown(el) || el.closest(":disabled, [aria-disabled='true']")) continue;
    const style = getComputedStyle(el);
    const bg = background(el);
    const fg = parse(style.color);
    const fade = opacity(el);
    const ink = over([fg[0], fg[1], fg[2], fg[3] * fade], bg);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (Number(style.fontWeight) >= 700 && size >= 18.66);
    const r = ratio(ink, bg);
    if (r < (large ? 3 : 4.5)) {
      low.push(`${name(el)} "${text.slice(0, 30)}": ${r.toFixed(2)}:1, ${css(ink)} on ${css(bg)}`);
    }
    if (field) {
      const edge = over(parse(style.borderTopColor), background(el.parentElement));
      const around = background(el.parentElement);
      const e = ratio(edge, around);
      if (e < 3) low.push(`${name(el)}'s edge: ${e.toFixed(2)}:1, ${css(edge)} on ${css(around)}`);
    }
  }
  return [...new Set(low)];
}"""


def assert_contrast(page: Page, where: str = "") -> None:
    """Every visible text on `page` (and every field's edge) reads at WCAG AA; `where`
    names the page in the failure."""
    low = page.evaluate(LOW_CONTRAST)
    assert low == [], f"{where or page.url}:\n" + "\n".join(low)
