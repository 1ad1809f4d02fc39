"use strict";
// What both pages share: the signed-in token, API calls, formatting.
// The token lives in sessionStorage (this tab only) and travels in the Authorization
// header: the browser never attaches it by itself, so another site cannot use it.

const Canary = (() => {
  const TOKEN_KEY = "canary.token";
  const POLL_MS = 1000;

  const token = () => sessionStorage.getItem(TOKEN_KEY);
  const setToken = (value) => sessionStorage.setItem(TOKEN_KEY, value);
  const clearToken = () => sessionStorage.removeItem(TOKEN_KEY);

  class ApiError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
    }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json", ...(options.headers || {}) };
    const current = token();
    if (current) headers.Authorization = `Bearer ${current}`;
    const init = { method: options.method || "GET", headers, cache: "no-store",
                   credentials: "omit" };
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    const response = await fetch(path, init);
    const text = await response.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
    if (!response.ok) {
      const error = new ApiError(response.status, body);
      if (response.status === 401) {
        showSignIn(`The API refused this token (${error.message}). Check it, or create one `
                   + "with `canary token create`, and sign in again.");
      }
      throw error;
    }
    return body;
  }

  // --- DOM helpers: text only, never HTML from data
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const byId = (id) => document.getElementById(id);

  // --- formatting
  const pct = (bp) => `${(bp / 100).toLocaleString(undefined, { maximumFractionDigits: 2 })} %`;
  function ms(value) {
    if (value === null || value === undefined) return "–";
    return value >= 100 ? `${Math.round(value)} ms` : `${value.toFixed(1)} ms`;
  }
  const ratio = (value) => (value === null || value === undefined ? "–"
                            : `${(value * 100).toFixed(2)} %`);
  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return d.toLocaleString(undefined, { hour12: false });
  }
  function fromNow(iso) {
    if (!iso) return "";
    const sec = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
    const abs = Math.abs(sec);
    const text = abs < 90 ? `${abs} s` : abs < 5400 ? `${Math.round(abs / 60)} min`
                 : `${(abs / 3600).toFixed(1)} h`;
    return sec >= 0 ? `in ${text}` : `${text} ago`;
  }
  const words = (snake) => String(snake).replace(/_/g, " ");

  // --- sign-in, shared by both pages
  function showSignIn(message) {
    clearToken();
    const section = byId("sign-in");
    if (!section) return;
    for (const node of document.querySelectorAll("main > section")) node.hidden = true;
    section.hidden = false;
    byId("sign-in-error").textContent = message || "";
    byId("sign-out").hidden = true;
    byId("who").textContent = "";
  }

  // Resolves with the caller's identity ({actor, role, may}) once signed in.
  function signedIn() {
    return new Promise((resolve) => {
      const form = byId("sign-in-form");
      const attempt = async () => {
        try {
          const me = await api("/v1/me");
          byId("sign-in").hidden = true;
          byId("who").textContent = `${me.actor} · ${me.role}`;
          const out = byId("sign-out");
          out.hidden = false;
          out.onclick = () => { clearToken(); location.reload(); };
          byId("token").value = "";
          resolve(me);
        } catch (error) {
          // a 401 has already said why (api() above): saying it again would blank it
          if (error.status !== 401) {
            showSignIn(error.status ? error.message : `The API could not be reached: ${error.message}`);
          }
        }
      };
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        const value = byId("token").value.trim();
        if (!value) return;
        setToken(value);
        attempt();  // the field keeps what was typed until it is accepted, to correct it
      });
      if (token()) attempt(); else showSignIn("");
    });
  }

  // Call `tick` now and every POLL_MS after it finishes (never two at once).
  function poll(tick) {
    const run = async () => {
      try { await tick(); } finally { setTimeout(run, POLL_MS); }
    };
    run();
  }

  return { api, ApiError, el, byId, pct, ms, ratio, when, fromNow, words, signedIn, poll };
})();
