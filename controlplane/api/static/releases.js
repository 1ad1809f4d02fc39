"use strict";
// A service's stable version and its release history (decision 0051): the card on the
// experiment page that reads /v1/services/{service}/releases, and nothing else.
const Releases = (() => {
  const { api, el, byId, when, words } = Canary;
  const SHOWN = 10;

  const version = (v) => (!v ? "none" : v.version ? `${v.version} (${v.upstream})` : v.upstream);

  function experimentLink(experimentId) {
    if (experimentId === null || experimentId === undefined) return el("span", { text: "–" });
    return el("a", { href: `/ui/experiments/${experimentId}`, text: `#${experimentId}` });
  }

  function stableText(history) {
    const stable = history.stable;
    if (!stable) {
      return `${history.service} has no stable version yet: its first experiment names the `
        + "baseline, which becomes stable when it starts.";
    }
    const by = stable.experiment_id === null ? "" : ` (experiment #${stable.experiment_id})`;
    return `Stable version: ${version(stable)}, since ${when(stable.since)}${by}.`;
  }

  async function load(service) {
    byId("releases-service").textContent = service;
    const history = await api(
      `/v1/services/${encodeURIComponent(service)}/releases?limit=${SHOWN}`);
    byId("stable-version").textContent = stableText(history);
    const rows = history.items.map((r) => el("tr", { "data-kind": r.kind },
      el("td", { class: "muted", text: when(r.at) }),
      el("td", {}, el("span", { class: `badge ${r.kind}`, text: words(r.kind) })),
      el("td", {}, experimentLink(r.experiment_id)),
      el("td", { text: version(r.stable_before) }),
      el("td", { text: version(r.stable_after) }),
      el("td", { text: r.actor }),
    ));
    if (!rows.length) {
      rows.push(el("tr", {}, el("td", { colSpan: 6, class: "muted", text: "No release yet." })));
    }
    byId("release-rows").replaceChildren(...rows);
  }

  return { load };
})();
