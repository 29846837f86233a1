// Messages to the user: what an action did, or why it failed (as text, never markup).

import { ApiFailure } from "./api.js";

let timer = null;

export function toast(text, kind = "ok") {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = `toast ${kind}`;
  el.hidden = false;
  clearTimeout(timer);
  timer = setTimeout(() => {
    el.hidden = true;
  }, 6000);
}

export function showError(err) {
  toast(err instanceof ApiFailure ? `${err.message} (${err.status})` : String(err), "error");
}
