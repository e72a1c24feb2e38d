// Building the page: every text goes in as a text node (never parsed as HTML), so message data,
// topic names and error messages can hold any characters and run nothing.

/** An element: attrs.class, attrs.text (its text), on* listeners, other attributes. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = String(value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "value") el.value = value;
    else if (key === "checked") el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/** Append children: elements, strings (as text), arrays of them; null and false skipped. */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Remove every child of ``el``. */
export function clear(el) {
  el.replaceChildren();
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

/** A sparkline of ``values`` (numbers), ``width`` by ``height`` pixels. */
export function sparkline(values, width = 80, height = 18) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("class", "spark");
  if (values.length < 2) return svg;
  const max = Math.max(...values, 1);
  const step = width / (values.length - 1);
  const points = values.map((v, i) =>
    `${(i * step).toFixed(1)},${(height - 1 - (v / max) * (height - 2)).toFixed(1)}`);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  return svg;
}

/** A key/value list of a plain object (nested values as JSON text). */
export function keyValues(obj) {
  const dl = h("dl", { class: "kv" });
  for (const [key, value] of Object.entries(obj || {})) {
    const shown = value !== null && typeof value === "object" ? JSON.stringify(value) : value;
    dl.append(h("dt", { text: key }), h("dd", { text: shown === null ? "—" : shown }));
  }
  return dl;
}

/** A status line (``kind``: ok, error, info) placed in ``el``. */
export function status(el, text, kind = "info") {
  el.className = `status ${kind}`;
  el.textContent = text;
}
