// Connections (closed by an operator with `admin` on the whole broker) and subscriptions: the
// consumers of every destination the caller may read, and the durable subscriptions (deleted
// with `admin` on their topic, while no consumer is attached).

import { api, get, query } from "./api.js";
import { bytes, confirmButton, fill, h, num, time } from "./dom.js";
import { destinationLink, pager } from "./destinations.js";
import { showError, toast } from "./notify.js";

const PAGE = 50;
const connectionState = { user: "", sort: "id", order: "asc", offset: 0 };

export function connectionsPage(ctx, argument) {
  const box = h("div", { id: "connections-table" });
  const pages = h("div");
  const user = h("input", { id: "connection-user", type: "search", placeholder: "user (exact)", value: connectionState.user });
  let refresh = async () => {};
  user.addEventListener("change", () => {
    connectionState.user = user.value.trim();
    connectionState.offset = 0;
    refresh();
  });
  fill(ctx.root, h("h1", {}, "Connections"), h("div", { class: "tools" }, user), box, pages);
  const mayClose = ctx.who.broker.admin;
  const onSort = (sort) => {
    connectionState.order = connectionState.sort === sort && connectionState.order === "asc" ? "desc" : "asc";
    connectionState.sort = sort;
    refresh();
  };
  const columns = [
    { label: "Id", sort: "id", class: "num", value: (c) => String(c.id) },
    { label: "User", sort: "user", value: (c) => c.user },
    { label: "Address", sort: "address", value: (c) => c.address },
    { label: "Client id", value: (c) => c.client_id || "" },
    { label: "Protocol", value: (c) => `${c.protocol} ${c.version}` },
    { label: "Connected", sort: "connected_at_ms", value: (c) => time(c.connected_at_ms) },
    { label: "In", sort: "bytes_in", class: "num", value: (c) => bytes(c.bytes_in) },
    { label: "Out", sort: "bytes_out", class: "num", value: (c) => bytes(c.bytes_out) },
    { label: "Subs", class: "num", value: (c) => num(c.subscriptions) },
    { label: "In flight", sort: "messages_in_flight", class: "num", value: (c) => num(c.messages_in_flight) },
  ];
  if (mayClose) {
    columns.push({
      label: "",
      value: (c) =>
        confirmButton("Close", async () => {
          try {
            await api("DELETE", `/api/connections/${c.id}`);
            toast(`Closed connection ${c.id}`);
            refresh();
          } catch (err) {
            showError(err);
          }
        }, { name: `close-${c.id}` }),
    });
  }
  refresh = async () => {
    const page = await get(`/api/connections${query({ ...connectionState, limit: PAGE })}`);
    if (!ctx.alive || box.querySelector(".armed")) return;
    fill(box, table(columns, page.items, connectionState, onSort, (c) => (String(c.id) === argument ? "highlight" : "")));
    fill(pages, pager(page.total, page.offset, page.limit, (offset) => {
      connectionState.offset = offset;
      refresh();
    }));
    box.dataset.total = page.total;
    ctx.rendered();
  };
  // Buttons waiting for a second click must not be redrawn away: refresh on demand, and
  // every 5 s otherwise.
  ctx.every(5000, () => (box.querySelector(".armed") ? null : refresh()));
}

function table(columns, rows, sorted, onSort, rowClass) {
  const head = h(
    "tr",
    {},
    columns.map((col) =>
      col.sort
        ? h("th", { class: col.class }, h("button", { type: "button", class: "link", onclick: () => onSort(col.sort) }, col.label + (sorted.sort === col.sort ? (sorted.order === "desc" ? " ▼" : " ▲") : "")))
        : h("th", { class: col.class }, col.label),
    ),
  );
  const body = rows.length
    ? rows.map((row) => h("tr", { class: rowClass(row), dataset: { id: row.id } }, columns.map((col) => h("td", { class: col.class }, col.value(row)))))
    : h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, "none"));
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

export function subscriptionsPage(ctx) {
  const durables = h("div", { id: "durables-table" });
  const consumers = h("div", { id: "consumers-table" });
  fill(ctx.root, h("h1", {}, "Subscriptions"), h("h2", {}, "Durable subscriptions"), durables, h("h2", {}, "Consumers"), consumers);
  let refresh = async () => {};
  refresh = async () => {
    const page = await get(`/api/subscriptions${query({ limit: 100 })}`);
    const topics = [...new Set(page.items.map((s) => s.destination))];
    const may = topics.length ? (await get(`/api/whoami${query({ destination: topics })}`)).destinations : {};
    if (!ctx.alive || ctx.root.querySelector(".armed")) return;
    const columns = [
      { label: "Topic", value: (s) => destinationLink(s.destination) },
      { label: "Client id", value: (s) => s.client_id },
      { label: "Name", value: (s) => s.name },
      { label: "Selector", value: (s) => s.selector || "" },
      { label: "Cursor", class: "num", value: (s) => num(s.cursor) },
      { label: "Lag", class: "num", value: (s) => num(s.lag) },
      { label: "Active", value: (s) => (s.active ? "yes" : "no") },
      {
        label: "",
        value: (s) =>
          may[s.destination] && may[s.destination].admin && !s.active
            ? confirmButton("Delete", async () => {
                const parts = [s.destination.slice("/topic/".length), s.client_id, s.name].map(encodeURIComponent);
                try {
                  await api("DELETE", `/api/subscriptions/${parts.join("/")}`);
                  toast(`Deleted durable subscription ${s.name}`);
                  refresh();
                } catch (err) {
                  showError(err);
                }
              }, { name: "delete-subscription" })
            : "",
      },
    ];
    fill(durables, table(columns, page.items, {}, () => {}, () => ""));
    const list = await get(`/api/consumers${query({ limit: 200 })}`);
    if (!ctx.alive) return;
    fill(
      consumers,
      table(
        [
          { label: "Destination", value: (c) => destinationLink(c.destination) },
          { label: "Connection", value: (c) => h("a", { href: `#/connections/${c.connection_id}` }, String(c.connection_id)) },
          { label: "Subscription", value: (c) => c.subscription_id },
          { label: "Ack", value: (c) => c.ack_mode },
          { label: "In flight", class: "num", value: (c) => num(c.messages_in_flight) },
          { label: "Credit", class: "num", value: (c) => (c.credit === null ? "auto" : num(c.credit)) },
        ],
        list.items,
        {},
        () => {},
        () => "",
      ),
      list.total > list.items.length ? h("p", { class: "muted" }, `${num(list.items.length)} of ${num(list.total)} shown`) : null,
    );
  };
  ctx.every(5000, () => (ctx.root.querySelector(".armed") ? null : refresh()));
}
