// Building the page with DOM calls only: text goes in as text (textContent, text nodes), never
// as HTML, so a message body or a destination name that holds markup is shown, not run.

/** An element: `h("td", {class: "num", onclick: fn}, "text", child, ...)`. */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = String(value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "value" || key === "checked" || key === "disabled" || key === "hidden") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace what `el` holds. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  let value = Number(n);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${UNITS[unit]}`;
}

export function num(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US");
}

export function rate(n) {
  if (n === null || n === undefined) return "–";
  return `${Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 })}/s`;
}

export function time(ms) {
  if (!ms) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function duration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${hh}h` : hh ? `${hh}h ${mm}m` : `${mm}m ${s % 60}s`;
}

/** A table: `columns` are `{label, value(row), sort?, class?}`; `sort` names the API's key. */
export function table(columns, rows, { sorted, onSort, rowClass, empty = "none" } = {}) {
  const head = h(
    "tr",
    {},
    columns.map((col) => {
      if (!col.sort || !onSort) return h("th", { class: col.class }, col.label);
      const active = sorted && sorted.sort === col.sort;
      const arrow = active ? (sorted.order === "desc" ? " ▼" : " ▲") : "";
      return h(
        "th",
        { class: `${col.class || ""} sortable`, dataset: { sort: col.sort } },
        h("button", { class: "link", type: "button", onclick: () => onSort(col.sort) }, col.label + arrow),
      );
    }),
  );
  const body = rows.length
    ? rows.map((row) =>
        h(
          "tr",
          { class: rowClass ? rowClass(row) : undefined },
          columns.map((col) => h("td", { class: col.class }, col.value(row))),
        ),
      )
    : [h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, empty))];
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

/** A button that asks to be clicked a second time (within 5 s) before it acts. */
export function confirmButton(label, action, { danger = true, name } = {}) {
  let armed = null;
  const button = h("button", { type: "button", class: danger ? "danger" : "", dataset: { action: name || label } }, label);
  button.addEventListener("click", async () => {
    if (!armed) {
      button.textContent = `Confirm ${label.toLowerCase()}?`;
      button.classList.add("armed");
      armed = setTimeout(() => {
        armed = null;
        button.textContent = label;
        button.classList.remove("armed");
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.textContent = label;
    button.classList.remove("armed");
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

/** A bar of `value` out of `max`, labelled. */
export function meter(value, max, label) {
  const bar = h("progress", { max: max > 0 ? max : 1, value: Math.min(value, max > 0 ? max : 1) });
  return h("span", { class: "meter" }, bar, h("span", { class: "meter-label" }, label));
}
