// The overview: rates in and out, depth, memory, disk and store use against their limits, the
// alarms, and charts of the broker's recent samples (`/api/overview/history`).

import { get } from "./api.js";
import { lineChart } from "./chart.js";
import { bytes, duration, fill, h, meter, num, rate } from "./dom.js";

function card(title, value, detail, id) {
  return h("div", { class: "card", id }, h("div", { class: "card-title" }, title), h("div", { class: "card-value" }, value), detail ? h("div", { class: "card-detail" }, detail) : null);
}

function usage(used, limit) {
  if (!limit) return h("span", {}, `${bytes(used)} (no limit)`);
  return meter(used, limit, `${bytes(used)} of ${bytes(limit)} (${((100 * used) / limit).toFixed(1)}%)`);
}

export function overviewPage(ctx) {
  const cards = h("div", { class: "cards", id: "overview-cards" });
  const limits = h("div", { class: "limits", id: "overview-limits" });
  const alarms = h("div", { class: "alarms", id: "overview-alarms" });
  const rates = lineChart("Messages per second", [{ label: "in" }, { label: "delivered" }, { label: "acknowledged" }], { format: (v) => num(v) });
  const depth = lineChart("Depth", [{ label: "ready" }, { label: "in flight" }], { format: (v) => num(v) });
  const memory = lineChart("Memory and store", [{ label: "memory" }, { label: "store data" }], { format: bytes });
  rates.update([], [[], [], []]);
  depth.update([], [[], []]);
  memory.update([], [[], []]);
  fill(
    ctx.root,
    h("h1", {}, "Overview"),
    cards,
    h("h2", {}, "Limits"),
    limits,
    alarms,
    h("div", { class: "charts" }, rates.element, depth.element, memory.element),
  );

  // Every 5 s: the overview looks at every destination, and its rates change at that pace.
  ctx.every(5000, async () => {
    const o = await get("/api/overview");
    fill(
      cards,
      card("In", rate(o.rates.messages_in), `${num(o.totals.messages_in)} since start`, "card-in"),
      card("Out", rate(o.rates.delivered), `${num(o.totals.delivered)} delivered, ${rate(o.rates.acked)} acked`, "card-out"),
      card("Depth", num(o.destinations.messages_ready), `${num(o.destinations.messages_in_flight)} in flight`, "card-depth"),
      card("Destinations", num(o.destinations.queues + o.destinations.topics), `${num(o.destinations.queues)} queues, ${num(o.destinations.topics)} topics`),
      card("Connections", num(o.connections), null, "card-connections"),
      card("Uptime", duration(o.uptime_s), `${o.broker_name} ${o.version}`),
    );
    fill(
      limits,
      h("dl", {},
        h("dt", {}, "Memory"), h("dd", {}, usage(o.memory.used_bytes, o.memory.limit_bytes)),
        h("dt", {}, "Process RSS"), h("dd", {}, bytes(o.memory.process_rss_bytes)),
        h("dt", {}, `Store (${o.store.kind})`), h("dd", {}, usage(o.store.data_bytes, o.store.limit_bytes)),
        h("dt", {}, "Disk free"), h("dd", {}, bytes(o.store.disk_free_bytes)),
        h("dt", {}, "Temp store"), h("dd", {}, usage(o.temp_store.data_bytes, o.temp_store.limit_bytes)),
        h("dt", {}, "Pending writes"), h("dd", {}, num(o.store.pending_writes)),
      ),
    );
    const raised = Object.entries(o.alarms).filter(([, on]) => on).map(([name]) => name.replace(/_/g, " "));
    ctx.rendered();
    fill(alarms, raised.length ? h("p", { class: "alarm" }, `Alarms: ${raised.join(", ")}`) : h("p", { class: "ok" }, "No alarms."));
  });

  ctx.every(5000, async () => {
    const history = await get("/api/overview/history");
    const samples = history.samples;
    const times = samples.map((s) => s.at_ms);
    rates.update(times, [samples.map((s) => s.messages_in), samples.map((s) => s.delivered), samples.map((s) => s.acked)]);
    depth.update(times, [samples.map((s) => s.messages_ready), samples.map((s) => s.messages_in_flight)]);
    memory.update(times, [samples.map((s) => s.memory_bytes), samples.map((s) => s.store_bytes)]);
  });
}
