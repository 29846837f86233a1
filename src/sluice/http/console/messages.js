// A queue's messages, browsed without consuming them: headers, a preview of the body (shown as
// text whatever it holds), a download of the whole body; and the selected ones moved, copied,
// sent back to where they came from (dead letters), or deleted.

import { api, get, query } from "./api.js";
import { bytes, confirmButton, fill, h, num, time } from "./dom.js";
import { showError, toast } from "./notify.js";

const LIMIT = 20;

function headerList(headers) {
  const entries = Object.entries(headers);
  if (!entries.length) return "";
  return h(
    "dl",
    { class: "headers" },
    entries.flatMap(([key, value]) => [h("dt", {}, key), h("dd", {}, value)]),
  );
}

export function messagesPanel(ctx, name, path, deadLetters) {
  const selected = new Set();
  const box = h("div", { id: "messages-table" });
  const status = h("span", { class: "selection", id: "messages-selection" });
  const target = h("input", { id: "move-target", placeholder: "/queue/TARGET", list: "" });
  let cursors = [0];
  let next = null;
  let items = [];

  async function load() {
    const after = cursors[cursors.length - 1];
    const page = await get(`${path}/messages${query({ after, limit: LIMIT, preview: 512 })}`);
    items = page.items;
    next = page.next_after;
    render();
  }

  function updateStatus() {
    status.textContent = selected.size ? `${selected.size} selected` : "none selected";
  }

  function render() {
    const rows = items.map((m) => {
      const box = h("input", {
        type: "checkbox",
        class: "pick",
        checked: selected.has(m.message_id),
        dataset: { id: m.message_id },
        onchange: (event) => {
          if (event.target.checked) selected.add(m.message_id);
          else selected.delete(m.message_id);
          updateStatus();
        },
      });
      const download = h(
        "a",
        { href: `${path}/messages/${encodeURIComponent(m.message_id)}/body`, download: `${m.message_id}.bin`, class: "download" },
        "download",
      );
      const preview = h("pre", { class: "preview" }, m.body_preview);
      const more = m.body_bytes > m.body_preview.length ? h("div", { class: "muted" }, `… ${bytes(m.body_bytes)} in all`) : null;
      return h(
        "tr",
        { class: m.in_flight ? "in-flight message" : "message", dataset: { id: m.message_id } },
        h("td", {}, box),
        h("td", { class: "num" }, num(m.seq)),
        h("td", {}, h("div", { class: "message-id" }, m.message_id), h("div", { class: "muted" }, time(m.timestamp_ms))),
        h("td", {}, `p${m.priority}${m.persistent ? ", persistent" : ""}${m.in_flight ? ", in flight" : ""}`, h("div", { class: "muted" }, `delivered ${m.delivery_count}×`)),
        h("td", {}, headerList(m.headers)),
        h("td", { class: "body" }, preview, more, download),
      );
    });
    const head = h("tr", {}, ["", "Seq", "Message", "State", "Headers", "Body"].map((label) => h("th", {}, label)));
    fill(
      box,
      h(
        "table",
        { class: "messages" },
        h("thead", {}, head),
        h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 6, class: "empty" }, "no messages"))),
      ),
      h(
        "div",
        { class: "pager" },
        h("button", { type: "button", class: "prev", disabled: cursors.length < 2, onclick: () => { cursors.pop(); load().catch(showError); } }, "‹ Previous"),
        h("button", { type: "button", class: "next", disabled: next === null, onclick: () => { cursors.push(next); load().catch(showError); } }, "Next ›"),
      ),
    );
    updateStatus();
  }

  async function operate(action, extra = {}) {
    if (!selected.size) {
      toast("Select messages first", "error");
      return;
    }
    try {
      const answer = await api("POST", `${path}/messages/${action}`, { ids: [...selected], ...extra });
      const done = answer.moved ?? answer.copied ?? answer.retried ?? answer.deleted ?? 0;
      const skipped = Object.entries(answer.skipped || {}).map(([why, n]) => `${n} skipped: ${why}`);
      toast([`${action}: ${num(done)} of ${num(answer.matched)} messages`, ...skipped].join("; "));
      if (action !== "copy") selected.clear();
      await load();
    } catch (err) {
      showError(err);
    }
  }

  const tools = h(
    "div",
    { class: "tools", id: "message-actions" },
    status,
    h("button", { type: "button", id: "messages-refresh", onclick: () => load().catch(showError) }, "Refresh"),
    deadLetters ? h("button", { type: "button", id: "messages-retry", onclick: () => operate("retry") }, "Send back to original queue") : null,
    target,
    h("button", { type: "button", id: "messages-move", onclick: () => operate("move", { to: target.value.trim() }) }, "Move to"),
    h("button", { type: "button", id: "messages-copy", onclick: () => operate("copy", { to: target.value.trim() }) }, "Copy to"),
    confirmButton("Delete selected", () => operate("delete"), { name: "delete-selected" }),
  );
  load().catch(showError);
  return h("section", { class: "panel", id: "messages-panel" }, h("h2", {}, `Messages of ${name}`), tools, box);
}
