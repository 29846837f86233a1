// The journal: where it stands (checkpoint, head, archive), its data files with their live
// records and what pins each, and the collections and compactions seen lately.

import { get, query } from "./api.js";
import { bytes, fill, h, meter, num, time } from "./dom.js";
import { pager } from "./destinations.js";

const state = { sort: "number", order: "asc", offset: 0 };

function position(p) {
  return p ? `file ${p.file}, offset ${num(p.offset)}` : "–";
}

function pins(f) {
  const out = [];
  for (const [destination, count] of Object.entries(f.live_by_destination)) {
    out.push(h("li", {}, `${destination}: ${num(count)} live (oldest seq ${num(f.oldest_by_destination[destination])})`));
  }
  for (const what of f.state_of) out.push(h("li", {}, `state: ${what}`));
  if (f.transaction_pins) out.push(h("li", {}, `${num(f.transaction_pins)} open transaction records`));
  if (f.depends_on.length) out.push(h("li", {}, `must wait for files ${f.depends_on.join(", ")}`));
  if (f.head) out.push(h("li", {}, "the file being written"));
  return out.length ? h("ul", { class: "pins" }, out) : h("span", { class: "muted" }, "nothing: collectable");
}

export function journalPage(ctx) {
  const summary = h("dl", { class: "stats", id: "journal-summary" });
  const history = h("div", { id: "journal-history" });
  const files = h("div", { id: "journal-files" });
  const pages = h("div");
  fill(ctx.root, h("h1", {}, "Journal"), summary, h("h2", {}, "Collections and compactions"), history, h("h2", {}, "Data files"), files, pages);
  const sortButton = (key, label) =>
    h("button", {
      type: "button",
      class: "link",
      onclick: () => {
        state.order = state.sort === key && state.order === "asc" ? "desc" : "asc";
        state.sort = key;
        refresh();
      },
    }, label + (state.sort === key ? (state.order === "desc" ? " ▼" : " ▲") : ""));

  const refresh = async () => {
    const store = await get("/api/store");
    const page = await get(`/api/store/files${query({ ...state, limit: 50 })}`);
    if (!ctx.alive) return;
    const entries = [
      ["Store", `${store.kind}${store.directory ? ` in ${store.directory}` : ""}`],
      ["Checkpoint", position(store.checkpoint)],
      ["Head", position(store.head)],
      ["Files", `${num(store.files)} (${bytes(store.files_bytes)})`],
      ["Live", `${num(store.live_messages)} messages, ${bytes(store.live_bytes)}`],
      ["Last checkpoint", time(store.last_checkpoint_ms)],
      ["Last collection", time(store.last_gc_ms)],
      ["Last compaction", time(store.last_compaction_ms)],
      ["Since start", `${num(store.gc_deleted_files)} files deleted, ${num(store.gc_archived_files)} archived, ${num(store.compacted_files)} compacted, ${num(store.checkpoints)} checkpoints`],
      ["Archive", store.archive ? `${num(store.archive.files)} files, ${bytes(store.archive.bytes)} in ${store.archive.directory}` : "off"],
    ];
    if (!store.complete) entries.push(["Note", `live messages counted for the first ${num(store.messages_scanned)} only`]);
    fill(summary, ...entries.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    const events = [...store.history].reverse();
    fill(
      history,
      events.length
        ? h(
            "table",
            {},
            h("thead", {}, h("tr", {}, ["When", "Deleted", "Archived", "Compacted", "Checkpoints"].map((l) => h("th", {}, l)))),
            h("tbody", {}, events.map((e) => h("tr", {}, h("td", {}, time(e.at_ms)), h("td", { class: "num" }, num(e.deleted_files)), h("td", { class: "num" }, num(e.archived_files)), h("td", { class: "num" }, num(e.compacted_files)), h("td", { class: "num" }, num(e.checkpoints))))),
          )
        : h("p", { class: "muted" }, "none seen since the console's server started (sampled every few seconds)"),
    );
    const head = h(
      "tr",
      {},
      h("th", {}, sortButton("number", "File")),
      h("th", { class: "num" }, sortButton("size_bytes", "Size")),
      h("th", { class: "num" }, sortButton("live_messages", "Live messages")),
      h("th", {}, sortButton("live_bytes", "Live bytes")),
      h("th", {}, "What pins it"),
    );
    const rows = page.items.map((f) =>
      h(
        "tr",
        { class: f.head ? "head file" : "file" },
        h("td", {}, f.name),
        h("td", { class: "num" }, bytes(f.size_bytes)),
        h("td", { class: "num" }, num(f.live_messages)),
        h("td", {}, meter(f.live_bytes, f.data_bytes || f.size_bytes, bytes(f.live_bytes))),
        h("td", {}, pins(f)),
      ),
    );
    fill(files, h("table", {}, h("thead", {}, head), h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 5, class: "empty" }, store.kind === "memory" ? "the memory store has no files" : "no files")))));
    fill(pages, pager(page.total, page.offset, page.limit, (offset) => {
      state.offset = offset;
      refresh();
    }));
  };
  ctx.every(5000, refresh);
}
