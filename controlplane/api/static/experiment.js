"use strict";
// One experiment: its rollout now, its history as plots, its events, and the actions
// the caller's role allows. The API re-checks the role of every action it receives.
(() => {
  const { api, el, byId, pct, ms, ratio, when, fromNow, words } = Canary;
  const id = Number(location.pathname.split("/").filter(Boolean).pop());
  const EVENTS_SHOWN = 200;
  const SLOW_EVERY_MS = 30000;

  // which actions a state allows (architecture §7), in the order the buttons appear
  const ACTIONS = [
    { action: "pause", label: "Pause", from: ["running"],
      text: "The canary keeps its current weight and the controller stops moving it." },
    { action: "resume", label: "Resume", from: ["paused"],
      text: "The controller evaluates the canary again from where it stopped." },
    { action: "promote", label: "Promote", from: ["running", "paused"],
      text: "The canary takes 100 % of the traffic now, skipping the remaining steps." },
    { action: "rollback", label: "Roll back", from: ["running", "paused"],
      text: "The canary's weight goes to 0 % and the experiment ends as rolled back." },
    { action: "abort", label: "Abort", from: ["draft", "running", "paused"],
      text: "The experiment ends; any canary traffic goes back to the baseline." },
  ];

  let me = null;
  let experiment = null;
  let plots = null;
  let events = { total: 0, items: [] };
  let slowAt = 0;

  // --- facts and timeline ---------------------------------------------------------

  function fact(key, value, attrs = {}) {
    return el("div", { class: "fact", ...attrs }, el("div", { class: "k", text: key }),
              el("div", { class: "v", text: value }));
  }

  function nextText(live) {
    // a probe's verdict waits for its samples too: the API's estimate says how long
    if (live.probe) return live.probe.sentence;
    if (!live.next_check_at) return "nothing due";
    const what = { step_due: "next step", cooldown_end: "probe (cooldown ends)",
                   probe_due: "probe verdict", controller_recheck: "controller looks again" };
    return `${what[live.next_check_for] || words(live.next_check_for)} ${fromNow(live.next_check_at)}`;
  }

  function renderFacts(e) {
    const live = e.live;
    const trips = live.max_trips ? `${live.trips} of ${live.max_trips}` : String(live.trips);
    const snap = live.snapshots || {};
    const canary = snap.canary, baseline = snap.baseline;
    // requests the sidecars shed are not in n: they are named beside it (decision 0025)
    const shed = (s) => (s.shed ? ` · shed ${s.shed} (${ratio(s.shed_share)})` : "");
    byId("facts").replaceChildren(
      fact("Service", e.service),
      fact("Weights (baseline / canary)", `${pct(live.baseline_weight_bp)} / ${pct(live.canary_weight_bp)}`),
      fact("Breaker", `${words(live.breaker_state)} · trips ${trips}`, { "data-breaker": live.breaker_state }),
      fact("Next", nextText(live)),
      fact("Canary now", canary ? `P95 ${ms(canary.p95_ms)} · failed ${ratio(canary.failure_ratio)} · n=${canary.count}${shed(canary)}` : "no window"),
      fact("Baseline now", baseline ? `P95 ${ms(baseline.p95_ms)} · failed ${ratio(baseline.failure_ratio)} · n=${baseline.count}${shed(baseline)}` : "no window"),
      fact("Route", e.route_applied === null ? (e.route_note || "none yet")
           : (e.route_applied ? `revision ${e.route_revision} in etcd` : `revision ${e.route_revision} pending`)
             + (e.route_confirmation ? ` · ${e.route_confirmation.sentence}` : "")),
      fact("Standing", live.summary || "–", { class: "fact wide", "data-summary": "" }),
      fact("Last decision", live.last_reason || "–", { class: "fact wide" }),
      ...(live.overload_held
        ? [fact("Overload", "held: the baseline's sidecars are shedding requests", { class: "fact wide", "data-overload": "held" })]
        : []),
      // a guardrail whose action is pause holds the weight until it is clean again
      ...(live.held_by && live.held_by.length
        ? [fact("Paused by guardrail", `held by ${live.held_by.join(", ")}${live.held_since ? ` since ${new Date(live.held_since).toLocaleTimeString()}` : ""}: ${live.held_reason || "breached"}`,
                { class: "fact wide", "data-held-by": live.held_by.join(",") })]
        : []),
    );
    const notes = [live.rule_note, live.snapshots_note, live.snapshots_error].filter(Boolean);
    byId("page-error").textContent = notes.join(" · ");
  }

  function renderTimeline(e) {
    const live = e.live;
    const current = live.step ? live.step.index : -1;
    const ended = ["promoted", "rolled_back", "aborted"].includes(e.state);
    const steps = e.steps.map((s, i) => {
      const state = i < current || (e.state === "promoted") ? "done" : i === current && !ended ? "current" : "";
      const node = el("div", { class: `step ${state}`, "data-step": String(i) });
      if (state === "current" && live.step.started_at && s.hold_sec > 0) {
        const done = (Date.now() - new Date(live.step.started_at).getTime()) / 1000 / s.hold_sec;
        const fill = el("div", { class: "fill" });
        fill.style.width = `${Math.min(Math.max(done, 0), 1) * 100}%`;
        node.append(fill);
      }
      const due = state === "current" && live.step.due_at ? ` · due ${fromNow(live.step.due_at)}` : "";
      node.append(el("span", { text: `${i + 1}: ${s.weight_pct} % · hold ${s.hold_sec} s${due}` }));
      return node;
    });
    byId("timeline").replaceChildren(...steps);
  }

  // --- actions --------------------------------------------------------------------

  function renderActions(e) {
    const box = byId("actions");
    const allowed = me && me.may.includes("operator");
    box.hidden = !allowed;
    if (!allowed) { box.replaceChildren(); return; }
    const buttons = ACTIONS.filter((a) => a.from.includes(e.state)).map((a) =>
      el("button", { type: "button", class: "action", text: a.label, "data-action": a.action,
                     onclick: () => confirmAction(a) }));
    box.replaceChildren(...buttons);
  }

  function confirmAction(a) {
    const dialog = byId("confirm");
    byId("confirm-title").textContent = `${a.label}: #${experiment.id} ${experiment.name}?`;
    byId("confirm-text").textContent = a.text;
    byId("confirm-reason").value = "";
    byId("confirm-error").textContent = "";
    byId("confirm-ok").textContent = a.label;
    byId("confirm-cancel").onclick = () => dialog.close();
    byId("confirm-form").onsubmit = async (event) => {
      event.preventDefault();
      const reason = byId("confirm-reason").value.trim();
      if (!reason) { byId("confirm-error").textContent = "Say why: it goes into the audit trail."; return; }
      try {
        await api(`/v1/experiments/${id}/${a.action}`, { method: "POST", body: { reason } });
        dialog.close();
        await refresh(true);
      } catch (error) {
        byId("confirm-error").textContent = error.message;
      }
    };
    dialog.showModal();
  }

  // --- events ---------------------------------------------------------------------

  function flatten(value, prefix, out) {
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
    } else {
      out.push([prefix, value]);
    }
    return out;
  }

  const TIME_KEYS = /(^|_)(at|ts)$/;

  function readable(key, value) {
    if (value === null || value === undefined) return "–";
    if (Array.isArray(value)) return value.length > 8 ? `${value.length} values` : value.join(", ");
    if (typeof value === "number") {
      const last = key.split(".").pop();
      if (TIME_KEYS.test(last) && value > 1e9) return when(new Date(value * 1000).toISOString());
      if (/_ms$/.test(last)) return ms(value);
      if (/_bp(_|$)/.test(last)) return pct(value);
      return Number.isInteger(value) ? String(value) : value.toPrecision(4);
    }
    return String(value);
  }

  const SHOWN_EVIDENCE = 12;

  function evidence(payload) {
    // the numbers behind the decision first; the rule and the leadership are context
    const { rule, leader_fence: _fence, ...rest } = payload || {};
    const rows = flatten(rest, "", [])
      .map(([key, value]) => [key.replace(/^evidence\./, ""), value])
      .filter(([key, value]) => value !== null && value !== undefined && !key.startsWith("rule."));
    const list = (entries) => {
      const dl = el("dl", { class: "evidence" });
      for (const [key, value] of entries) {
        dl.append(el("dt", { text: words(key).replace(/\./g, " · ") }),
                  el("dd", { text: readable(key, value) }));
      }
      return dl;
    };
    const box = el("div", {}, list(rows.slice(0, SHOWN_EVIDENCE)));
    if (rows.length > SHOWN_EVIDENCE) {
      box.append(el("details", {}, el("summary", { text: `${rows.length - SHOWN_EVIDENCE} more` }),
                    list(rows.slice(SHOWN_EVIDENCE))));
    }
    if (rule) {
      box.append(el("p", { class: "muted", text: `rule: P${rule.percentile} ≤ ${ms(rule.threshold_ms)}, `
        + `failed ≤ ${ratio(rule.failure_ratio)}, window ${rule.window_sec} s, `
        + `${rule.consecutive_breaches} breaches in a row, cooldown ${rule.cooldown_sec} s` }));
    }
    return box;
  }

  // a trip and an overload hold are different events, and look it
  const BADGES = { tripped: "open", overload_hold: "paused", overload_cleared: "closed",
                   guardrail_hold: "paused", guardrail_released: "closed" };

  function renderEvents() {
    // data-label: on a narrow screen each row stacks, its cells named (dashboard.css)
    const rows = [...events.items].reverse().map((e) => el("tr", { "data-kind": e.kind },
      el("td", { class: "muted", text: when(e.at), "data-label": "When" }),
      el("td", { "data-label": "Event" },
         el("span", { class: `badge ${BADGES[e.kind] || ""}`, text: words(e.kind) })),
      el("td", { text: e.actor, "data-label": "By" }),
      el("td", { text: e.from_state || e.to_state ? `${words(e.from_state || "")} → ${words(e.to_state || "")}` : "",
                 "data-label": "State" }),
      el("td", { text: e.summary || e.reason, title: e.reason, "data-label": "Reason" }),
      el("td", { "data-label": "Evidence" }, evidence(e.payload)),
    ));
    byId("event-rows").replaceChildren(...rows);
  }

  async function loadEvents() {
    const offset = Math.max(0, events.total - EVENTS_SHOWN);
    let page = await api(`/v1/experiments/${id}/events?limit=${EVENTS_SHOWN}&offset=${offset}`);
    if (page.total > offset + page.items.length) {
      page = await api(`/v1/experiments/${id}/events?limit=${EVENTS_SHOWN}&offset=${Math.max(0, page.total - EVENTS_SHOWN)}`);
    }
    events = page;
    renderEvents();
  }

  // --- notifications ----------------------------------------------------------------

  function deliveryAnswer(d) {
    if (d.last_status !== null) return `HTTP ${d.last_status}${d.last_error ? ` · ${d.last_error}` : ""}`;
    return d.last_error || "";
  }

  function deliveryWhen(d) {
    if (d.status === "delivered" && d.delivered_at) return `delivered ${when(d.delivered_at)}`;
    if (d.status === "pending" && d.next_attempt_at) return `next try ${when(d.next_attempt_at)}`;
    return d.last_attempt_at ? `last try ${when(d.last_attempt_at)}` : when(d.created_at);
  }

  async function loadDeliveries() {
    const page = await api(`/v1/notifications/deliveries?experiment=${id}&limit=${EVENTS_SHOWN}`);
    const rows = page.items.map((d) => el("tr", { "data-status": d.status },
      el("td", { text: `#${d.event_id} ${words(d.kind)}` }),
      el("td", { text: d.subscription_name }),
      el("td", {}, el("span", { class: `badge ${d.status === "failed" ? "open" : ""}`, text: d.status })),
      el("td", { text: String(d.attempts) }),
      el("td", { text: deliveryAnswer(d) }),
      el("td", { class: "muted", text: deliveryWhen(d) }),
    ));
    if (!rows.length) {
      rows.push(el("tr", {}, el("td", { colSpan: 6, class: "muted",
        text: "No notification for this experiment: no subscription wants its events yet." })));
    }
    byId("delivery-rows").replaceChildren(...rows);
  }

  // --- plots and the recommendation -------------------------------------------------

  function points() {
    const width = byId("plot-latency").clientWidth || 1000;
    return Math.max(50, Math.min(1000, Math.floor(width / 2)));
  }

  // The whole range merged server-side now and then; in between, each poll asks only
  // for the seconds from the newest point on and appends them (a few rows, not a day).
  const FULL_EVERY_MS = 60000;
  const METRIC_LAG_SEC = 30;
  let history = null;
  let historyAt = 0;

  function appendTail(into, tail, newest) {
    // the tail starts at the newest second already shown, so that an event of that
    // second is not missed; its point is not taken twice
    const skip = tail.t.filter((t) => t <= newest).length;
    const keys = ["t", "span_sec", "window_sec", "canary_weight_bp", "threshold_ms", "failure_bound"];
    for (const key of keys) into[key].push(...tail[key].slice(skip));
    for (const name of Object.keys(into.variants)) {
      for (const [key, values] of Object.entries(tail.variants[name])) {
        into.variants[name][key].push(...values.slice(skip));
      }
    }
    // a metric's readings have seconds of their own: only the newer ones are taken
    for (const [name, series] of Object.entries(tail.metrics || {})) {
      const have = into.metrics[name];
      if (!have) { into.metrics[name] = series; continue; }
      const last = have.at.length ? have.at[have.at.length - 1] : -Infinity;
      const from = series.at.filter((t) => t <= last).length;
      for (const key of ["at", "span_sec", "baseline", "canary", "bound"]) {
        have[key].push(...series[key].slice(from));
      }
    }
    const seen = new Set(into.marks.map((m) => `${m.at}/${m.kind}`));
    into.marks.push(...tail.marks.filter((m) => !seen.has(`${m.at}/${m.kind}`)));
  }

  async function loadHistory() {
    const newest = history && history.t.length ? history.t[history.t.length - 1] : null;
    if (newest === null || Date.now() - historyAt > FULL_EVERY_MS) {
      history = await api(`/v1/experiments/${id}/history?points=${points()}`);
      historyAt = Date.now();
    } else {
      // a metric's reading is stamped when it was read and may land a little after
      // newer windows: the tail reaches back a little; what is shown is not taken twice
      const from = newest - METRIC_LAG_SEC;
      appendTail(history, await api(`/v1/experiments/${id}/history?from=${from}`), newest);
    }
    if (plots === null) {
      plots = { latency: Plots.latency(byId("plot-latency")),
                failures: Plots.failures(byId("plot-failures")),
                rate: Plots.rate(byId("plot-rate")) };
      window.addEventListener("resize", () => Object.values(plots).forEach((p) => p.resize()));
    }
    const data = Plots.columns(history);
    for (const [name, plot] of Object.entries(plots)) plot.update(data[name], history.marks);
    renderMetricPlots();
  }

  // one plot per provider metric, under the samples' plots, with the same marks
  const metricPlots = new Map();

  function renderMetricPlots() {
    const metrics = history.metrics || {};
    const names = Object.keys(metrics).sort();
    byId("metrics").hidden = names.length === 0;
    // one time axis for all: the windows' and every metric's seconds
    const ends = [history.t, ...names.map((n) => metrics[n].at)].filter((t) => t.length);
    const xrange = ends.length
      ? [Math.min(...ends.map((t) => t[0])), Math.max(...ends.map((t) => t[t.length - 1]))]
      : null;
    for (const name of names) {
      const series = metrics[name];
      if (!metricPlots.has(name)) {
        const box = el("div", { class: "plot", id: `plot-metric-${name}`, "data-metric": name,
                                "data-kind": series.kind, "data-points": "0" });
        const what = series.compare === "baseline" ? "bound: the baseline's value with the margin"
          : "bound: the rule's";
        byId("metric-plots").append(el("div", { class: "half" },
          el("h3", {}, el("span", { text: `${name} ` }),
             el("span", { class: "muted", text: `· ${series.kind} · ${what}` })), box));
        metricPlots.set(name, Plots.metric(box, series.kind));
      }
      metricPlots.get(name).update(Plots.metricColumns(series), history.marks, xrange);
    }
  }

  window.addEventListener("resize", () => metricPlots.forEach((p) => p.resize()));

  async function loadSlow(e) {
    const service = encodeURIComponent(e.service);
    let rule = e.rule;
    // the service's rule only when the live view says one is in force: asking for a
    // rule that does not exist would be a 404 in the console on every slow poll
    if (!rule && e.live.rule_source === "service") {
      try { rule = await api(`/v1/services/${service}/rule`); } catch (_) { rule = null; }
    }
    byId("latency-note").textContent = rule
      ? `· the threshold applies to P${rule.percentile} over ${rule.window_sec} s windows`
      : "· no breaker rule in force";
    byId("rec-service").textContent = e.service;
    const box = byId("recommendation");
    try {
      // partial: a young service answers "not ready" as a 200, not a 409 each time
      const rec = await api(`/v1/services/${service}/rule/recommendation?windows=true&partial=true`);
      box.replaceChildren(rec.ready === false
        ? el("p", { class: "muted", "data-ready": "false",
                    text: `Not enough baseline history yet: ${rec.windows_found} of ${rec.windows_needed} non-overlapping windows.` })
        : renderRecommendation(rec));
    } catch (error) {
      box.replaceChildren(el("p", { class: "muted", text: error.message }));
    }
  }

  let recPlot = null;

  function renderRecommendation(rec) {
    const current = rec.current;
    const list = el("dl", { class: "evidence" });
    const add = (k, v) => list.append(el("dt", { text: k }), el("dd", { text: v }));
    add(`threshold (P${rec.percentile})`,
        `${ms(rec.threshold_ms)}${current ? ` (now ${ms(current.threshold_ms)})` : ""}`);
    add("failure ratio",
        `${ratio(rec.failure_ratio)}${current ? ` (now ${ratio(current.failure_ratio)})` : ""}`);
    add("from", `${rec.windows} non-overlapping baseline windows of ${rec.window_sec.join(", ")} s, `
        + `${when(new Date(rec.from_ts * 1000).toISOString())} to ${when(new Date(rec.to_ts * 1000).toISOString())}`);
    add("how", `P${rec.latency.quantile} of the per-window ${words(rec.latency.metric)} × ${rec.latency.multiplier}`);
    const windows = rec.per_window || [];
    const box = el("div", { id: "plot-recommendation", class: "plot" });
    const data = [windows.map((w) => w.ts), windows.map((w) => w.latency_ms),
                  windows.map(() => rec.threshold_ms),
                  windows.map(() => (current ? current.threshold_ms : null))];
    recPlot = Plots.recommendation(box);
    requestAnimationFrame(() => recPlot.update(data, []));
    return el("div", {}, list, box);
  }

  // --- the loop -------------------------------------------------------------------

  async function refresh(forceSlow = false) {
    try {
      const e = await api(`/v1/experiments/${id}`);
      experiment = e;
      document.title = `canary · #${e.id} ${e.name}`;
      byId("name").textContent = `#${e.id} ${e.name}`;
      const state = byId("state");
      state.textContent = words(e.state); state.className = `badge ${e.state}`;
      const breaker = byId("breaker");
      breaker.textContent = `breaker ${words(e.live.breaker_state)}`;
      breaker.className = `badge ${e.live.breaker_state}`;
      renderFacts(e);
      renderTimeline(e);
      renderActions(e);
      byId("experiment").hidden = false;
      await Promise.all([loadHistory(), loadEvents(), loadDeliveries(),
                         Releases.load(e.service)]);
      if (forceSlow || Date.now() - slowAt > SLOW_EVERY_MS) {
        slowAt = Date.now();
        await loadSlow(e);
      }
      byId("updated").textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
    } catch (error) {
      if (error.status === 404) byId("page-error").textContent = `No experiment #${id}.`;
      else if (error.status !== 401) byId("page-error").textContent = error.message;
      byId("experiment").hidden = error.status === 401;
    }
  }

  window.addEventListener("DOMContentLoaded", async () => {
    me = await Canary.signedIn();
    Canary.poll(refresh);
  });
})();
