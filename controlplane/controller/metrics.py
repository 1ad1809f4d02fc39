"""The controller's counters, and their export on the API's /metrics (read at scrape
time, so the controller only bumps integers)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.controller.board_page import BoardPage
from controlplane.controller.ownership import OwnershipStats
from controlplane.history.recorder import HistoryStats


@dataclass
class ControllerStats:
    evaluations: int = 0
    decisions_applied: int = 0
    # looks that moved only the time of the snapshot judged: kept, not written (0077)
    looks_kept: int = 0
    conflicts: int = 0
    errors: int = 0
    # of which errors no check foresaw (a bug, data no parser caught): logged with
    # their trace, the round going on
    unexpected_errors: int = 0
    snapshot_errors: int = 0
    # experiment rows read in full: new to a round, or changed since it last saw them
    rows_loaded: int = 0
    routes_reconciled: int = 0
    routes_published: int = 0
    reconcile_passes: int = 0
    # routes a commit announced during a full pass, written between its parts
    routes_ahead_of_full_pass: int = 0
    revision_polls: int = 0
    route_notices_dropped: int = 0
    window_rules_published: int = 0
    window_rules_deleted: int = 0
    configs_published: int = 0
    configs_deleted: int = 0
    configs_reconciled: int = 0
    config_imports_skipped: int = 0
    leader: bool = False
    terms: int = 0
    outages_ridden: int = 0
    # experiments whose breach streak has begun, judged again at the next tick (0069)
    suspects: int = 0
    suspect_passes: int = 0
    suspect_looks: int = 0
    # experiments a collector raised an alarm for, judged in the same passes (0070)
    alarms_read: int = 0
    alarms_dropped: int = 0
    alarm_read_errors: int = 0
    alarm_looks: int = 0


class ControllerMetricsCollector(Collector):
    def __init__(
        self,
        stats: ControllerStats,
        prefix: str = "canary_controller",
        history: HistoryStats | None = None,
        ownership: OwnershipStats | None = None,
        shards: int = 0,
        board_page: BoardPage | None = None,
    ) -> None:
        self._stats = stats
        self._board_page = board_page
        self._prefix = prefix
        self._history = history or HistoryStats()
        self._ownership = ownership
        self._shards = shards

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._stats
        p = self._prefix
        yield GaugeMetricFamily(
            f"{p}_leader", "1 while this replica leads the controller", value=int(s.leader)
        )
        yield GaugeMetricFamily(
            f"{p}_suspects", "Experiments whose breach streak has begun, judged again a "
            "tick after their last look rather than a round after", value=s.suspects,
        )
        counters: tuple[tuple[str, str, int], ...] = (
            ("leadership_terms", "Leadership terms this replica has won", s.terms),
            ("outages_ridden", "Backend outages the leader rode out on its lease instead "
             "of stepping down", s.outages_ridden),
            ("evaluations", "Experiment evaluations (one per active experiment per round)",
             s.evaluations),
            ("decisions_applied", "Decisions written (row, route, events)", s.decisions_applied),
            ("looks_kept", "Looks that moved only the time of the snapshot judged: kept "
             "in the controller's memory, not written", s.looks_kept),
            ("conflicts", "Rounds that lost a race on an experiment's row or route",
             s.conflicts),
            ("errors", "Evaluations that failed (logged once a minute per experiment and "
             "kind of error)", s.errors),
            ("unexpected_errors", "Evaluations that failed with an error no check foresaw "
             "(logged with its trace once a minute per experiment; the round goes on)",
             s.unexpected_errors),
            ("suspect_passes", "Passes over the suspects between a round's experiments "
             "(a round longer than the tick)", s.suspect_passes),
            ("suspect_looks", "Looks at suspects in those passes", s.suspect_looks),
            ("alarm_looks", "Looks in those passes at experiments a collector raised an "
             "alarm for (a canary turned worse)", s.alarm_looks),
            ("alarms_read", "Alarms read from the collectors (the same alarm read again "
             "counts again)", s.alarms_read),
            ("alarms_dropped", "Alarm members that were not experiment ids or times "
             "(written by no collector), dropped", s.alarms_dropped),
            ("alarm_read_errors", "Reads of the alarms that failed (the rounds judge on)",
             s.alarm_read_errors),
            ("rows_loaded", "Experiment rows read in full by the rounds: new to the "
             "round, or changed since it last read or wrote them", s.rows_loaded),
            ("snapshot_errors", "Snapshot reads that failed (judged as no data)",
             s.snapshot_errors),
            ("routes_reconciled", "Routes repaired in etcd: missing, older, newer, foreign, "
             "unreadable or unowned (each also a route_reconciled event)", s.routes_reconciled),
            ("reconcile_passes", "Passes of the route reconciler (full or after a commit)",
             s.reconcile_passes),
            ("routes_ahead_of_full_pass", "Routes whose commit was announced during a full "
             "pass of the reconciler, written between its parts rather than after it",
             s.routes_ahead_of_full_pass),
            ("revision_polls", "Polls of the desired routes' revisions (SQLite, which has no "
             "NOTIFY): a pass follows only for the services that moved", s.revision_polls),
            ("routes_published", "Routes written to etcd by the reconciler",
             s.routes_published),
            ("route_notices_dropped", "Route change notices ignored: no service named",
             s.route_notices_dropped),
            ("window_rules_published", "Experiments' window rules written to etcd",
             s.window_rules_published),
            ("window_rules_deleted", "Window rules deleted from etcd (experiment ended, or "
             "no rule of its own)", s.window_rules_deleted),
            ("configs_published", "Breaker rules and overload protections written to etcd",
             s.configs_published),
            ("configs_deleted", "Breaker rules and overload protections deleted from etcd "
             "(removed, or never in the database)", s.configs_deleted),
            ("configs_reconciled", "Breaker rules and overload protections repaired in etcd "
             "(each also a rule_reconciled or overload_reconciled event)",
             s.configs_reconciled),
            ("config_imports_skipped", "Malformed values in etcd the one import of configs "
             "into SQL skipped", s.config_imports_skipped),
        )  # fmt: skip
        h = self._history
        counters += (
            ("history_points_written", "History points written for the plots", h.written),
            ("history_points_dropped", "History points dropped: the database was away "
             "longer than the buffer lasts", h.dropped),
            ("history_write_failures", "Failed writes of history points (kept, retried)",
             h.write_failures),
            ("history_compactions", "Experiments' history points merged into coarser ones",
             h.compactions),
        )  # fmt: skip
        o = self._ownership
        if o is not None:
            yield GaugeMetricFamily(f"{p}_shards", "Shards the experiments fall into (0: one "
                                    "elected controller judges them all)", value=self._shards)
            yield GaugeMetricFamily(f"{p}_shards_held", "Shards this replica holds and judges",
                                    value=o.held)
            yield GaugeMetricFamily(f"{p}_members", "Live controller replicas that agree on "
                                    "the shard count", value=o.members)
            counters += (
                ("shard_claims", "Shards this replica claimed", o.claims),
                ("shard_releases", "Shards this replica let go to another", o.releases),
                ("shard_leases_lost", "Times this replica's lease ran out, with its shards",
                 o.lost_leases),
                ("shard_claims_refused", "Claims whose SQL fence a newer owner held",
                 o.refused_claims),
                ("shard_keys_malformed", "Keys under the controllers' prefix that named "
                 "nothing valid (ignored)", o.malformed_keys),
                ("shard_count_disagreements", "Passes that found replicas announcing another "
                 "shard count or assignment version (every shard let go)", o.disagreements),
                ("shard_outages_ridden", "Passes that could not reach etcd or SQL; the "
                 "shards held were kept on the lease", o.outages_ridden),
            )  # fmt: skip
        for name, help_text, value in counters:
            yield CounterMetricFamily(f"{p}_{name}", help_text, value=value)
        page = self._board_page
        if page is not None:
            pages = CounterMetricFamily(
                f"{p}_board_pages", "Pages of the experiments' series written for /metrics, "
                "by who wrote them: a round's end (on the loop) or a scrape", labels=["by"],
            )  # fmt: skip
            pages.add_metric(["round"], page.written_by_rounds)
            pages.add_metric(["scrape"], page.written_by_scrapes)
            yield pages
