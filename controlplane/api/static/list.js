"use strict";
// The experiments list: every experiment with its rollout at a glance, refreshed each second.
(() => {
  const { api, el, byId, pct, when, words } = Canary;
  const PAGE = 500;

  function stepText(e) {
    if (e.current_step < 0) return `– of ${e.steps.length}`;
    return `${e.current_step + 1} of ${e.steps.length}`;
  }

  function row(e) {
    const canary = e.canary_weight_bp;
    return el("tr", { "data-id": String(e.id), "data-state": e.state },
      el("td", {}, el("a", { href: `/ui/experiments/${e.id}`, text: `#${e.id} ${e.name}` })),
      el("td", { text: e.service }),
      el("td", {}, el("span", { class: `badge ${e.state}`, text: words(e.state) })),
      el("td", { text: stepText(e) }),
      el("td", { text: `${pct(10000 - canary)} / ${pct(canary)}` }),
      el("td", {}, el("span", { class: `badge ${e.breaker_state}`,
                                text: `${words(e.breaker_state)}${e.trips ? ` · ${e.trips} trip(s)` : ""}` })),
      el("td", { class: "muted", text: e.summary || e.last_reason || "–", title: e.last_reason || "" }),
      el("td", { class: "muted", text: when(e.updated_at) }),
    );
  }

  function query() {
    const params = new URLSearchParams({ limit: String(PAGE) });
    const service = byId("filter-service").value.trim();
    const state = byId("filter-state").value;
    if (service) params.set("service", service);
    if (state) params.set("state", state);
    return `/v1/experiments?${params}`;
  }

  async function refresh() {
    try {
      const page = await api(query());
      byId("experiment-rows").replaceChildren(...page.items.map(row));
      byId("count").textContent = page.total > page.items.length
        ? `${page.items.length} of ${page.total}` : `${page.total} experiment(s)`;
      byId("updated").textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
      byId("list-error").textContent = "";
    } catch (error) {
      byId("list-error").textContent = error.status === 422
        ? "That filter is not a valid service name." : error.message;
    }
  }

  window.addEventListener("DOMContentLoaded", async () => {
    await Canary.signedIn();
    const params = new URLSearchParams(location.search);
    byId("filter-service").value = params.get("service") || "";
    byId("filter-state").value = params.get("state") || "";
    for (const id of ["filter-service", "filter-state"]) {
      byId(id).addEventListener("change", () => {
        const shown = new URLSearchParams();
        if (byId("filter-service").value) shown.set("service", byId("filter-service").value);
        if (byId("filter-state").value) shown.set("state", byId("filter-state").value);
        history.replaceState(null, "", `?${shown}`);
        refresh();
      });
    }
    byId("experiments").hidden = false;
    Canary.poll(refresh);
  });
})();
