// Streams in progress: who sends and who reads each, and a progress bar per reader (chunks
// acknowledged of the chunks the queue holds in memory; "of at least" until the end chunk came).

import { get, query } from "./api.js";
import { bytes, fill, h, meter, num, time } from "./dom.js";
import { destinationLink, pager } from "./destinations.js";

const state = { offset: 0 };

function progress(s) {
  if (s.last_chunk === null || s.last_chunk === undefined) return h("span", { class: "muted" }, "no chunk in memory");
  const total = s.last_chunk + 1;
  const done = s.resume_chunk ?? (s.delivered_chunk === null ? 0 : s.delivered_chunk + 1);
  const size = s.ended && s.length_bytes !== null ? `, ${bytes(s.length_bytes)}` : "";
  return meter(done, total, `${num(done)} of ${s.ended ? "" : "at least "}${num(total)} chunks${size}`);
}

export function streamsPage(ctx) {
  const box = h("div", { id: "streams-table" });
  const pages = h("div");
  fill(ctx.root, h("h1", {}, "Streams in progress"), box, pages);
  const refresh = async () => {
    const page = await get(`/api/streams${query({ offset: state.offset, limit: 50 })}`);
    if (!ctx.alive) return;
    const rows = page.items.map((s) =>
      h(
        "tr",
        { class: "stream", dataset: { id: s.stream_id } },
        h("td", {}, destinationLink(s.destination)),
        h("td", { class: "stream-id" }, s.stream_id),
        h("td", {}, s.sending ? (s.producer_connected ? "sending" : "sending (producer gone)") : "sent", h("div", { class: "muted" }, time(s.last_chunk_ms))),
        h("td", {}, s.reading, s.reader_connection !== null ? h("div", {}, h("a", { href: `#/connections/${s.reader_connection}` }, `connection ${s.reader_connection}`)) : null),
        h("td", { class: "num" }, num(s.chunks_in_flight)),
        h("td", { class: "num" }, s.resume_chunk === null ? "–" : `${num(s.resume_chunk)} (byte ${num(s.resume_offset)})`),
        h("td", { class: "progress" }, progress(s)),
      ),
    );
    const head = h("tr", {}, ["Destination", "Stream", "Sender", "Reader", "In flight", "Resumes at", "Progress"].map((l) => h("th", {}, l)));
    fill(box, h("table", {}, h("thead", {}, head), h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7, class: "empty" }, "no streams in progress")))));
    fill(pages, pager(page.total, page.offset, page.limit, (offset) => {
      state.offset = offset;
      refresh();
    }));
  };
  ctx.every(2000, refresh);
}
