// Destinations: the table (filtered, sorted and paged by the server, so ten thousand of them
// cost one page), and one destination: its depth and rates over time, its consumers, and what
// the caller may do to it (purge, delete, send; its messages are in messages.js).

import { api, destinationPath, get, query } from "./api.js";
import { Series, lineChart } from "./chart.js";
import { bytes, confirmButton, fill, h, num, rate, table } from "./dom.js";
import { messagesPanel } from "./messages.js";
import { showError, toast } from "./notify.js";

const PAGE = 50;
// The table's state, kept while the console is open.
const state = { name: "", kind: "", sort: "name", order: "asc", offset: 0 };

export function destinationLink(name) {
  return h("a", { href: `#/destination/${encodeURIComponent(name)}`, class: "dest" }, name);
}

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

export function pager(total, offset, limit, go) {
  const last = Math.min(total, offset + limit);
  return h(
    "div",
    { class: "pager" },
    h("button", { type: "button", disabled: offset === 0, onclick: () => go(Math.max(0, offset - limit)), class: "prev" }, "‹ Previous"),
    h("span", { class: "range" }, total ? `${num(offset + 1)}–${num(last)} of ${num(total)}` : "none"),
    h("button", { type: "button", disabled: last >= total, onclick: () => go(offset + limit), class: "next" }, "Next ›"),
  );
}

const COLUMNS = [
  { label: "Name", sort: "name", value: (d) => destinationLink(d.name) },
  { label: "Kind", value: (d) => d.kind },
  { label: "Ready", sort: "messages_ready", class: "num depth", value: (d) => num(d.messages_ready) },
  { label: "In flight", sort: "messages_in_flight", class: "num", value: (d) => num(d.messages_in_flight) },
  { label: "Consumers", sort: "consumers", class: "num", value: (d) => num(d.consumers) },
  { label: "Producers", sort: "producers", class: "num", value: (d) => num(d.producers) },
  { label: "In", sort: "messages_in", class: "num", value: (d) => rate(d.rates.messages_in) },
  { label: "Out", sort: "delivered", class: "num", value: (d) => rate(d.rates.delivered) },
  { label: "Memory", sort: "memory_bytes", class: "num", value: (d) => bytes(d.memory_bytes) },
  { label: "Paged", sort: "messages_paged", class: "num", value: (d) => num(d.messages_paged) },
];

export function destinationsPage(ctx) {
  const box = h("div", { id: "destinations-table" });
  const pages = h("div");
  let refresh = async () => {};
  const again = () => refresh();
  const filter = h("input", {
    id: "destination-filter",
    type: "search",
    placeholder: "Filter by name",
    value: state.name,
    oninput: debounce((event) => {
      state.name = event.target.value;
      state.offset = 0;
      again();
    }, 250),
  });
  const kind = h(
    "select",
    {
      id: "destination-kind",
      onchange: (event) => {
        state.kind = event.target.value;
        state.offset = 0;
        again();
      },
    },
    h("option", { value: "" }, "queues and topics"),
    h("option", { value: "queue" }, "queues"),
    h("option", { value: "topic" }, "topics"),
  );
  kind.value = state.kind;
  const tools = h("div", { class: "tools" }, filter, kind);
  if (ctx.who.broker.admin) tools.append(createForm(again));
  fill(ctx.root, h("h1", {}, "Destinations"), tools, box, pages);

  const onSort = (sort) => {
    state.order = state.sort === sort && state.order === "asc" ? "desc" : "asc";
    state.sort = sort;
    again();
  };
  refresh = async () => {
    const page = await get(`/api/destinations${query({ name: state.name, kind: state.kind, sort: state.sort, order: state.order, offset: state.offset, limit: PAGE })}`);
    if (!ctx.alive) return;
    fill(box, table(COLUMNS, page.items, { sorted: state, onSort, empty: "no destinations" }));
    fill(pages, pager(page.total, page.offset, page.limit, (offset) => {
      state.offset = offset;
      again();
    }));
    box.dataset.total = page.total;
    ctx.rendered();
  };
  ctx.every(2000, () => refresh());
}

function createForm(done) {
  const name = h("input", { id: "create-name", placeholder: "/queue/NAME or /topic/NAME", required: true });
  return h(
    "form",
    {
      class: "inline",
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          await api("PUT", destinationPath(name.value.trim()));
          toast(`Created ${name.value.trim()}`);
          name.value = "";
          done();
        } catch (err) {
          showError(err);
        }
      },
    },
    name,
    h("button", { type: "submit" }, "Create"),
  );
}

// -- one destination ----------------------------------------------------------------------------

export async function destinationPage(ctx, name) {
  const path = destinationPath(name);
  const [whoami, first] = await Promise.all([get(`/api/whoami${query({ destination: name })}`), get(path)]);
  if (!ctx.alive) return;
  const may = whoami.destinations[name] || {};
  const isQueue = name.startsWith("/queue/");
  const stats = h("dl", { class: "stats wide", id: "destination-stats" });
  const depth = lineChart("Depth", [{ label: "ready" }, { label: "in flight" }], { format: num });
  const rates = lineChart("Messages per second", [{ label: "in" }, { label: "delivered" }, { label: "acknowledged" }], { format: num });
  const series = new Series();
  const consumers = h("div", { id: "destination-consumers" });
  const actions = h("div", { class: "actions", id: "destination-actions" });
  const title = h("h1", { id: "destination-name" }, name);
  fill(
    ctx.root,
    h("p", {}, h("a", { href: "#/destinations" }, "‹ Destinations")),
    title,
    actions,
    stats,
    h("div", { class: "charts" }, depth.element, rates.element),
    h("h2", {}, "Consumers"),
    consumers,
  );
  if (isQueue && may.admin) {
    actions.append(
      confirmButton("Purge", async () => {
        try {
          const answer = await api("DELETE", `${path}/messages`);
          toast(`Purged ${num(answer.purged)} messages of ${name}`);
        } catch (err) {
          showError(err);
        }
      }, { name: "purge" }),
    );
  }
  if (may.admin) {
    actions.append(
      confirmButton("Delete", async () => {
        try {
          await api("DELETE", path);
          toast(`Deleted ${name}`);
          location.hash = "#/destinations";
        } catch (err) {
          showError(err);
        }
      }, { name: "delete" }),
    );
  }
  if (may.write) ctx.root.append(sendForm(path, name));
  if (isQueue && may.read) ctx.root.append(messagesPanel(ctx, name, path, first.dead_letter_queue));

  let previous = null;
  ctx.every(1000, async () => {
    const d = await get(path);
    if (!ctx.alive) return;
    fill(
      stats,
      ...[
        ["Ready", num(d.messages_ready), "ready"],
        ["In flight", num(d.messages_in_flight), "in-flight"],
        ["Consumers", num(d.consumers), "consumers"],
        ["Producers", num(d.producers), "producers"],
        ["Memory", bytes(d.memory_bytes)],
        ["Paged", `${num(d.messages_paged)} (${bytes(d.paged_bytes)})`],
        ["In (total)", num(d.messages_in)],
        ["Delivered", num(d.delivered)],
        ["Acknowledged", num(d.acked)],
        ["Redelivered", num(d.redelivered)],
        ["Dead-lettered", num(d.dead_lettered)],
        ["Expired", num(d.expired)],
      ].flatMap(([label, value, id]) => [h("dt", {}, label), h("dd", { id: id ? `stat-${id}` : undefined }, value)]),
    );
    // Rates from the counts between two polls, so the chart moves at the poll's pace.
    const now = Date.now();
    const s = previous ? (now - previous.at) / 1000 || 1 : 1;
    const per = (key) => (previous ? Math.max(0, (d[key] - previous.d[key]) / s) : 0);
    series.push(now, [d.messages_ready, d.messages_in_flight, per("messages_in"), per("delivered"), per("acked")]);
    depth.update(series.times, series.values.slice(0, 2));
    rates.update(series.times, series.values.slice(2));
    previous = { at: now, d };
    const list = await get(`/api/consumers${query({ destination: name, limit: 100 })}`);
    if (!ctx.alive) return;
    fill(
      consumers,
      table(
        [
          { label: "Connection", value: (c) => h("a", { href: `#/connections/${c.connection_id}` }, String(c.connection_id)) },
          { label: "Subscription", value: (c) => c.subscription_id },
          { label: "Ack", value: (c) => c.ack_mode },
          { label: "Selector", value: (c) => c.selector || "" },
          { label: "Durable", value: (c) => c.durable_name || "" },
          { label: "In flight", class: "num", value: (c) => num(c.messages_in_flight) },
          { label: "Credit", class: "num", value: (c) => (c.credit === null ? "auto" : num(c.credit)) },
        ],
        list.items,
        { empty: "no consumers" },
      ),
    );
  });
}

function sendForm(path, name) {
  const body = h("textarea", { id: "send-body", rows: 3, placeholder: "body" });
  const headers = h("textarea", { id: "send-headers", rows: 2, placeholder: "name: value, one a line" });
  const persistent = h("input", { type: "checkbox", id: "send-persistent", checked: true });
  return h(
    "details",
    { class: "panel", id: "send-panel" },
    h("summary", {}, "Send a message"),
    h(
      "form",
      {
        id: "send-form",
        onsubmit: async (event) => {
          event.preventDefault();
          const parsed = {};
          for (const line of headers.value.split("\n")) {
            const at = line.indexOf(":");
            if (at > 0) parsed[line.slice(0, at).trim()] = line.slice(at + 1).trim();
          }
          try {
            const answer = await api("POST", `${path}/messages`, { body: body.value, headers: parsed, persistent: persistent.checked });
            toast(`Sent ${answer.message_id} to ${name}`);
            body.value = "";
          } catch (err) {
            showError(err);
          }
        },
      },
      h("label", {}, "Body", body),
      h("label", {}, "Headers", headers),
      h("label", { class: "check" }, persistent, "persistent"),
      h("button", { type: "submit", id: "send-submit" }, "Send"),
    ),
  );
}
