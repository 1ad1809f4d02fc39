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

TLS and credentials (`RedisAccess`): ``rediss://`` with a CA and optionally a client
certificate; the password in the URL or in a file, read again for every new
connection (a rotated password needs no restart). The URL is never logged with its
password, and errors name the server without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.credentials import CredentialProvider
from redis.typing import EncodableT, FieldT

from controlplane.kernel.backend_access import RedisAccess
from controlplane.kernel.errors import BackendError, BackendUnavailable, ConfigError
from controlplane.kernel.keys import RedisKeys, is_service_name
from controlplane.kernel.secrets import url_password
from controlplane.kernel.streams import DECISIONS_MAXLEN, StreamEntry

DEFAULT_SOCKET_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 0.5
# One immediate retry replaces a pooled connection that died with a Redis restart;
# more would only delay the BackendUnavailable a caller is waiting to see.
DEFAULT_RETRIES = 1
# XAUTOCLAIM cannot report how often an entry was delivered; when the follow-up
# XPENDING does not say either, an entry being claimed was delivered at least twice.
FALLBACK_DELIVERIES = 2

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
    except redis_errors.RedisError as exc:
        raise BackendError(f"redis refused {operation}: {exc}") from exc


def _is_nogroup(exc: redis_errors.ResponseError) -> bool:
    return str(exc).startswith("NOGROUP")


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
) -> Redis:
    url, options = _connection_options(url, access)
    client: Redis = Redis.from_url(
        url,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), retries),
        **options,
    )
    return client


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
        self._client = _open_client(
            url, socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries,
            access=access,
        )
        self._blocking = _open_client(
            url, socket_timeout=None, connect_timeout=connect_timeout, retries=retries,
            access=access,
        )
        self._remove_if_unchanged = self._client.register_script(_REMOVE_IF_UNCHANGED)

    # --- SampleStream -------------------------------------------------------

    async def append(
        self, service: str, batches: Sequence[Mapping[str, bytes]], *, maxlen: int
    ) -> list[str]:
        if not batches:
            return []
        key = self._keys.samples(service)
        with _boundary("append"):
            async with self._client.pipeline(transaction=False) as pipe:
                for batch in batches:
                    pipe.xadd(key, _wire(batch), maxlen=maxlen, approximate=True)
                ids = await pipe.execute()
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
                reply = await self._xreadgroup(service_of, group, consumer, count, block_ms)
            except redis_errors.ResponseError as exc:
                if not _is_nogroup(exc):
                    raise
                # A stream deleted (or expired) under the group: the group goes with
                # it. Recreate and read again rather than stall the collector.
                for key in service_of:
                    await self._create_group(key, group)
                reply = await self._xreadgroup(service_of, group, consumer, count, block_ms)
        for key, stream_entries in self._stream_replies(reply):
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

    async def close(self) -> None:
        await self._client.aclose()
        await self._blocking.aclose()

    # --- internals ----------------------------------------------------------

    async def _create_group(self, key: str, group: str) -> None:
        try:
            await self._client.xgroup_create(key, group, id="0", mkstream=True)
        except redis_errors.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise

    async def _xreadgroup(
        self, service_of: Mapping[str, str], group: str, consumer: str, count: int, block_ms: int
    ) -> Any:
        streams: dict[Any, Any] = dict.fromkeys(service_of, ">")
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
