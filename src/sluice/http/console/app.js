// The console's shell: who is logged in, the login form, the pages by the URL's hash, and the
// timers of the page on view (stopped when another is shown).

import { ApiFailure, api, get, setCsrfToken, whenUnauthorized } from "./api.js";
import { fill, h } from "./dom.js";
import { connectionsPage, subscriptionsPage } from "./connections.js";
import { destinationPage, destinationsPage } from "./destinations.js";
import { journalPage } from "./journal.js";
import { showError } from "./notify.js";
import { overviewPage } from "./overview.js";
import { streamsPage } from "./streams.js";

const $ = (id) => document.getElementById(id);

/** What a page gets: where to draw, who is there, timers that end with the page. */
class PageContext {
  constructor(root, who) {
    this.root = root;
    this.who = who;
    this.alive = true;
    this.timers = new Set();
  }

  /** Run `fn` now and every `ms` after it finishes, while the page is shown. */
  every(ms, fn) {
    const run = async () => {
      if (!this.alive) return;
      try {
        await fn();
      } catch (err) {
        if (!(err instanceof ApiFailure && err.status === 401)) showError(err);
      }
      if (this.alive) {
        const timer = setTimeout(() => {
          this.timers.delete(timer);
          run();
        }, ms);
        this.timers.add(timer);
      }
    };
    run();
  }

  /** The page drew its data the first time (a mark for Navigation Timing measurements). */
  rendered() {
    if (this.marked) return;
    this.marked = true;
    performance.mark(`sluice:rendered:${document.body.dataset.page}`);
  }

  stop() {
    this.alive = false;
    for (const timer of this.timers) clearTimeout(timer);
  }
}

const PAGES = {
  overview: overviewPage,
  destinations: destinationsPage,
  destination: destinationPage,
  connections: connectionsPage,
  subscriptions: subscriptionsPage,
  streams: streamsPage,
  journal: journalPage,
};
const BROKER_PAGES = new Set(["overview", "connections", "journal"]);

let who = null;
let current = null;

function route() {
  if (!who) return;
  // `#/PAGE/ARGUMENT`: the argument (a destination's name) percent-encoded whole.
  const hash = location.hash.replace(/^#\/?/, "");
  const cut = hash.indexOf("/");
  let name = cut < 0 ? hash : hash.slice(0, cut);
  let argument = "";
  try {
    argument = cut < 0 ? "" : decodeURIComponent(hash.slice(cut + 1));
  } catch (err) {
    name = "";
  }
  if (!PAGES[name]) name = who.broker.read ? "overview" : "destinations";
  if (BROKER_PAGES.has(name) && !who.broker.read) name = "destinations";
  if (current) current.stop();
  const main = $("main");
  fill(main);
  current = new PageContext(main, who);
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === name || (name === "destination" && link.dataset.page === "destinations"));
  }
  document.body.dataset.page = name;
  Promise.resolve(PAGES[name](current, argument)).catch(showError);
}

function showWho() {
  $("nav").hidden = false;
  for (const page of BROKER_PAGES) {
    document.querySelector(`#nav a[data-page="${page}"]`).hidden = !who.broker.read;
  }
  fill($("who"), h("span", { id: "who-user" }, who.user), who.groups.length ? ` (${who.groups.join(", ")})` : "");
  $("logout").hidden = who.via !== "session";
  $("login").hidden = true;
  $("main").hidden = false;
}

function showLogin(message) {
  who = null;
  setCsrfToken(null);
  if (current) current.stop();
  current = null;
  fill($("main"));
  $("main").hidden = true;
  $("nav").hidden = true;
  $("logout").hidden = true;
  fill($("who"));
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("login-user").focus();
}

function loggedIn(answer) {
  who = answer;
  setCsrfToken(answer.csrf_token);
  showWho();
  route();
}

async function start() {
  whenUnauthorized((failure) => showLogin(failure.message));
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("login-error").textContent = "";
    $("login-submit").disabled = true;
    try {
      const answer = await api("POST", "/api/session", {
        login: $("login-user").value,
        passcode: $("login-password").value,
      });
      $("login-password").value = "";
      loggedIn(answer);
    } catch (err) {
      $("login-error").textContent = err.message;
    } finally {
      $("login-submit").disabled = false;
    }
  });
  $("logout").addEventListener("click", async () => {
    try {
      await api("DELETE", "/api/session");
    } finally {
      showLogin("Logged out.");
    }
  });
  window.addEventListener("hashchange", route);
  try {
    loggedIn(await get("/api/whoami"));
  } catch (err) {
    if (!(err instanceof ApiFailure && err.status === 401)) showLogin(err.message);
  }
}

start();
