"""Sample streams and the snapshot board on Redis ≥ 6.2 (architecture §5).

`RedisStreams` is both the `SampleStream` and the `SnapshotBoard`; one object owns
two connection pools:

- commands: short socket timeouts, so a sidecar never hangs on a dead Redis;
- blocking reads: no socket timeout of its own, because XREADGROUP BLOCK legitimately
  keeps the socket silent for block_ms; each read is bounded by block_ms plus the
  command timeout instead.

Every driver error is translated at this boundary: unreachable or slow Redis becomes
`BackendUnavailable`, anything else Redis refuses becomes `BackendError`.

Timeouts come from the constructor, or from the URL (``?socket_timeout=…&
socket_connect_timeout=…``), which wins as in redis-py.

Redis Cluster (``redis+cluster://host:port[,host:port…]``, decision 0028): the
same commands through redis-py's cluster client. Every key a command touches is in
one slot (the hash tags of `RedisKeys`), pipelines are split per node by the client,
and the two places that span slots are spelled out here: a read of several samples
streams becomes one read per slot (`_read_cluster`), and listing the streams scans
every primary.

TLS and credentials (`RedisAccess`): ``rediss://`` with a CA and optionally a client
certificate; the password in the URL or in a file, read again for every new
connection (a rotated password needs no restart). The URL is never logged with its
password, and errors name the server without it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis.exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.credentials import CredentialProvider
from redis.typing import EncodableT, FieldT

from controlplane.kernel.alarms import CLOCK_SKEW_SEC as ALARM_SKEW_SEC
from controlplane.kernel.alarms import KEEP_SEC as ALARM_KEEP_SEC
from controlplane.kernel.alarms import MAX_READ as ALARMS_READ
from controlplane.kernel.alarms import parsed_alarms
from controlplane.kernel.backend_access import RedisAccess
from controlplane.kernel.codec import source_and_seq
from controlplane.kernel.errors import BackendError, BackendUnavailable, ConfigError
from controlplane.kernel.keys import RedisKeys, is_service_name
from controlplane.kernel.route_reports import (
    CLOCK_SKEW_SEC,
    FORGET_SEC,
    MAX_REPORTS,
    RouteReport,
    parse_member,
    report_member,
)
from controlplane.kernel.secrets import url_password
from controlplane.kernel.streams import (
    DECISIONS_MAXLEN,
    NOTHING_PENDING,
    PendingSummary,
    StreamEntry,
)

DEFAULT_SOCKET_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 0.5
# One immediate retry replaces a pooled connection that died with a Redis restart;
# more would only delay the BackendUnavailable a caller is waiting to see.
DEFAULT_RETRIES = 1
# XAUTOCLAIM cannot report how often an entry was delivered; when the follow-up
# XPENDING does not say either, an entry being claimed was delivered at least twice.
FALLBACK_DELIVERIES = 2
# A cluster read asks this many slots at once (a connection each, so the pools stay
# bounded); when every slot was empty it waits on this many, and the others are
# looked at again by the next read.
MAX_CONCURRENT_SLOTS = 16
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
_SENTINEL_SERVICE = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_CLUSTER_SEEDS = 64
_SEED_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}|[0-9A-Fa-f:.]{2,45}")

# Compare-and-delete of hash fields (SnapshotBoard.remove_if_unchanged): ARGV holds
# field, expected value, field, expected value, …; answers the fields it deleted.
_REMOVE_IF_UNCHANGED = """
local removed = {}
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    removed[#removed + 1] = ARGV[i]
  end
end
return removed
"""

# Append, idempotent per source (SampleStream.append): KEYS[1] the stream, KEYS[k]
# (k ≥ 2) a source's last-seq key; ARGV: maxlen, the keys' TTL, then per batch the
# index k of its source's key (0: none), its seq (decimal, no leading zeros), its
# number of fields and the fields. Seqs compare as decimal strings: up to 19 digits,
# beyond Lua's exact numbers. Answers each batch's id, "" for one already there.
_APPEND = """
local ids = {}
local i = 3
while i <= #ARGV do
  local k = tonumber(ARGV[i])
  local seq = ARGV[i + 1]
  local n = tonumber(ARGV[i + 2])
  local fields = {}
  for j = 1, 2 * n do fields[j] = ARGV[i + 2 + j] end
  i = i + 3 + 2 * n
  local last = k > 0 and redis.call('GET', KEYS[k])
  if last and (#last > #seq or (#last == #seq and last >= seq)) then
    ids[#ids + 1] = ''
  else
    ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
    if k > 0 then redis.call('SET', KEYS[k], seq, 'EX', ARGV[2]) end
  end
end
return ids
"""
# a source's last seq is kept this long after its last append (sources are sidecar
# processes: a restarted one has a new id)
SOURCE_SEQ_TTL_SEC = 86_400

log = logging.getLogger("canary.streams")


@contextmanager
def _boundary(operation: str) -> Iterator[None]:
    try:
        yield
    except redis_errors.AuthenticationError as exc:
        # redis-py's message names neither the user nor the password
        raise BackendUnavailable(
            f"redis refused the credentials during {operation}: {exc}"
        ) from exc
    except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
        raise BackendUnavailable(f"redis unavailable during {operation}: {exc}") from exc
    except (
        redis_errors.ClusterDownError,
        redis_errors.TryAgainError,
        redis_errors.SlotNotCoveredError,
    ) as exc:
        # a cluster between a primary's death and its replica's promotion
        raise BackendUnavailable(f"redis cluster unavailable during {operation}: {exc}") from exc
    except redis_errors.RedisClusterException as exc:
        raise BackendError(f"redis cluster refused {operation}: {exc}") from exc
    except redis_errors.RedisError as exc:
        raise BackendError(f"redis refused {operation}: {exc}") from exc


def _is_nogroup(exc: redis_errors.ResponseError) -> bool:
    # a cluster pipeline prefixes the server's error with the failed command
    return "NOGROUP" in str(exc)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _fields(raw: Mapping[Any, Any]) -> dict[str, bytes]:
    return {_text(name): value for name, value in raw.items()}


def _wire(mapping: Mapping[str, bytes] | Mapping[str, str]) -> dict[FieldT, EncodableT]:
    return {name: value for name, value in mapping.items()}


class _FilePassword(CredentialProvider):
    """The URL's user name with a password read (again) for each new connection."""

    def __init__(self, username: str | None, access: RedisAccess) -> None:
        self._username = username
        self._access = access

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        password = self._access.password() or ""
        return (self._username, password) if self._username else (password,)

    async def get_credentials_async(self) -> tuple[str] | tuple[str, str]:
        return self.get_credentials()


def _connection_options(url: str, access: RedisAccess | None) -> tuple[str, dict[str, Any]]:
    """The URL to hand redis-py and its keyword arguments for TLS and a password kept
    out of the URL."""
    if access is None:
        return url, {}
    options: dict[str, Any] = {}
    secure = url.lower().startswith("rediss://")
    if access.ca_file or access.cert_file:
        if not secure:
            raise ConfigError("Redis TLS files are set but the URL is not rediss://")
        options.update(ssl_ca_certs=access.ca_file, ssl_certfile=access.cert_file,
                       ssl_keyfile=access.key_file, ssl_cert_reqs="required")
    if access.password() is not None:
        if url_password(url) is not None:
            raise ConfigError("the Redis password is both in the URL and in "
                              "CANARY_REDIS_PASSWORD_FILE: give it once")
        username = urlsplit(url).username
        options["credential_provider"] = _FilePassword(username, access)
        # from_url would pass the URL's user name too, which redis-py refuses
        # alongside a credential provider
        url = _without_userinfo(url)
    return url, options


def _open_client(
    url: str,
    *,
    socket_timeout: float | None,
    connect_timeout: float,
    retries: int,
    access: RedisAccess | None = None,
) -> tuple[Redis | RedisCluster, Sentinel | None]:
    """The client for `url`, and the Sentinel it asks for the primary (to close)."""
    timeouts: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), retries),
    }
    cluster_url = split_cluster_url(url)
    if cluster_url is not None:
        first, seeds = cluster_url
        first, options = _connection_options(first, access)
        cluster: RedisCluster = RedisCluster.from_url(
            first,
            startup_nodes=[ClusterNode(host, port) for host, port in seeds],
            decode_responses=False,
            **timeouts,
            **options,
        )
        return cluster, None
    target = split_sentinel_url(url)
    if target is not None:
        _, options = _connection_options(target.plain_url, access)
        if "credential_provider" not in options:
            options.update(username=target.username, password=target.password)
        # the sentinels are asked with the same short timeouts, never blocking
        sentinel = Sentinel(
            target.seeds,
            sentinel_kwargs={"socket_timeout": DEFAULT_SOCKET_TIMEOUT,
                             "socket_connect_timeout": connect_timeout},
        )  # fmt: skip
        primary: Redis = sentinel.master_for(
            target.service, redis_class=Redis, db=target.db, ssl=target.tls,
            decode_responses=False, **timeouts, **options,
        )  # fmt: skip
        return primary, sentinel
    url, options = _connection_options(url, access)
    client: Redis = Redis.from_url(url, decode_responses=False, **timeouts, **options)
    return client, None


@dataclass(frozen=True)
class SentinelTarget:
    """A ``redis+sentinel://`` URL, parsed: where to ask, for which primary."""

    seeds: list[tuple[str, int]]
    service: str
    db: int
    tls: bool
    username: str | None
    password: str | None
    plain_url: str  # the same credentials and TLS on one server, for the checks


def split_sentinel_url(url: str) -> SentinelTarget | None:
    """``redis+sentinel://[user[:password]@]host:port[,host:port…]/service[/db]``
    (``rediss+sentinel://`` for TLS to the data nodes); None for any other URL.

    The hosts are sentinels; the user and password are the data nodes'. No query
    options: the timeouts are the constructor's.
    """
    scheme, sep, rest = url.strip().partition("://")
    plain = SENTINEL_SCHEMES.get(scheme.lower())
    if not sep or plain is None:
        return None
    if "?" in rest or "#" in rest:
        raise ConfigError("a Redis Sentinel URL takes no query options")
    netloc, _, path = rest.partition("/")
    service, _, db_text = path.partition("/")
    if _SENTINEL_SERVICE.fullmatch(service) is None:
        raise ConfigError("a Redis Sentinel URL names its primary: /<service>[/<db>]")
    if db_text and (not db_text.isdigit() or int(db_text) > 15):
        raise ConfigError("the Redis database in a Sentinel URL is 0-15")
    userinfo, at, hosts = netloc.rpartition("@")
    seeds = [_seed(part) for part in hosts.split(",")]
    if not 1 <= len(seeds) <= MAX_CLUSTER_SEEDS:
        raise ConfigError(f"a Redis Sentinel URL names 1 to {MAX_CLUSTER_SEEDS} sentinels")
    parts = urlsplit(f"{plain}://{userinfo}{at}localhost")
    return SentinelTarget(
        seeds=seeds,
        service=service,
        db=int(db_text or 0),
        tls=plain == "rediss",
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        plain_url=f"{plain}://{userinfo}{at}localhost",
    )


def split_cluster_url(url: str) -> tuple[str, list[tuple[str, int]]] | None:
    """``redis+cluster://[user[:password]@]host:port[,host:port…][/0][?options]`` as
    the plain URL of its first seed (``redis://`` or ``rediss://``) and the other
    seeds; None for a URL that is not a cluster URL.

    Seeds are only where the client starts: it learns every node from the first one
    that answers. Strict: a missing port, a database other than 0 (a cluster has
    only db 0) or more than MAX_CLUSTER_SEEDS seeds is a ConfigError.
    """
    scheme, sep, rest = url.strip().partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if not sep or plain is None:
        return None
    netloc, slash, tail = rest.partition("/")
    path, question, query = tail.partition("?")
    if "?" in netloc:  # no path: the query follows the hosts directly
        netloc, _, query = netloc.partition("?")
        question = "?"
    if path not in ("", "0"):
        raise ConfigError("a Redis Cluster URL has no database other than /0")
    userinfo, at, hosts = netloc.rpartition("@")
    seeds = [_seed(part) for part in hosts.split(",")]
    if not 1 <= len(seeds) <= MAX_CLUSTER_SEEDS:
        raise ConfigError(f"a Redis Cluster URL names 1 to {MAX_CLUSTER_SEEDS} seeds")
    host, port = seeds[0]
    bracketed = f"[{host}]" if ":" in host else host
    first = f"{plain}://{userinfo}{at}{bracketed}:{port}{slash and '/'}{question}{query}"
    return first, seeds[1:]


def _seed(text: str) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if (
        not colon
        or _SEED_HOST.fullmatch(host) is None
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
    ):
        raise ConfigError("each Redis Cluster seed is host:port with a port 1-65535")
    return host, int(port)


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class RedisStreams:
    """Redis Streams with consumer groups for samples; a hash and a stream for snapshots."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "canary",
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        access: RedisAccess | None = None,
    ) -> None:
        self._keys = RedisKeys(namespace)
        self._socket_timeout = socket_timeout
        self._client, sentinel = _open_client(
            url, socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries,
            access=access,
        )
        self._blocking, blocking_sentinel = _open_client(
            url, socket_timeout=None, connect_timeout=connect_timeout, retries=retries,
            access=access,
        )
        self._sentinels = [s for s in (sentinel, blocking_sentinel) if s is not None]
        self._remove_if_unchanged = self._client.register_script(_REMOVE_IF_UNCHANGED)
        self._append = self._client.register_script(_APPEND)
        self._cluster = isinstance(self._client, RedisCluster)
        self._next_blocking = 0  # where the next blocking wait over slots starts

    # --- SampleStream -------------------------------------------------------

    async def append(
        self, service: str, batches: Sequence[Mapping[str, bytes]], *, maxlen: int
    ) -> list[str]:
        if not batches:
            return []
        keys = [self._keys.samples(service)]
        key_of: dict[str, int] = {}
        args: list[EncodableT] = [maxlen, SOURCE_SEQ_TTL_SEC]
        for batch in batches:
            origin = source_and_seq(batch)
            k, seq = 0, ""
            if origin is not None:
                source, number = origin
                if source not in key_of:
                    keys.append(self._keys.source_seq(service, source))
                    key_of[source] = len(keys)
                k, seq = key_of[source], str(number)
            args += [k, seq, len(batch)]
            for name, value in batch.items():
                args += [name, value]
        with _boundary("append"):
            ids: Any = await self._append(keys=keys, args=args)
        return [_text(entry_id) for entry_id in ids]

    async def ensure_group(self, service: str, group: str) -> None:
        with _boundary("ensure_group"):
            await self._create_group(self._keys.samples(service), group)

    async def read_group(
        self,
        services: Sequence[str],
        group: str,
        consumer: str,
        *,
        count: int,
        block_ms: int,
    ) -> list[StreamEntry]:
        if not services:
            return []
        service_of = {self._keys.samples(service): service for service in services}
        entries: list[StreamEntry] = []
        with _boundary("read_group"):
            try:
                replies = await self._read(service_of, group, consumer, count, block_ms)
            except redis_errors.ResponseError as exc:
                if not _is_nogroup(exc):
                    raise
                # A stream deleted (or expired) under the group: the group goes with
                # it. Recreate and read again rather than stall the collector.
                for key in service_of:
                    await self._create_group(key, group)
                replies = await self._read(service_of, group, consumer, count, block_ms)
        for key, stream_entries in replies:
            service = service_of[_text(key)]
            for entry_id, fields in stream_entries:
                if entry_id is None or fields is None:
                    continue
                entries.append(StreamEntry(service, _text(entry_id), _fields(fields), 1))
        return entries

    async def ack(self, service: str, group: str, entry_ids: Sequence[str]) -> int:
        if not entry_ids:
            return 0
        with _boundary("ack"):
            try:
                acked: int = await self._client.xack(
                    self._keys.samples(service), group, *entry_ids
                )
            except redis_errors.ResponseError as exc:
                if not _is_nogroup(exc):
                    raise
                return 0
        return acked

    async def ack_many(self, group: str, entry_ids: Mapping[str, Sequence[str]]) -> int:
        wanted = [(service, ids) for service, ids in entry_ids.items() if ids]
        if not wanted:
            return 0
        with _boundary("ack_many"):
            async with self._client.pipeline(transaction=False) as pipe:
                for service, ids in wanted:
                    pipe.xack(self._keys.samples(service), group, *ids)
                replies = await pipe.execute(raise_on_error=False)
            acked = 0
            for reply in replies:
                if isinstance(reply, redis_errors.ResponseError) and _is_nogroup(reply):
                    continue  # as `ack`: no group, nothing pending in it
                if isinstance(reply, Exception):
                    raise reply  # translated by the boundary, as a single command's
                acked += int(reply)
        return acked

    async def claim_idle(
        self, service: str, group: str, consumer: str, *, min_idle_ms: int, count: int
    ) -> list[StreamEntry]:
        key = self._keys.samples(service)
        claimed: list[tuple[str, dict[str, bytes]]] = []
        with _boundary("claim_idle"):
            cursor: bytes | str = "0-0"
            try:
                while len(claimed) < count:
                    reply = await self._client.xautoclaim(
                        key, group, consumer, min_idle_ms, cursor, count=count - len(claimed)
                    )
                    cursor = reply[0]
                    # Entries trimmed away while pending come back as nil on 6.2 and
                    # not at all on 7.x: there is nothing left to process for them.
                    for entry_id, fields in reply[1]:
                        if entry_id is not None and fields is not None:
                            claimed.append((_text(entry_id), _fields(fields)))
                    if _text(cursor) == "0-0":
                        break
            except redis_errors.ResponseError as exc:
                if not _is_nogroup(exc):
                    raise
                await self._create_group(key, group)
                return []
            deliveries = await self._deliveries(key, group, [entry_id for entry_id, _ in claimed])
        return [
            StreamEntry(service, entry_id, fields, deliveries.get(entry_id, FALLBACK_DELIVERIES))
            for entry_id, fields in claimed
        ]

    async def pending(self, service: str, group: str) -> int:
        with _boundary("pending"):
            try:
                summary = await self._client.xpending(self._keys.samples(service), group)
            except redis_errors.ResponseError as exc:
                if not _is_nogroup(exc):
                    raise
                return 0
        return int(summary["pending"])

    async def pending_many(
        self, group: str, services: Sequence[str], *, min_idle_ms: int
    ) -> dict[str, PendingSummary]:
        if not services:
            return {}
        found: dict[str, PendingSummary] = {}
        with _boundary("pending_many"):
            async with self._client.pipeline(transaction=False) as pipe:
                for service in services:
                    key = self._keys.samples(service)
                    pipe.xpending(key, group)
                    # one idle entry is enough to know a claim has work
                    pipe.xpending_range(key, group, min="-", max="+", count=1,
                                        idle=min_idle_ms)  # fmt: skip
                replies = await pipe.execute(raise_on_error=False)
            for i, service in enumerate(services):
                summary, idle = replies[2 * i], replies[2 * i + 1]
                failed = [r for r in (summary, idle) if isinstance(r, Exception)]
                if any(
                    isinstance(r, redis_errors.ResponseError) and _is_nogroup(r)
                    for r in failed
                ):
                    found[service] = NOTHING_PENDING  # as `pending`: no group, nothing
                    continue
                if failed:
                    raise failed[0]  # translated by the boundary, as a single command's
                found[service] = PendingSummary(int(summary["pending"]), bool(idle))
        return found

    async def services(self) -> list[str]:
        found: set[str] = set()
        with _boundary("services"):
            async for key in self._client.scan_iter(
                match=self._keys.samples_pattern, count=1000, _type="stream"
            ):
                service = self._keys.service_of_samples(_text(key))
                # a stream anyone else created under a malformed name is not ours to read
                if is_service_name(service):
                    found.add(service)
        return sorted(found)

    # --- SnapshotBoard ------------------------------------------------------

    async def publish(
        self, experiment: str, per_variant: Mapping[str, str], decision: Mapping[str, str]
    ) -> None:
        if not decision:
            raise ValueError("a decision entry needs at least one field")
        with _boundary("publish"):
            async with self._client.pipeline(transaction=False) as pipe:
                if per_variant:
                    pipe.hset(self._keys.stats(experiment), mapping=_wire(per_variant))
                pipe.xadd(
                    self._keys.decisions,
                    _wire(decision),
                    maxlen=DECISIONS_MAXLEN,
                    approximate=True,
                )
                await pipe.execute()

    async def write_many(self, fields: Mapping[str, Mapping[str, str]]) -> None:
        wanted = [(experiment, values) for experiment, values in fields.items() if values]
        if not wanted:
            return
        with _boundary("write_many"):
            async with self._client.pipeline(transaction=False) as pipe:
                for experiment, values in wanted:
                    pipe.hset(self._keys.stats(experiment), mapping=_wire(values))
                await pipe.execute()

    async def read(self, experiment: str) -> dict[str, str]:
        with _boundary("read"):
            raw = await self._client.hgetall(self._keys.stats(experiment))
        return {_text(name): _text(value) for name, value in raw.items()}

    async def read_many(self, experiments: Sequence[str]) -> list[dict[str, str]]:
        if not experiments:
            return []
        with _boundary("read_many"):
            async with self._client.pipeline(transaction=False) as pipe:
                for experiment in experiments:
                    pipe.hgetall(self._keys.stats(experiment))
                replies = await pipe.execute()
        return [
            {_text(name): _text(value) for name, value in raw.items()} for raw in replies
        ]

    async def remove_if_unchanged(self, experiment: str, expected: Mapping[str, str]) -> list[str]:
        if not expected:
            return []
        args = [part for name, value in expected.items() for part in (name, value)]
        with _boundary("remove_if_unchanged"):
            removed: Any = await self._remove_if_unchanged(
                keys=[self._keys.stats(experiment)], args=args
            )
        return [_text(name) for name in removed or ()]

    async def recent_decisions(self, count: int) -> list[dict[str, str]]:
        if count <= 0:
            return []  # XREVRANGE reads COUNT 0 as "no limit"
        with _boundary("recent decisions"):
            raw: Any = await self._client.xrevrange(self._keys.decisions, count=count)
        return [
            {_text(name): _text(value) for name, value in fields.items()}
            for _, fields in raw or ()
        ]

    # --- RouteReports -------------------------------------------------------

    async def report_route(self, service: str, instance: str, revision: int, now: float) -> None:
        key = self._keys.route_reports(service)
        member = report_member(instance, revision)
        with _boundary("report route"):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zadd(key, {member: now})
                pipe.zremrangebyscore(key, "-inf", now - FORGET_SEC)
                pipe.zremrangebyscore(key, f"({now + CLOCK_SKEW_SEC}", "+inf")
                pipe.expire(key, int(FORGET_SEC * 2))  # a service whose data planes all left
                await pipe.execute()

    async def route_reports(self, service: str) -> list[RouteReport]:
        with _boundary("route reports"):
            raw: Any = await self._client.zrevrangebyscore(
                self._keys.route_reports(service), "+inf", "-inf", start=0, num=MAX_REPORTS,
                withscores=True,
            )
        found = []
        for member, score in raw or ():
            try:
                report = parse_member(_text(member), float(score))
            except (UnicodeDecodeError, ValueError, TypeError):
                report = None  # bytes no reporter of ours wrote
            if report is not None:
                found.append(report)
        return found

    # --- Alarms -------------------------------------------------------------

    async def raise_alarms(self, experiments: Mapping[str, float], now: float) -> None:
        if not experiments:
            return
        key = self._keys.alarms
        with _boundary("raise alarms"):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zadd(key, dict(experiments), gt=True)
                pipe.zremrangebyscore(key, "-inf", now - ALARM_KEEP_SEC)
                pipe.zremrangebyscore(key, f"({now + ALARM_SKEW_SEC}", "+inf")
                pipe.expire(key, int(ALARM_KEEP_SEC * 2))
                await pipe.execute()

    async def alarms_since(self, since: float) -> tuple[dict[int, float], int]:
        low = "-inf" if not math.isfinite(since) else f"({since!r}"
        with _boundary("read alarms"):
            raw: Any = await self._client.zrevrangebyscore(
                self._keys.alarms, "+inf", low, start=0, num=ALARMS_READ, withscores=True
            )
        members: list[tuple[str, float]] = []
        dropped = 0
        for member, score in raw or ():
            try:
                members.append((_text(member), float(score)))
            except (UnicodeDecodeError, ValueError, TypeError):
                dropped += 1  # bytes no collector of ours wrote
        found, malformed = parsed_alarms(members)
        return found, dropped + malformed

    async def close(self) -> None:
        await self._client.aclose()
        await self._blocking.aclose()
        for sentinel in self._sentinels:
            await sentinel.aclose()
        self._sentinels = []

    # --- internals ----------------------------------------------------------

    async def _create_group(self, key: str, group: str) -> None:
        try:
            await self._client.xgroup_create(key, group, id="0", mkstream=True)
        except redis_errors.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise

    async def _read(
        self, service_of: Mapping[str, str], group: str, consumer: str, count: int, block_ms: int
    ) -> list[tuple[Any, Any]]:
        if self._cluster:
            by_slot: dict[int, list[str]] = {}
            for key in service_of:
                by_slot.setdefault(key_slot(key.encode()), []).append(key)
            if len(by_slot) > 1:
                return await self._read_cluster(list(by_slot.values()), group, consumer,
                                                count, block_ms)
        return self._stream_replies(
            await self._xreadgroup(list(service_of), group, consumer, count, block_ms)
        )

    async def _read_cluster(
        self, slots: list[list[str]], group: str, consumer: str, count: int, block_ms: int
    ) -> list[tuple[Any, Any]]:
        """One XREADGROUP per slot (a cluster refuses keys of several slots in one).

        First a look at every slot without blocking, MAX_CONCURRENT_SLOTS at a time;
        only when that found nothing, a wait of up to block_ms on at most that many
        slots at once, all waited for (a wait is never cancelled: entries it was
        handed would be left pending on this consumer).
        """
        found: list[tuple[Any, Any]] = []
        for wave in range(0, len(slots), MAX_CONCURRENT_SLOTS):
            found += await self._read_slots(
                slots[wave : wave + MAX_CONCURRENT_SLOTS], group, consumer, count, 0
            )
        if any(entries for _, entries in found) or block_ms <= 0:
            return found
        start = self._next_blocking % len(slots)
        chosen = (slots[start:] + slots[:start])[:MAX_CONCURRENT_SLOTS]
        self._next_blocking = start + len(chosen)
        return await self._read_slots(chosen, group, consumer, count, block_ms)

    async def _read_slots(
        self, slots: list[list[str]], group: str, consumer: str, count: int, block_ms: int
    ) -> list[tuple[Any, Any]]:
        replies = await asyncio.gather(
            *(self._xreadgroup(keys, group, consumer, count, block_ms) for keys in slots),
            return_exceptions=True,
        )
        found = [
            pair
            for reply in replies
            if not isinstance(reply, BaseException)
            for pair in self._stream_replies(reply)
        ]
        failed = [reply for reply in replies if isinstance(reply, BaseException)]
        # what the other slots handed over is returned, not lost to one slot's failure
        # (a node failing over): left pending, it would wait for a claim
        if failed and not any(entries for _, entries in found):
            raise failed[0]
        return found

    async def _xreadgroup(
        self, keys: Sequence[str], group: str, consumer: str, count: int, block_ms: int
    ) -> Any:
        streams: dict[Any, Any] = dict.fromkeys(keys, ">")
        if block_ms <= 0:
            return await self._client.xreadgroup(group, consumer, streams, count=count)
        # The blocking pool has no socket timeout; this bound replaces it.
        async with asyncio.timeout(block_ms / 1000 + self._socket_timeout):
            return await self._blocking.xreadgroup(
                group, consumer, streams, count=count, block=block_ms
            )

    @staticmethod
    def _stream_replies(reply: Any) -> list[tuple[Any, Any]]:
        # RESP2 answers [[key, entries], …]; RESP3 answers {key: entries} (redis-py
        # may wrap each value in a one-element list there).
        if not reply:
            return []
        if isinstance(reply, dict):
            pairs = []
            for key, value in reply.items():
                if value and isinstance(value[0], list):
                    value = value[0]
                pairs.append((key, value))
            return pairs
        return [(key, entries) for key, entries in reply]

    async def _deliveries(self, key: str, group: str, entry_ids: Sequence[str]) -> dict[str, int]:
        if not entry_ids:
            return {}
        async with self._client.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.xpending_range(key, group, min=entry_id, max=entry_id, count=1)
            replies = await pipe.execute()
        counts: dict[str, int] = {}
        for rows in replies:
            for row in rows:
                counts[_text(row["message_id"])] = int(row["times_delivered"])
        return counts
