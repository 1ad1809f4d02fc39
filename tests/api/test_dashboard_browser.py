"""The dashboard and /docs in a real headless Chromium, against a real control plane
(etcd and Redis real, SQLite for the store) fed real sample batches.

Chromium is Debian's (/usr/bin/chromium, or CANARY_TEST_CHROMIUM), driven by
Playwright; nothing is downloaded, and every request to another origin is refused
and counted, so the pages are shown to work offline. Screenshots go to
CANARY_SCREENSHOT_DIR (docs/images when refreshing the documentation's), else to the
test's temporary directory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.auth.roles import Role
from controlplane.db import migrate
from controlplane.kernel.routes import parse_route
from controlplane.kernel.settings import Settings
from tests.conftest import ETCD, REDIS, unique
from tests.support.auth import TOKENS, bearer, install_test_tokens
from tests.support.live_api import LiveApi, SampleFeeder, Traffic, live_api
from tests.support.webhooks import Receiver, receiving

CHROMIUM = os.environ.get("CANARY_TEST_CHROMIUM", "/usr/bin/chromium")
SLOW = 600.0  # ms: far over the threshold below
RULE = {
    "threshold_ms": 200,
    "window_sec": 5,
    "min_samples": 50,
    "cooldown_sec": 3600,
    "consecutive_breaches": 2,
    "max_trips": 3,
}
STEPS = [
    {"weight_pct": 10, "hold_sec": 3600},
    {"weight_pct": 50, "hold_sec": 3600},
    {"weight_pct": 100, "hold_sec": 0},
]
WAIT_MS = 60_000  # generous: the machine may be shared; the waits end on a condition

playwright_sync = pytest.importorskip("playwright.sync_api")
playwright_sync.expect.set_options(timeout=WAIT_MS)
pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists(),
        reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)",
    ),
]


@dataclass
class Plane:
    api: LiveApi
    feeder: SampleFeeder
    settings: Settings
    receiver: Receiver  # the webhook receiver of the payments service's subscription
    experiments: dict[str, int] = field(default_factory=dict)

    def http(self, role: Role = Role.ADMIN) -> httpx.Client:
        return httpx.Client(base_url=self.api.base, headers=bearer(role), timeout=10)

    def etcd_route(self, service: str) -> dict[str, Any]:
        """The route in etcd, read by a client of the test's own."""

        async def read() -> dict[str, Any]:
            from controlplane.runtime import open_kv_store

            kv = await open_kv_store(self.settings)
            try:
                stored = await kv.get(self.api_keys.route(service))
                assert stored is not None, f"no route for {service} in etcd"
                route = parse_route(stored.value)
                return {"state": route.state.value, "canary": route.weight_of("canary")}
            finally:
                await kv.close()

        # Playwright's sync API keeps an event loop of its own on this thread
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, read()).result(timeout=30)

    @property
    def api_keys(self) -> Any:
        from controlplane.kernel.keys import EtcdKeys

        return EtcdKeys(self.settings.etcd_prefix)


def _experiment(http: httpx.Client, service: str, name: str, *, start: bool) -> int:
    body = {
        "name": name,
        "service": service,
        "steps": STEPS,
        "variants": {
            "baseline": {"upstream": f"http://{service}-v1:8080"},
            "canary": {"upstream": f"http://{service}-v2:8080"},
        },
    }
    created = http.post("/v1/experiments", json=body)
    assert created.status_code == 201, created.text
    experiment: int = created.json()["id"]
    if start:
        assert http.post(f"/v1/experiments/{experiment}/start").status_code == 200
    return experiment


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    namespace = unique("canary-ui")
    settings = Settings(
        database_url=f"sqlite:///{tmp_path_factory.mktemp('ui')}/canary.db",
        etcd=ETCD,
        etcd_prefix="/" + unique("canary-ui"),
        redis_url=REDIS,
        redis_namespace=namespace,
    )
    migrate.upgrade(settings.database_url)
    install_test_tokens(settings.database_url)
    receiver = Receiver()
    with receiving(receiver) as hook_url, live_api(settings) as api:
        feeder = SampleFeeder(settings)
        plane = Plane(api, feeder, settings, receiver)
        with plane.http() as http:
            for service in ("checkout", "payments"):
                assert http.put(f"/v1/services/{service}/rule", json=RULE).status_code == 200
            subscription = {"name": "releases", "url": hook_url, "service": "payments",
                            "kinds": ["rollback"], "format": "json"}  # fmt: skip
            created = http.post("/v1/notifications/subscriptions", json=subscription)
            assert created.status_code == 201, created.text
            plane.experiments["checkout"] = _experiment(http, "checkout", "checkout v2", start=True)
            plane.experiments["payments"] = _experiment(http, "payments", "payments v3", start=True)
            plane.experiments["search"] = _experiment(http, "search", "search ranking", start=False)
        for service in ("checkout", "payments"):
            feeder.traffic[service] = Traffic(
                plane.experiments[service], {"baseline": 60.0, "canary": 70.0}
            )
        feeder.start()
        try:
            yield plane
        finally:
            feeder.stop()
    import redis as redis_sync

    client = redis_sync.Redis.from_url(REDIS)
    try:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as driver:
        launched = driver.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Tab:
    page: Any
    offsite: list[str]
    errors: list[str]  # the console's errors and the page's uncaught exceptions
    failed: list[str]  # "<status> <method> <url>" of every answer >= 400, or the failure
    answered: list[str] = field(default_factory=list)  # "<status> <url>" of every answer
    expected_status: frozenset[int] = frozenset()  # a test that provokes one says so

    def unexpected(self) -> tuple[list[str], list[str]]:
        """(console errors, failed requests) a normal page would not have."""
        codes = tuple(f"{status}" for status in self.expected_status)
        errors = [e for e in self.errors if not any(code in e for code in codes)]
        failed = [f for f in self.failed if not (codes and f.startswith(codes))]
        return errors, failed


@pytest.fixture
def tab(browser: Any, plane: Plane) -> Iterator[Tab]:
    """A fresh browser context (own sessionStorage) that may reach the API only, and
    must neither log an error nor see a request fail unless the test expects it."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = Tab(page=None, offsite=[], errors=[], failed=[])

    def only_the_api(route: Any) -> None:
        if route.request.url.startswith(plane.api.base + "/"):
            route.continue_()
        else:
            tab.offsite.append(route.request.url)
            route.abort()

    def answered(response: Any) -> None:
        tab.answered.append(f"{response.status} {response.url}")
        if response.status >= 400:
            tab.failed.append(f"{response.status} {response.request.method} {response.url}")

    def did_not_answer(request: Any) -> None:
        # a poll cut short by the test's own navigation is no failure of the page
        if request.url.startswith(plane.api.base + "/") and "ERR_ABORTED" not in (
            request.failure or ""
        ):
            tab.failed.append(f"{request.failure} {request.method} {request.url}")

    context.route("**/*", only_the_api)
    tab.page = context.new_page()
    tab.page.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    tab.page.on("pageerror", lambda e: tab.errors.append(str(e)))
    tab.page.on("response", answered)
    tab.page.on("requestfailed", did_not_answer)
    try:
        yield tab
        assert tab.offsite == [], "the page reached outside its own origin"
        errors, failed = tab.unexpected()
        assert errors == [], f"the page logged errors (CSP?): {errors}"
        assert failed == [], f"requests failed: {failed}"
    finally:
        context.close()


def screenshot_dir(tmp_path: Path) -> Path:
    given = os.environ.get("CANARY_SCREENSHOT_DIR")
    path = Path(given) if given else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def attribute_until(tab: Tab, selector: str, name: str, holds: Any) -> str:
    """The attribute once `holds(value)`: read through the page's DOM, because the
    pages' policy forbids the string evaluation wait_for_function would use."""
    value = ""
    for _ in range(WAIT_MS // 100):
        value = tab.page.locator(selector).get_attribute(name) or ""
        if holds(value):
            return value
        tab.page.wait_for_timeout(100)
    raise AssertionError(f"{selector}[{name}] is still {value!r}")


def sign_in(tab: Tab, plane: Plane, path: str, role: Role) -> None:
    tab.page.goto(plane.api.base + path)
    tab.page.fill("#token", TOKENS[role])
    tab.page.click("#sign-in-form button[type=submit]")
    playwright_sync.expect(tab.page.locator("#who")).to_contain_text(role.value)


def test_the_list_shows_every_experiment_and_filters_by_state(
    tab: Tab, plane: Plane, tmp_path: Path
) -> None:
    sign_in(tab, plane, "/ui/", Role.VIEWER)
    rows = tab.page.locator("#experiment-rows tr")
    playwright_sync.expect(rows).to_have_count(3, timeout=WAIT_MS)
    checkout = tab.page.locator(f"tr[data-id='{plane.experiments['checkout']}']")
    playwright_sync.expect(checkout).to_contain_text("checkout v2")
    playwright_sync.expect(checkout).to_contain_text("running")
    playwright_sync.expect(checkout).to_contain_text("1 of 3")
    playwright_sync.expect(checkout).to_contain_text("90 % / 10 %")
    tab.page.screenshot(path=str(screenshot_dir(tmp_path) / "dashboard-experiments.png"))

    tab.page.select_option("#filter-state", "draft")
    playwright_sync.expect(rows).to_have_count(1, timeout=WAIT_MS)
    playwright_sync.expect(rows.first).to_contain_text("search ranking")


def test_a_running_experiments_plot_grows_as_samples_arrive(tab: Tab, plane: Plane) -> None:
    sign_in(tab, plane, f"/ui/experiments/{plane.experiments['checkout']}", Role.VIEWER)
    plot = tab.page.locator("#plot-latency")
    playwright_sync.expect(plot.locator("canvas")).to_have_count(1, timeout=WAIT_MS)
    before = int(attribute_until(tab, "#plot-latency", "data-points", lambda v: int(v) >= 3))
    last = int(plot.get_attribute("data-last-t") or 0)

    attribute_until(tab, "#plot-latency", "data-last-t", lambda v: int(v or 0) > last)
    assert int(plot.get_attribute("data-points") or 0) >= before


def record_metric_readings(plane: Plane, experiment: int, start: int) -> None:
    """Readings of an error ratio every 2 s from `start`, as the controller's recorder
    writes them (its store), the tenth of them without the canary's data."""
    from controlplane.db.history import SqlHistoryStore
    from controlplane.db.session import Database, make_engine
    from controlplane.history.metric_points import MetricPoint

    readings = [
        MetricPoint(
            experiment_id=experiment,
            name="error_ratio",
            at=start + 2 * i,
            span_sec=1,
            kind="ratio",
            compare="baseline",
            baseline=0.010,
            canary=None if i == 9 else 0.012 + 0.001 * i,
            bound=0.020,
        )
        for i in range(10)
    ]

    async def write() -> None:
        database = Database(make_engine(plane.settings.database_url))
        try:
            await SqlHistoryStore(database).append([], readings)
        finally:
            database.dispose()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, write()).result(timeout=30)


def test_a_provider_metric_is_plotted_per_variant_with_its_bound(
    tab: Tab, plane: Plane, tmp_path: Path
) -> None:
    experiment = plane.experiments["checkout"]
    with plane.http() as http:
        created = http.get(f"/v1/experiments/{experiment}").json()["created_at"]
    # inside the page's default range: from the experiment's creation to now
    since = datetime.fromisoformat(created).timestamp()
    record_metric_readings(plane, experiment, int(max(since + 1, time.time() - 20)))
    sign_in(tab, plane, f"/ui/experiments/{experiment}", Role.VIEWER)

    plot = tab.page.locator("#plot-metric-error_ratio")
    playwright_sync.expect(plot.locator("canvas")).to_have_count(1, timeout=WAIT_MS)
    assert attribute_until(tab, "#plot-metric-error_ratio", "data-points", lambda v: v == "10")
    assert plot.get_attribute("data-series") == "baseline,canary,bound"
    assert plot.get_attribute("data-gaps") == "baseline:0,canary:1,bound:0", "no data is a gap"
    assert plot.get_attribute("data-kind") == "ratio"
    playwright_sync.expect(tab.page.locator("#metrics")).to_contain_text("error_ratio")
    marks = attribute_until(tab, "#plot-metric-error_ratio", "data-marks", lambda v: v != "")
    assert "start" in marks.split(",")
    # the same marks as the samples' plots, and the plot sits under them
    latency = tab.page.locator("#plot-latency")
    assert latency.get_attribute("data-marks") == plot.get_attribute("data-marks")
    failures_box = tab.page.locator("#plot-failures").bounding_box()
    assert plot.bounding_box()["y"] > failures_box["y"] + failures_box["height"]
    legend = plot.locator(".u-legend")
    for label in ("baseline", "canary", "bound"):
        playwright_sync.expect(legend).to_contain_text(label)
    plot.screenshot(path=str(screenshot_dir(tmp_path) / "dashboard-metric.png"))


def test_a_trip_shows_on_the_plot_and_in_the_events(tab: Tab, plane: Plane, tmp_path: Path) -> None:
    experiment = plane.experiments["checkout"]
    sign_in(tab, plane, f"/ui/experiments/{experiment}", Role.VIEWER)
    attribute_until(tab, "#plot-latency", "data-points", lambda v: int(v) >= 8)
    plane.feeder.traffic["checkout"].median_ms["canary"] = SLOW

    attribute_until(tab, "#plot-latency", "data-marks", lambda v: "tripped" in v.split(","))
    playwright_sync.expect(tab.page.locator("#event-rows tr[data-kind=tripped]")).to_have_count(
        1, timeout=WAIT_MS
    )
    tripped = tab.page.locator("#event-rows tr[data-kind=tripped]")
    # the API's sentence, its numbers in words (the reason, with its test, on hover)
    playwright_sync.expect(tripped).to_contain_text("tripped (trip 1 of ")
    playwright_sync.expect(tripped).to_contain_text("canary P95 ")
    playwright_sync.expect(tab.page.locator("#breaker")).to_contain_text("open")
    playwright_sync.expect(tab.page.locator("#facts [data-summary]")).to_contain_text(
        "tripped (trip 1 of ", timeout=WAIT_MS
    )
    tab.page.wait_for_timeout(2500)  # a few more points after the trip, for the picture
    tab.page.screenshot(
        path=str(screenshot_dir(tmp_path) / "dashboard-experiment.png"), full_page=True
    )


def test_a_wrong_token_is_refused_with_a_message_that_stays(tab: Tab, plane: Plane) -> None:
    tab.expected_status = frozenset({401})  # the refusal itself, and only it
    tab.page.goto(plane.api.base + "/ui/")
    tab.page.fill("#token", "cnry_not-a-token-this-api-issued")
    tab.page.click("#sign-in-form button[type=submit]")

    message = tab.page.locator("#sign-in-error")
    playwright_sync.expect(message).to_contain_text("refused this token")
    playwright_sync.expect(message).to_contain_text("canary token create")
    tab.page.wait_for_timeout(1500)  # longer than a poll: nothing comes to blank it
    playwright_sync.expect(message).to_contain_text("refused this token")
    playwright_sync.expect(tab.page.locator("#sign-in")).to_be_visible()
    playwright_sync.expect(tab.page.locator("#token")).to_have_value(
        "cnry_not-a-token-this-api-issued"
    )  # kept, to be corrected
    playwright_sync.expect(tab.page.locator("#who")).to_have_text("")
    assert [f.split(" ")[:2] for f in tab.failed] == [["401", "GET"]]

    # corrected, it signs in and the message goes
    tab.page.fill("#token", TOKENS[Role.VIEWER])
    tab.page.click("#sign-in-form button[type=submit]")
    playwright_sync.expect(tab.page.locator("#who")).to_contain_text("viewer")
    playwright_sync.expect(tab.page.locator("#sign-in")).to_be_hidden()
    playwright_sync.expect(tab.page.locator("#token")).to_have_value("")


def test_a_normal_page_load_logs_no_error_and_fails_no_request(tab: Tab, plane: Plane) -> None:
    """The list, then a running experiment whose service is too young for a rule
    recommendation: every answer is a success (the fixture checks the console and every
    request after the test; here, that the pages did what they load for)."""
    sign_in(tab, plane, "/ui/", Role.VIEWER)
    checkout = tab.page.locator(f"tr[data-id='{plane.experiments['checkout']}']")
    playwright_sync.expect(checkout).to_contain_text("checkout v2")
    tab.page.goto(f"{plane.api.base}/ui/experiments/{plane.experiments['checkout']}")
    playwright_sync.expect(tab.page.locator("#plot-latency canvas")).to_have_count(1)
    playwright_sync.expect(tab.page.locator("#event-rows tr").first).to_be_visible()
    playwright_sync.expect(tab.page.locator("#recommendation")).to_contain_text(
        "Not enough baseline history yet"
    )
    playwright_sync.expect(tab.page.locator("#latency-note")).to_contain_text("P95 over 5 s")
    tab.page.wait_for_timeout(2500)  # a few polls
    icon = tab.page.locator("link[rel=icon]").get_attribute("href")
    with httpx.Client(base_url=plane.api.base) as http:
        assert http.get(icon or "/none").status_code == 200
    answered = [a for a in tab.answered if "/v1/" in a]
    assert any("/rule/recommendation" in a for a in answered)
    assert any("/history" in a for a in answered) and any("/events" in a for a in answered)
    assert tab.unexpected() == ([], [])
    assert tab.errors == [] and tab.failed == []


def test_the_events_table_fits_a_420px_screen(tab: Tab, plane: Plane, tmp_path: Path) -> None:
    tab.page.set_viewport_size({"width": 420, "height": 900})
    sign_in(tab, plane, f"/ui/experiments/{plane.experiments['checkout']}", Role.VIEWER)
    started = tab.page.locator("#event-rows tr[data-kind=start]")
    playwright_sync.expect(started).to_have_count(1)
    table = tab.page.locator("#events").bounding_box()
    assert table["x"] >= 0 and table["x"] + table["width"] <= 420, table
    for cell in started.locator("td").all():  # stacked, each within the screen
        box = cell.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 420, box
    playwright_sync.expect(started.locator("td[data-label=Event]")).to_be_visible()
    # nothing on the page is wider than the screen: no sideways scrolling
    assert tab.page.evaluate("document.documentElement.scrollWidth") <= 420
    tab.page.screenshot(path=str(screenshot_dir(tmp_path) / "dashboard-narrow.png"), full_page=True)


@pytest.mark.parametrize("action", ["rollback", "promote"])
def test_the_end_of_an_experiment_is_marked_on_every_plot(
    tab: Tab, plane: Plane, action: str, tmp_path: Path
) -> None:
    service = f"orders-{action}"
    with plane.http() as http:
        assert http.put(f"/v1/services/{service}/rule", json=RULE).status_code == 200
        experiment = _experiment(http, service, f"{service} v2", start=True)
        plane.feeder.traffic[service] = Traffic(experiment, {"baseline": 60.0, "canary": 70.0})
        try:
            for _ in range(WAIT_MS // 250):  # a few seconds of windows recorded
                history = http.get(f"/v1/experiments/{experiment}/history").json()
                if len(history["t"]) >= 3:
                    break
                time.sleep(0.25)
            assert len(history["t"]) >= 3, history["t"]
            done = http.post(
                f"/v1/experiments/{experiment}/{action}", json={"reason": f"{action} to mark"}
            )
            assert done.status_code == 200, done.text
        finally:
            del plane.feeder.traffic[service]
    sign_in(tab, plane, f"/ui/experiments/{experiment}", Role.VIEWER)

    for plot in ("#plot-latency", "#plot-failures", "#plot-rate"):
        drawn = attribute_until(tab, plot, "data-drawn", lambda v: action in v.split(","))
        assert "start" in drawn.split(","), drawn
    tab.page.locator("#plot-latency").screenshot(
        path=str(screenshot_dir(tmp_path) / f"dashboard-{action}-mark.png")
    )


def test_a_viewer_sees_no_action_buttons(tab: Tab, plane: Plane) -> None:
    sign_in(tab, plane, f"/ui/experiments/{plane.experiments['payments']}", Role.VIEWER)
    playwright_sync.expect(tab.page.locator("#facts")).to_contain_text("Weights")
    playwright_sync.expect(tab.page.locator("#actions")).to_be_hidden()
    assert tab.page.locator("button[data-action]").count() == 0


def test_the_experiment_page_shows_its_services_stable_version_and_releases(
    tab: Tab, plane: Plane
) -> None:
    checkout = plane.experiments["checkout"]
    sign_in(tab, plane, f"/ui/experiments/{checkout}", Role.VIEWER)
    expect = playwright_sync.expect
    expect(tab.page.locator("#releases-service")).to_have_text("checkout")
    # its start made the service's first stable version of its baseline
    expect(tab.page.locator("#stable-version")).to_contain_text(
        "Stable version: http://checkout-v1:8080"
    )
    seeded = tab.page.locator("#release-rows tr[data-kind=seeded]")
    expect(seeded).to_contain_text("http://checkout-v1:8080")
    expect(seeded.locator("a")).to_have_attribute("href", f"/ui/experiments/{checkout}")


def test_an_operators_rollback_from_the_dashboard_changes_the_route_in_etcd(
    tab: Tab, plane: Plane
) -> None:
    experiment = plane.experiments["payments"]
    assert plane.etcd_route("payments") == {"state": "running", "canary": 1000}
    sign_in(tab, plane, f"/ui/experiments/{experiment}", Role.OPERATOR)

    tab.page.click("button[data-action=rollback]")
    dialog = tab.page.locator("dialog#confirm")
    playwright_sync.expect(dialog).to_be_visible()
    tab.page.fill("#confirm-reason", "error budget burning on payments")
    tab.page.click("#confirm-ok")

    playwright_sync.expect(tab.page.locator("#state")).to_have_text("rolled back", timeout=WAIT_MS)
    playwright_sync.expect(tab.page.locator("#event-rows tr[data-kind=rollback]")).to_contain_text(
        "error budget burning on payments", timeout=WAIT_MS
    )
    playwright_sync.expect(tab.page.locator("button[data-action]")).to_have_count(0)
    # the rollback was announced to the service's subscription, and the page says so
    delivered = tab.page.locator("#delivery-rows tr[data-status=delivered]")
    playwright_sync.expect(delivered).to_contain_text("rollback", timeout=WAIT_MS)
    playwright_sync.expect(delivered).to_contain_text("releases")
    assert any(b'"kind":"rollback"' in r.body.replace(b" ", b"") for r in plane.receiver.received())
    for _ in range(WAIT_MS // 250):
        if plane.etcd_route("payments") == {"state": "rolled_back", "canary": 0}:
            break
        tab.page.wait_for_timeout(250)
    assert plane.etcd_route("payments") == {"state": "rolled_back", "canary": 0}
    with plane.http() as http:
        events = http.get(f"/v1/experiments/{experiment}/events", params={"limit": 500})
    rollback = [e for e in events.json()["items"] if e["kind"] == "rollback"]
    assert [e["actor"] for e in rollback] == ["token:test-operator"]


def test_the_api_docs_render_their_operations_offline(
    tab: Tab, plane: Plane, tmp_path: Path
) -> None:
    tab.page.goto(plane.api.base + "/docs")
    operations = tab.page.locator(".opblock")
    playwright_sync.expect(operations.first).to_be_visible(timeout=WAIT_MS)
    assert operations.count() >= 20
    playwright_sync.expect(tab.page.locator("#swagger-ui")).to_contain_text(
        "/v1/experiments/{experiment_id}/history"
    )
    tab.page.screenshot(path=str(screenshot_dir(tmp_path) / "api-docs.png"))


def test_the_pages_carry_a_strict_content_security_policy(plane: Plane) -> None:
    with httpx.Client(base_url=plane.api.base) as http:
        for path in (
            "/ui/",
            f"/ui/experiments/{plane.experiments['search']}",
            "/docs",
            "/ui/static/experiment.js",
        ):
            response = http.get(path)
            assert response.status_code == 200, path
            csp = response.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path
            assert response.headers["x-frame-options"] == "DENY"
        assert http.get("/ui/experiments/not-a-number").status_code == 404
        assert http.get("/ui/static/../app.py").status_code == 404
