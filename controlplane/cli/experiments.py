"""`canary exp …`: create, inspect and drive experiments through the REST API.

`canary exp wait ID` is a CI/CD gate: it follows the experiment until it ends and
exits 0 when it was promoted, 1 when it was rolled back or aborted, 2 on any error
(API unreachable, unknown id, timeout).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import typer

from controlplane.cli.remote import (
    DEFAULT_API,
    EXIT_REFUSED,
    EXIT_USAGE,
    ApiOption,
    JsonOption,
    dash,
    fail,
    open_client,
    print_json,
    reporting,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


IdArgument = Annotated[str, typer.Argument(metavar="ID", help="experiment id", show_default=False)]
TERMINAL_EXIT = {"promoted": 0, "rolled_back": EXIT_REFUSED, "aborted": EXIT_REFUSED}
ACTION_HELP = {
    "start": "Start a draft: route its first step's weight to the canary.",
    "pause": "Pause a running experiment: hold the current weights.",
    "resume": "Resume a paused experiment.",
    "promote": "Promote now: the canary becomes the service's stable version, all traffic to it.",
    "rollback": "Roll back now: all traffic to the stable version (the baseline).",
    "abort": "Abort by hand: end the experiment, all traffic to the stable version.",
}


# ---- how an experiment reads on a terminal


def weight_text(experiment: dict[str, Any]) -> str:
    bp = experiment.get("canary_weight_bp")
    return "-" if bp is None else f"{bp / 100:g}%"


def step_text(experiment: dict[str, Any]) -> str:
    current = experiment.get("current_step")
    total = len(experiment.get("steps") or ())
    if current is None or current < 0:
        return f"-/{total}"
    return f"{current + 1}/{total}"


def time_text(value: Any) -> str:
    """An API timestamp to the second, ISO 8601 in UTC: enough to read a trail."""
    if not isinstance(value, str):
        return dash(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def event_text(event: dict[str, Any] | None) -> str:
    if not event:
        return "-"
    source, target = event.get("from_state"), event.get("to_state")
    moved = f" {source} → {target}" if source and target else f" → {target}" if target else ""
    told = event.get("summary") or event.get("reason")
    reason = f": {told}" if told else ""
    return f"{event.get('kind', 'event')}{moved}{reason}"


def _experiments_table(items: list[dict[str, Any]], total: int | None) -> RenderableType:
    from rich.table import Table

    caption = None if total is None or total == len(items) else f"{len(items)} of {total}"
    table = Table(caption=caption)
    for column in ("id", "name", "service", "state", "step", "canary", "breaker", "trips"):
        table.add_column(column, justify="right" if column in ("id", "trips") else "left")
    for item in items:
        table.add_row(
            str(item.get("id")),
            dash(item.get("name")),
            dash(item.get("service")),
            dash(item.get("state")),
            step_text(item),
            weight_text(item),
            dash(item.get("breaker_state")),
            dash(item.get("trips")),
        )
    return table


def _experiment_view(experiment: dict[str, Any]) -> RenderableType:
    from rich.console import Group
    from rich.table import Table

    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    sticky = experiment.get("sticky") or {}
    rows = [
        ("id", experiment.get("id")),
        ("name", experiment.get("name")),
        ("service", experiment.get("service")),
        ("state", experiment.get("state")),
        ("now", standing_text(experiment)),
        ("step", step_text(experiment)),
        ("canary weight", weight_text(experiment)),
        ("breaker", experiment.get("breaker_state")),
        ("trips", experiment.get("trips")),
        ("sticky", ", ".join(f"{k}: {v}" for k, v in sticky.items() if v) or None),
        ("rule", "inline" if experiment.get("rule") else "the service's rule"),
        ("latency judged", _inline_latency(experiment)),
        ("overload", _overload_text(experiment)),
        ("paused by", _held_text(experiment)),
        ("probe", _probe_text(experiment)),
        ("route", confirmation_text(experiment)),
        ("created", time_text(experiment.get("created_at"))),
        ("updated", time_text(experiment.get("updated_at"))),
    ]
    for label, value in rows:
        summary.add_row(label, dash(value))

    variants = Table(title="variants", title_justify="left")
    variants.add_column("name")
    variants.add_column("upstream")
    variants.add_column("version")
    for name, variant in _variants(experiment):
        version = dash(variant.get("version"))
        if name == "baseline" and experiment.get("baseline_follows_stable"):
            version += " (the stable version when it starts)"
        variants.add_row(name, dash(variant.get("upstream")), version)

    steps = Table(title="steps", title_justify="left")
    for column in ("#", "weight", "hold"):
        steps.add_column(column, justify="right")
    current = experiment.get("current_step", -1)
    for index, step in enumerate(experiment.get("steps") or ()):
        marker = " ◀" if index == current else ""
        steps.add_row(
            f"{index + 1}{marker}", f"{step.get('weight_pct', 0):g}%", f"{step.get('hold_sec')} s"
        )
    windows = _windows_table(experiment)
    return Group(summary, variants, steps, *([windows] if windows is not None else []))


def _overload_text(experiment: dict[str, Any]) -> str | None:
    """Whether the controller holds the rollout for overload (decision 0025)."""
    live = experiment.get("live") or {}
    if live.get("overload_held"):
        return "held: the baseline's sidecars are shedding requests (overload: hold)"
    rule = experiment.get("rule")
    if isinstance(rule, dict) and rule.get("overload") == "judge":
        return "judged while shedding (overload: judge)"
    return None


def _probe_text(experiment: dict[str, Any]) -> str | None:
    """A half-open probe's time to verdict, as the API estimates it from its traffic."""
    probe = (experiment.get("live") or {}).get("probe")
    sentence = probe.get("sentence") if isinstance(probe, dict) else None
    return sentence if isinstance(sentence, str) else None


def _held_text(experiment: dict[str, Any]) -> str | None:
    """Which guardrail's pause holds the weight, and why (decision 0049)."""
    live = experiment.get("live") or {}
    held = live.get("held_by")
    if not isinstance(held, list) or not held:
        return None
    names = ", ".join(str(n) for n in held)
    reason = live.get("held_reason")
    return f"{names}: {reason}" if isinstance(reason, str) and reason else names


def _inline_latency(experiment: dict[str, Any]) -> str | None:
    """The latency an inline rule judges (a service's rule is not in the answer)."""
    rule = experiment.get("rule")
    return str(rule.get("latency", "total")) if isinstance(rule, dict) else None


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


def _percent(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.1%}"


def _windows_table(experiment: dict[str, Any]) -> RenderableType | None:
    """The latest window per variant, both latencies: the total time, and the time to
    the first byte (what a first_byte rule judges: streams, SSE, token streams)."""
    from rich.table import Table

    live = experiment.get("live") or {}
    snapshots = live.get("snapshots")
    if not snapshots:
        return None
    # one column per variant, one row per figure: twelve figures side by side were cut
    # to "fir…" on an 80-column terminal
    names = sorted(snapshots)
    table = Table(title="windows (ms)", title_justify="left")
    table.add_column("")
    for name in names:
        table.add_column(str(name), justify="right")

    def figures(snap: dict[str, Any]) -> list[str]:
        head = snap.get("first_byte") or {}
        return [
            dash(snap.get("count")),
            dash(snap.get("failures")),
            *(_ms(snap.get(p)) for p in ("p50_ms", "p95_ms", "p99_ms")),
            *(_ms(head.get(p)) for p in ("p50_ms", "p95_ms", "p99_ms")),
            dash(snap.get("samples_without_first_byte")),
            dash(snap.get("shed")),
            _percent(snap.get("shed_share")),
        ]

    labels = ["samples", "failures", "total p50", "total p95", "total p99",
              "first byte p50", "first byte p95", "first byte p99", "no first byte",
              "shed", "shed %"]  # fmt: skip
    by_variant = [figures(snapshots[name] or {}) for name in names]
    for row, label in enumerate(labels):
        table.add_row(label, *(values[row] for values in by_variant))
    return table


def _variants(experiment: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    # the API may answer a mapping {baseline: {...}} or a list [{name, ...}]
    variants = experiment.get("variants") or {}
    if isinstance(variants, dict):
        return [(str(name), value or {}) for name, value in variants.items()]
    return [(str(v.get("name")), v) for v in variants]


def _events_view(events: list[dict[str, Any]]) -> RenderableType:
    """One head line per event (when, who, what, from → to), then its sentence and its
    reason on lines of their own, wrapped: a table column for the reason left it a
    few characters wide on an 80-column terminal."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    parts: list[RenderableType] = []
    for event in events:
        source, target = event.get("from_state"), event.get("to_state")
        moved = f"  {dash(source)} → {dash(target)}" if source or target else ""
        head = f"{time_text(event.get('at'))}  {dash(event.get('actor'))}  " + dash(
            event.get("kind")
        )
        parts.append(Text(head + moved, style="bold"))
        summary, reason = event.get("summary"), event.get("reason")
        if isinstance(summary, str) and summary:
            parts.append(Padding(Text(summary), (0, 0, 0, 2)))
        if isinstance(reason, str) and reason and reason != summary:
            parts.append(Padding(Text(f"reason: {reason}", style="dim"), (0, 0, 0, 2)))
    return Group(*parts)


def standing_text(experiment: dict[str, Any]) -> str:
    """The API's sentence for where the rollout stands (relative times when live)."""
    live = experiment.get("live") or {}
    told = live.get("summary") or experiment.get("summary")
    return told if isinstance(told, str) and told else dash(experiment.get("state"))


def _status_view(experiment: dict[str, Any], latest: dict[str, Any] | None) -> RenderableType:
    """`exp status`: the standing and the latest event as sentences, each wrapped on
    its own lines, then the numbers they stand on."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    head = (
        f"experiment {dash(experiment.get('id'))} ({dash(experiment.get('service'))}): "
        f"{dash(experiment.get('state'))}, step {step_text(experiment)}, canary "
        f"{weight_text(experiment)}, breaker {dash(experiment.get('breaker_state'))}, "
        f"trips {dash(experiment.get('trips'))}, route {route_text(experiment)}"
    )
    parts: list[RenderableType] = [Text(head, style="bold"), Padding(
        Text(standing_text(experiment)), (0, 0, 0, 2)
    )]
    confirmation = confirmation_text(experiment)  # etcd holding it is not a sidecar serving it
    if confirmation is not None:
        parts.append(Padding(Text(f"route: {confirmation}"), (0, 0, 0, 2)))
    if latest:
        parts.append(Text(f"latest: {time_text(latest.get('at'))}  {dash(latest.get('kind'))}"))
        parts.append(Padding(Text(str(latest.get("summary") or latest.get("reason") or "")),
                             (0, 0, 0, 2)))
    return Group(*parts)


def _print(renderable: RenderableType) -> None:
    from rich.console import Console

    Console(markup=False).print(renderable)


# ---- the wait loop


@dataclass(frozen=True)
class Progress:
    """What `wait` shows; a change in any field is worth a line in a CI log."""

    state: str
    step: str
    weight: str
    breaker: str
    event: str
    route: str
    standing: str = "-"

    @classmethod
    def of(cls, experiment: dict[str, Any], latest: dict[str, Any] | None) -> Progress:
        return cls(
            state=dash(experiment.get("state")),
            step=step_text(experiment),
            weight=weight_text(experiment),
            breaker=dash(experiment.get("breaker_state")),
            event=event_text(latest),
            route=route_text(experiment),
            # absolute times: a relative one would change, and print a line, every look
            standing=dash(experiment.get("summary")),
        )

    def line(self) -> str:
        return (
            f"state {self.state}  step {self.step}  canary {self.weight}  "
            f"breaker {self.breaker}  route {self.route}  now {self.standing}  "
            f"latest {self.event}"
        )

    def panel(self, experiment_id: str, elapsed: float) -> RenderableType:
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for label, value in (
            ("experiment", experiment_id),
            ("state", self.state),
            ("step", self.step),
            ("canary weight", self.weight),
            ("breaker", self.breaker),
            ("route in etcd", self.route),
            ("now", self.standing),
            ("latest event", self.event),
            ("waiting", f"{elapsed:.0f} s"),
        ):
            table.add_row(label, value)
        return table


class Watched(Protocol):
    """What `follow` reads: the experiment and its newest event (CanaryClient has both)."""

    def get_experiment(self, experiment_id: str) -> dict[str, Any]: ...

    def latest_event(self, experiment_id: str) -> dict[str, Any] | None: ...


def route_text(experiment: dict[str, Any]) -> str:
    applied = experiment.get("route_applied")
    if applied is True:
        return "applied"
    if applied is False:
        return "pending"
    note = experiment.get("route_note")
    return f"unknown ({note})" if isinstance(note, str) and note else "unknown"


def confirmation_text(experiment: dict[str, Any]) -> str | None:
    """The route's confirmation in words (decision 0053); None from an API without it."""
    confirmation = experiment.get("route_confirmation")
    if not isinstance(confirmation, dict):
        return None
    sentence = confirmation.get("sentence")
    return sentence if isinstance(sentence, str) else None


def await_confirmation(
    client: Watched, experiment_id: str, *, timeout: float, interval: float = 0.2
) -> dict[str, Any]:
    """The experiment's detail once a data plane confirmed its route, or as it is when
    `timeout` runs out, or at once when no data plane of the service reports at all
    (waiting would change nothing)."""
    deadline = time.monotonic() + timeout
    while True:
        detail = client.get_experiment(experiment_id)
        confirmation = detail.get("route_confirmation")
        if not isinstance(confirmation, dict) or confirmation.get("confirmed") is not False:
            return detail
        if not confirmation.get("data_planes") or time.monotonic() + interval > deadline:
            return detail
        time.sleep(interval)


def verdict_landed(experiment: dict[str, Any]) -> bool:
    """A verdict counts once the sidecars can act on it: a pipeline that goes on to
    delete the old version must not do so while etcd still routes to it. Unknown
    (etcd unreadable, an API without the field) does not hold the wait: the state
    is the verdict of record, and the line shown says the route is unknown."""
    return experiment.get("route_applied") is not False


def follow(
    client: Watched,
    experiment_id: str,
    *,
    timeout: float,
    interval: float,
    console: Console,
) -> str:
    """Poll until the experiment reaches a terminal state and etcd holds its route;
    return that state.

    On a terminal the display is live; elsewhere (CI logs) each change is one line.
    Raises TimeoutError when `timeout` seconds pass first.
    """
    from rich.live import Live

    started = time.monotonic()
    shown: Progress | None = None
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    if live is not None:
        live.start()
    try:
        while True:
            experiment = client.get_experiment(experiment_id)
            progress = Progress.of(experiment, client.latest_event(experiment_id))
            elapsed = time.monotonic() - started
            if live is not None:
                live.update(progress.panel(experiment_id, elapsed), refresh=True)
            elif progress != shown:
                console.print(progress.line(), markup=False, highlight=False)
            shown = progress
            state = str(experiment.get("state"))
            if state in TERMINAL_EXIT and verdict_landed(experiment):
                return state
            if elapsed + interval > timeout:
                if state in TERMINAL_EXIT:
                    raise TimeoutError(
                        f"{state}, but etcd does not hold its route after {timeout:g} s"
                    )
                raise TimeoutError(f"still {state} after {timeout:g} s")
            time.sleep(interval)
    finally:
        if live is not None:
            live.stop()


# ---- the commands


def register(app: typer.Typer) -> None:
    exp = typer.Typer(
        name="exp",
        help="Create, inspect and drive experiments through the REST API.",
        no_args_is_help=True,
    )

    @exp.command("create")
    def create_command(
        file: Annotated[
            Path,
            typer.Option("--file", "-f", help="experiment as YAML or JSON", show_default=False),
        ],
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the id")] = False,
    ) -> None:
        """Create a draft experiment from a file (see deploy/examples/experiment.yaml)."""
        from controlplane.client.api_client import ClientError
        from controlplane.client.files import api_errors_to_file, load_experiment

        with reporting("canary exp create"):
            source, body = load_experiment(file)
            with open_client(api) as client:
                try:
                    created = client.create_experiment(body)
                except ClientError as exc:
                    # the API's schema may be stricter than the one known here
                    if exc.status == 422 and exc.errors:
                        raise api_errors_to_file(source, exc.errors) from exc
                    raise
        if as_json:
            print_json(created)
        elif quiet:
            typer.echo(created.get("id"))
        else:
            typer.echo(
                f"created experiment {created.get('id')} "
                f"({created.get('name')}, {created.get('service')}, {created.get('state')})"
            )
            if created.get("baseline_follows_stable"):
                baseline = (created.get("variants") or {}).get("baseline")
                from controlplane.cli.services import version_text

                typer.echo(f"baseline: the service's stable version when it starts, now "
                           f"{version_text(baseline)}")

    @exp.command("list")
    def list_command(
        service: Annotated[str | None, typer.Option(help="only this service")] = None,
        state: Annotated[str | None, typer.Option(help="only this state")] = None,
        limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 50,
        offset: Annotated[int, typer.Option(min=0, help="skip this many")] = 0,
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """List experiments, newest first as the API orders them."""
        with reporting("canary exp list"), open_client(api) as client:
            page = client.list_experiments(service=service, state=state, limit=limit, offset=offset)
        if as_json:
            print_json(page)
            return
        items = page.get("items", [])
        _print(_experiments_table(items, page.get("total")))

    @exp.command("show")
    def show_command(
        experiment_id: IdArgument, api: ApiOption = DEFAULT_API, as_json: JsonOption = False
    ) -> None:
        """Show one experiment: state, step, weights, breaker, variants and steps."""
        with reporting("canary exp show"), open_client(api) as client:
            experiment = client.get_experiment(experiment_id)
        if as_json:
            print_json(experiment)
        else:
            _print(_experiment_view(experiment))

    @exp.command("status")
    def status_command(
        experiment_id: IdArgument, api: ApiOption = DEFAULT_API, as_json: JsonOption = False
    ) -> None:
        """Where the rollout stands and its latest event, in words, with the numbers."""
        with reporting("canary exp status"), open_client(api) as client:
            experiment = client.get_experiment(experiment_id)
            latest = client.latest_event(experiment_id)
        if as_json:
            print_json({"experiment": experiment, "latest_event": latest})
            return
        _print(_status_view(experiment, latest))

    @exp.command("events")
    def events_command(
        experiment_id: IdArgument, api: ApiOption = DEFAULT_API, as_json: JsonOption = False
    ) -> None:
        """The experiment's audit trail: every transition, who made it and why."""
        with reporting("canary exp events"), open_client(api) as client:
            events = client.events(experiment_id)
        if as_json:
            print_json(events)
        else:
            _print(_events_view(events))

    for action, help_text in ACTION_HELP.items():
        _register_action(exp, action, help_text)

    @exp.command("wait")
    def wait_command(
        experiment_id: IdArgument,
        timeout: Annotated[
            float, typer.Option(min=0, help="give up (exit 2) after this many seconds")
        ] = 3600,
        interval: Annotated[float, typer.Option(min=0.05, help="seconds between two looks")] = 2.0,
        api: ApiOption = DEFAULT_API,
    ) -> None:
        """Wait for the verdict: exit 0 promoted, 1 rolled back or aborted, 2 on error."""
        from rich.console import Console

        command = "canary exp wait"
        with reporting(command, exit_code=EXIT_USAGE), open_client(api) as client:
            try:
                state = follow(
                    client,
                    experiment_id,
                    timeout=timeout,
                    interval=interval,
                    console=Console(stderr=True, markup=False),
                )
            except TimeoutError as exc:
                raise fail(command, f"experiment {experiment_id}: {exc}", EXIT_USAGE) from None
            except KeyboardInterrupt:
                # click would exit 1, which a pipeline would read as "rolled back"
                raise fail(command, "interrupted before a verdict", EXIT_USAGE) from None
        typer.echo(f"experiment {experiment_id} {state}")
        raise typer.Exit(TERMINAL_EXIT[state])

    @exp.command("watch")
    def watch_command(
        experiment_id: IdArgument,
        interval: Annotated[float, typer.Option(min=0.2, help="seconds between two looks")] = 1.0,
        api: ApiOption = DEFAULT_API,
    ) -> None:
        """Watch an experiment live (state, weights, windows, verdicts, probe, route) until
        it ends; Ctrl-C stops watching, not the experiment."""
        from rich.console import Console

        from controlplane.cli.watch import watch

        command = "canary exp watch"
        with reporting(command), open_client(api) as client:
            try:
                state = watch(client, experiment_id, interval=interval,
                              console=Console(markup=False))
            except KeyboardInterrupt:
                typer.echo(f"stopped watching experiment {experiment_id} (it goes on)")
                return
        typer.echo(f"experiment {experiment_id} {state}")

    app.add_typer(exp, name="exp")


def _register_action(exp: typer.Typer, action: str, help_text: str) -> None:
    # one function per action, so each has its own --help and error prefix
    def action_command(
        experiment_id: IdArgument,
        reason: Annotated[
            str | None, typer.Option(help="why, recorded in the experiment's events")
        ] = None,
        confirm_wait: Annotated[
            float,
            typer.Option("--confirm-wait", min=0, max=600, help="seconds to wait for a data plane "
                         "(sidecar, router) to confirm the new route (0: do not wait)"),
        ] = 2.0,
        api: ApiOption = DEFAULT_API,
    ) -> None:
        with reporting(f"canary exp {action}"), open_client(api) as client:
            experiment = client.act(experiment_id, action, reason=reason)
            typer.echo(
                f"experiment {experiment.get('id', experiment_id)} "
                f"{dash(experiment.get('state'))} (canary {weight_text(experiment)})"
            )
            if confirm_wait > 0:
                detail = await_confirmation(client, experiment_id, timeout=confirm_wait)
                sentence = confirmation_text(detail)
                if sentence is not None:
                    typer.echo(f"route: {sentence}")

    exp.command(action, help=help_text)(action_command)
