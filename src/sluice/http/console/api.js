// The console's client of the management API: same origin, the session cookie, the CSRF token
// on every state-changing request, and errors as the API words them.

let csrfToken = null;
let onUnauthorized = () => {};

export class ApiFailure extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function setCsrfToken(token) {
  csrfToken = token;
}

export function whenUnauthorized(fn) {
  onUnauthorized = fn;
}

/** A request; the answer's JSON, or an `ApiFailure`. */
export async function api(method, path, body) {
  const headers = { "X-Sluice-Console": "1", Accept: "application/json" };
  if (method !== "GET" && csrfToken) headers["X-CSRF-Token"] = csrfToken;
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiFailure(0, "unreachable", "the broker does not answer");
  }
  let data = null;
  const type = response.headers.get("Content-Type") || "";
  if (type.startsWith("application/json")) data = await response.json();
  if (!response.ok) {
    const error = (data && data.error) || {};
    const failure = new ApiFailure(response.status, error.code || "error", error.message || response.statusText);
    if (response.status === 401 && path !== "/api/session") onUnauthorized(failure);
    throw failure;
  }
  return data;
}

export const get = (path) => api("GET", path);

/** `/api/destinations/queue/NAME` for `/queue/NAME`. */
export function destinationPath(name) {
  const [, kind, ...rest] = name.split("/");
  return `/api/destinations/${kind}/${encodeURIComponent(rest.join("/"))}`;
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    if (Array.isArray(value)) value.forEach((v) => search.append(key, v));
    else search.append(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}
