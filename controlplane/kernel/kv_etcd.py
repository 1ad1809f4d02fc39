"""The etcd v3 configuration store, on etcd3aio (grpc.aio).

The one module that knows etcd: grpc and etcd3aio errors become
controlplane.kernel.errors here, and nowhere else.

Two things are done by hand rather than with etcd3aio's helpers (see
docs/decisions/0001-etcd-client.md):
- watches: etcd3aio's reconnecting watch resumes from the last response header's
  revision, which can skip events (a reconnect after the "created" response of a
  watch that replays history) and it does not surface compaction. This module
  resumes after the last revision it yielded instead.
- lease keepalive: etcd3aio's LeaseKeepalive only logs failures, so a leader could
  not tell that its lease lapsed. Here the TTL is tracked locally and `lost()`
  returns as soon as it runs out without a confirmed renewal.

A cluster (docs/decisions/0029-etcd-cluster.md): a channel per listed member, taken
in turn; a call refused by one member, or left unanswered for half its time, is
made again on the next. Every call requires a member with a raft leader
(``hasleader``), so a member cut off from the quorum refuses at once and ends the
watches it serves, which resume on another member.

TLS and auth (`EtcdAccess`): ``https://`` endpoints or a CA select a TLS channel,
with a client certificate for etcd's ``--client-cert-auth``. With a user, the
client authenticates on first use and sends the token with every call; etcd's
tokens expire (simple tokens after 5 idle minutes), so a call refused for its
token authenticates again and is retried once, and a watch that etcd cancels for
want of permission is reopened once with a fresh token. The password is read only
to authenticate and never appears in an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio
from etcd3aio import (
    EtcdConnectionError,
    EtcdError,
    EtcdTransientError,
    prefix_range_end,
)
from etcd3aio._protobuf import Compare, WatchCreateRequest, WatchRequest, WatchStub
from etcd3aio.auth import AuthService
from etcd3aio.errors import EtcdPermissionDeniedError, EtcdUnauthenticatedError
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService

from controlplane.kernel.backend_access import EtcdAccess
from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.errors import (
    BackendError,
    BackendUnavailable,
    ConfigError,
    NotLeader,
    RevisionConflict,
)
from controlplane.kernel.etcd_endpoints import parse_endpoints
from controlplane.kernel.kv import (
    EventKind,
    Fence,
    KeyValue,
    Leadership,
    LeaseSession,
    RevisionCompacted,
    WatchEvent,
)
from controlplane.kernel.tasks import cancel_and_wait

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
PING_TIMEOUT = 1.0
_TRANSIENT = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    # etcd ends streams with CANCELLED or UNKNOWN while it shuts down.
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
)
_WATCH_BACKOFF = BackoffPolicy(initial=0.1, maximum=2.0)
# gRPC's own defaults back off up to 120 s between connection attempts, which would
# keep a watcher blind long after etcd is back.
_CHANNEL_OPTIONS: list[tuple[str, int | str | bool]] = [
    # one member's name may resolve to several addresses (or one name to every member)
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", True),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
_EVENT_DELETE = 1  # mvccpb.Event.EventType
# etcd's rpctypes.MetadataRequireLeaderKey / MetadataHasLeader
_HAS_LEADER = ("hasleader", "true")
_T = TypeVar("_T")


class _CredentialsMissing(BackendUnavailable):
    """etcd requires authentication and no user is configured: no member will differ."""


class _Closed(BackendUnavailable):
    """The client was closed."""


class _NoAnswer(BackendUnavailable):
    """No answer within the attempt's deadline: the member may be frozen or cut off."""


class _TokenRejected(BackendUnavailable):
    """etcd refused the auth token: expired, or revoked by an auth change."""


class _PermissionDenied(BackendError):
    """The etcd user's roles do not cover the key."""


class _AuthRefused(BackendUnavailable):
    """etcd refused the user's credentials: no other member will accept them."""


class _AuthDisabled(BackendError):
    """A user is configured but etcd does not have authentication enabled."""


@contextlib.contextmanager
def _translated(operation: str) -> Iterator[None]:
    try:
        yield
    except EtcdUnauthenticatedError as exc:
        raise _TokenRejected(f"etcd {operation}: the auth token was refused ({exc})") from exc
    except EtcdPermissionDeniedError as exc:
        raise _PermissionDenied(
            f"etcd {operation}: permission denied (the etcd user needs a role on this prefix)"
        ) from exc
    except (EtcdConnectionError, EtcdTransientError) as exc:
        raise BackendUnavailable(f"etcd {operation}: {exc}") from exc
    except TimeoutError as exc:
        raise _NoAnswer(f"etcd {operation}: no answer in time") from exc
    except grpc.aio.UsageError as exc:
        raise _Closed(f"etcd {operation}: the client is closed") from exc
    except grpc.aio.AioRpcError as exc:
        message = f"etcd {operation}: {exc.code().name} {exc.details() or ''}".rstrip()
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise _TokenRejected(message) from exc
        if _needs_credentials(exc):
            raise _CredentialsMissing(
                f"etcd {operation}: etcd requires authentication: set CANARY_ETCD_USER and "
                "CANARY_ETCD_PASSWORD_FILE (or CANARY_ETCD_PASSWORD)"
            ) from exc
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise _NoAnswer(message) from exc
        if exc.code() in _TRANSIENT:
            raise BackendUnavailable(message) from exc
        raise BackendError(message) from exc
    except EtcdError as exc:
        raise BackendError(f"etcd {operation}: {exc}") from exc


def _needs_credentials(exc: grpc.aio.AioRpcError) -> bool:
    return exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in (
        exc.details() or ""
    )


@contextlib.contextmanager
def _authenticating(user: str) -> Iterator[None]:
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        details = exc.details() or ""
        if "authentication is not enabled" in details:
            raise _AuthDisabled(details) from exc
        if "authentication failed" in details:
            raise _AuthRefused(
                f"etcd: authentication as {user!r} failed: wrong user name or password"
            ) from exc
        raise
    except EtcdUnauthenticatedError as exc:
        raise _AuthRefused(f"etcd: authentication as {user!r} refused: {exc}") from exc


def _require_leader(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(*_HAS_LEADER)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _RequireLeader(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Every call asks for a member that has a raft leader (clientv3's WithRequireLeader).

    A member cut off from the quorum then refuses at once (UNAVAILABLE "no leader"),
    and the retry goes to another member, instead of the call waiting out its deadline.
    """

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(_require_leader(client_call_details), request)


class _RequireLeaderStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Watches and lease keepalives likewise: the member ends them when it loses its
    leader, so a watch on a partitioned member resumes elsewhere instead of going
    quiet for good."""

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return await continuation(_require_leader(client_call_details), request_iterator)


def _credentials(access: EtcdAccess) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=access.ca, private_key=access.key, certificate_chain=access.cert
    )


def _key_value(raw: Any) -> KeyValue:
    return KeyValue(
        key=raw.key.decode(),
        value=bytes(raw.value),
        mod_revision=int(raw.mod_revision),
        create_revision=int(raw.create_revision),
    )


def _fence_compare(fence: Fence) -> Any:
    return KVService.txn_compare_create_revision(fence.key, fence.create_revision)


def _mod_revision_compare(key: str, mod_revision: int) -> Any:
    return Compare(result=Compare.EQUAL, target=Compare.MOD, key=key.encode(),
                   mod_revision=mod_revision)


def _fence_holds(fence: Fence, range_response: Any) -> bool:
    kvs = range_response.response_range.kvs
    return bool(kvs) and int(kvs[0].create_revision) == fence.create_revision


def next_member(failed: Sequence[bool], turn: int) -> int:
    """The member to ask, by index: the first from `turn` on (wrapping) whose
    connection has not failed; `turn`'s own when every one has (gRPC is retrying
    them all, and one may be back)."""
    count = len(failed)
    for step in range(count):
        index = (turn + step) % count
        if not failed[index]:
            return index
    return turn % count


@dataclass(frozen=True)
class _Member:
    """One member's channel and the etcd services on it."""

    channel: grpc.aio.Channel
    kv: KVService
    lease: LeaseService
    auth: AuthService
    watch: Any


class EtcdKV:
    def __init__(
        self,
        endpoints: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        rpc_attempts: int = 3,
        access: EtcdAccess | None = None,
    ) -> None:
        parsed = parse_endpoints(endpoints)
        self._targets = parsed.targets
        self._access = access or EtcdAccess()
        self._tls = parsed.tls or self._access.tls
        if self._access.cert is not None and not self._tls:
            raise ConfigError("an etcd client certificate is set but TLS is not")
        self._timeout = timeout
        self._rpc_attempts = rpc_attempts
        self._members: list[_Member] = []
        self._turn = 0
        self._token: str | None = None
        self._auth_lock: asyncio.Lock | None = None
        self._closed = False
        self._leaderships: set[EtcdLeadership] = set()
        self._sessions: set[EtcdLeaseSession] = set()

    # The channels are opened at first use, inside the event loop that will drive them.
    def _connect(self) -> list[_Member]:
        if self._closed:
            raise _Closed("the etcd client is closed")
        if not self._members:
            self._members = [self._open_member(target) for target in self._targets]
            self._apply_token(self._token)
        return self._members

    def _open_member(self, target: str) -> _Member:
        # A channel per member, not one over all of them: each checks its member's
        # certificate against that member's own name, and resolves its own DNS name.
        interceptors = [_RequireLeader(), _RequireLeaderStream()]
        if self._tls:
            channel = grpc.aio.secure_channel(
                target, _credentials(self._access), options=_CHANNEL_OPTIONS,
                interceptors=interceptors,
            )
        else:
            channel = grpc.aio.insecure_channel(
                target, options=_CHANNEL_OPTIONS, interceptors=interceptors
            )
        return _Member(
            channel=channel,
            kv=KVService(channel, max_attempts=self._rpc_attempts),
            lease=LeaseService(channel, max_attempts=self._rpc_attempts),
            auth=AuthService(channel, max_attempts=self._rpc_attempts),
            watch=WatchStub(channel),
        )

    def _pick(self) -> _Member:
        """The next member in turn, passing over those whose connection failed."""
        members = self._connect()
        failed = [m.channel.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE
                  for m in members]
        index = next_member(failed, self._turn)
        self._turn = (index + 1) % len(members)
        return members[index]

    # -- authentication --

    def _apply_token(self, token: str | None) -> None:
        self._token = token
        for member in self._members:
            member.kv.set_token(token or None)
            member.lease.set_token(token or None)

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("token", self._token),) if self._token else None

    async def _authenticated(self) -> None:
        """Hold a token when a user is configured (authenticating once for all callers)."""
        user = self._access.user
        if user is None or self._token is not None:
            return
        if self._auth_lock is None:
            self._auth_lock = asyncio.Lock()
        async with self._auth_lock:
            if self._token is not None:
                return
            password = self._access.password() or ""
            # like any call, once per member: the one in turn may be the one that is gone
            for tries in range(1, len(self._connect()) + 1):
                auth = self._pick().auth
                try:
                    with _translated("authenticate"), _authenticating(user):
                        response = await auth.authenticate(
                            user, password, timeout=self._timeout
                        )
                    break
                except _AuthDisabled:
                    _log.warning("etcd has authentication disabled: calls go without a token")
                    self._apply_token("")
                    return
                except (_AuthRefused, _CredentialsMissing, _Closed):
                    raise
                except BackendUnavailable:
                    if tries == len(self._members):
                        raise
            self._apply_token(str(response.token))

    def _forget_token(self, stale: str | None) -> None:
        if self._token == stale:
            self._apply_token(None)

    async def _call(
        self, operation: str, call: Callable[[_Member, float], Awaitable[_T]], *,
        timeout: float | None = None,
    ) -> _T:
        """One etcd call within `timeout` (the store's) in all, tried once per member.

        An attempt refused for want of a member (gone, or without a raft leader) is
        made again at once on the next member; with several members an attempt may
        take half the budget, so that one that gets no answer (a member frozen or
        cut off keeps its connection open and answers nothing) leaves time for the
        next. A refused token is renewed and the call made once more.
        """
        budget = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        members = len(self._connect())
        share = budget / 2 if members > 1 else budget
        renewed = False
        failures = 0
        while True:
            await self._authenticated()
            token = self._token
            member = self._pick()
            left = max(deadline - time.monotonic(), 0.001)
            try:
                with _translated(operation):
                    return await call(member, min(share, left))
            except _TokenRejected:
                if self._access.user is None or renewed:
                    raise
                renewed = True
                self._forget_token(token)
            except (_CredentialsMissing, _Closed):
                raise
            except BackendUnavailable:
                failures += 1
                if failures >= members or time.monotonic() >= deadline - 0.001:
                    raise

    async def get(self, key: str) -> KeyValue | None:
        response = await self._call("get", lambda m, t: m.kv.get(key, timeout=t))
        return _key_value(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        response = await self._call("get_prefix", lambda m, t: m.kv.get(
            prefix, range_end=prefix_range_end(prefix), timeout=t))
        return [_key_value(item) for item in response.kvs], int(response.header.revision)

    async def put(self, key: str, value: bytes, *, fence: Fence | None = None) -> int:
        if fence is None:
            response = await self._call(
                "put", lambda m, t: m.kv.put(key, value, timeout=t))
            return int(response.header.revision)
        txn = await self._call("put", lambda m, t: m.kv.txn(
            [_fence_compare(fence)],
            [KVService.txn_op_put(key, value)],
            [KVService.txn_op_get(fence.key)],
            timeout=t,
        ))
        if not txn.succeeded:
            raise NotLeader(f"leadership {fence.key} at revision {fence.create_revision} is gone")
        return int(txn.header.revision)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, fence: Fence | None = None
    ) -> int:
        compares = [_mod_revision_compare(key, expected_mod_revision)]
        # The failure branch reads back what failed, so one round trip tells a stale
        # fence (NotLeader) from a lost race (RevisionConflict).
        on_failure = [KVService.txn_op_get(key)]
        if fence is not None:
            compares.append(_fence_compare(fence))
            on_failure.append(KVService.txn_op_get(fence.key))
        txn = await self._call("compare_and_swap", lambda m, t: m.kv.txn(
            compares, [KVService.txn_op_put(key, value)], on_failure, timeout=t))
        if txn.succeeded:
            return int(txn.header.revision)
        if fence is not None and not _fence_holds(fence, txn.responses[1]):
            raise NotLeader(f"leadership {fence.key} at revision {fence.create_revision} is gone")
        current = txn.responses[0].response_range.kvs
        actual = int(current[0].mod_revision) if current else 0
        raise RevisionConflict(f"{key} is at revision {actual}, expected {expected_mod_revision}")

    async def delete(self, key: str, *, fence: Fence | None = None) -> bool:
        if fence is None:
            response = await self._call("delete", lambda m, t: m.kv.delete(key, timeout=t))
            return int(response.deleted) > 0
        txn = await self._call("delete", lambda m, t: m.kv.txn(
            [_fence_compare(fence)],
            [KVService.txn_op_delete(key)],
            [KVService.txn_op_get(fence.key)],
            timeout=t,
        ))
        if not txn.succeeded:
            raise NotLeader(f"leadership {fence.key} at revision {fence.create_revision} is gone")
        return int(txn.responses[0].response_delete_range.deleted) > 0

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        return self._watch_range(prefix, prefix_range_end(prefix), start_revision)

    def watch_key(self, key: str, *, start_revision: int = 0) -> AsyncGenerator[WatchEvent, None]:
        return self._watch_range(key, b"", start_revision)

    async def _watch_range(
        self, key: str, range_end: bytes, after: int
    ) -> AsyncGenerator[WatchEvent, None]:
        # `after` is the last revision the caller has seen; 0 until the first stream
        # tells us which revision "now" is.
        backoff = Backoff(_WATCH_BACKOFF)
        renewed = False  # the token was renewed for this stream after a refusal
        while not self._closed:
            try:
                await self._authenticated()
            except BackendUnavailable as exc:
                retry_in = backoff.next_delay()
                _log.warning("etcd watch on %s cannot authenticate (%s); retrying in %.1f s",
                             key, exc, retry_in)
                await asyncio.sleep(retry_in)
                continue
            token = self._token
            # etcd's start_revision is inclusive; ours is exclusive.
            request = WatchCreateRequest(
                key=key.encode(), range_end=range_end, start_revision=after + 1 if after else 0
            )
            requests = _WatchRequests(request)
            # the next member in turn: after a lost stream, most likely another one
            stream = self._pick().watch.Watch(requests, metadata=self._metadata())
            delay: float | None = None  # set when the stream failed and said so
            try:
                async for response in stream:
                    if response.compact_revision > 0:
                        raise RevisionCompacted(after, int(response.compact_revision) - 1)
                    if response.canceled:
                        # etcd answers an expired token on a watch with "permission
                        # denied": one fresh token tells the two apart.
                        if self._access.user is not None and not renewed:
                            renewed = True
                            self._forget_token(token)
                            break
                        raise BackendError(f"etcd cancelled the watch: {response.cancel_reason}")
                    if response.created:
                        if not after:
                            after = int(response.header.revision)
                        backoff.reset()
                        renewed = False
                        continue
                    for event in response.events:
                        after = int(event.kv.mod_revision)
                        yield _watch_event(event)
            except asyncio.CancelledError:
                # Closing the channel cancels its calls; that ends the watch, while a
                # cancellation of the watching task itself must go on.
                task = asyncio.current_task()
                if self._closed and task is not None and not task.cancelling():
                    return
                raise
            except grpc.aio.AioRpcError as exc:
                if self._closed:
                    return
                delay = backoff.next_delay()
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED and self._access.user:
                    self._forget_token(token)
                elif exc.code() not in _TRANSIENT:
                    raise BackendError(f"etcd watch: {exc.code().name} {exc.details()}") from exc
                _log.warning("etcd watch on %s lost (%s %s); resuming after revision %d "
                             "in %.1f s", key, exc.code().name, exc.details() or "", after,
                             delay)
            finally:
                requests.finish()
                stream.cancel()
            await asyncio.sleep(backoff.next_delay() if delay is None else delay)

    def leadership(self, name: str, *, identity: str, ttl: int) -> Leadership:
        if ttl <= 0:
            raise ValueError("a leadership TTL must be positive")
        leadership = EtcdLeadership(self, name, identity=identity, ttl=ttl)
        self._leaderships.add(leadership)
        return leadership

    def lease_session(self, *, ttl: int) -> LeaseSession:
        if ttl <= 0:
            raise ValueError("a lease TTL must be positive")
        session = EtcdLeaseSession(self, ttl=ttl)
        self._sessions.add(session)
        return session

    async def ping(self) -> None:
        try:
            await self._call("ping", lambda m, t: m.kv.get(
                "/", timeout=t, max_attempts=1, count_only=True), timeout=PING_TIMEOUT)
        except _PermissionDenied:
            # a user confined to its prefix may not read "/": etcd answered and
            # accepted the token, which is all a ping asks
            return

    async def close(self) -> None:
        # Handing leadership over now spares the other candidates a whole TTL.
        for leadership in list(self._leaderships):
            with contextlib.suppress(BackendError):
                await leadership._release(timeout=PING_TIMEOUT, attempts=1)
        self._leaderships.clear()
        for session in list(self._sessions):
            with contextlib.suppress(BackendError):
                await session._release(timeout=PING_TIMEOUT, attempts=1)
        self._sessions.clear()
        self._closed = True
        members, self._members = self._members, []
        self._token = None
        for member in members:
            await member.channel.close()

    async def _keep_alive_once(self, lease_id: int) -> int:
        """One keepalive round trip; returns the lease's remaining TTL (0: expired)."""
        # bounded by the caller, which gives each renewal a share of the TTL
        async def once(member: _Member, _: float) -> int | None:
            stream = member.lease.keep_alive(lease_id)
            try:
                async for response in stream:
                    return int(response.TTL)
            finally:
                stream.cancel()
            return None

        remaining = await self._call("lease keepalive", once)
        if remaining is None:
            raise BackendUnavailable("etcd lease keepalive: the stream ended without an answer")
        return remaining


class _WatchRequests:
    """The client half of a watch stream: one create request, then open until finished.

    The request side must stay open, or etcd ends the watch. A plain iterator rather
    than an async generator, so that no generator is left for the event loop to
    finalise while gRPC's request task still runs it.
    """

    def __init__(self, create: Any) -> None:
        self._pending: list[Any] = [WatchRequest(create_request=create)]
        self._finished = asyncio.Event()

    def __aiter__(self) -> _WatchRequests:
        return self

    async def __anext__(self) -> Any:
        if self._pending:
            return self._pending.pop()
        await self._finished.wait()
        raise StopAsyncIteration

    def finish(self) -> None:
        self._finished.set()


def _watch_event(event: Any) -> WatchEvent:
    if event.type == _EVENT_DELETE:
        return WatchEvent(kind=EventKind.DELETE, key=event.kv.key.decode(), value=None,
                          mod_revision=int(event.kv.mod_revision))
    return WatchEvent(kind=EventKind.PUT, key=event.kv.key.decode(), value=bytes(event.kv.value),
                      mod_revision=int(event.kv.mod_revision))


class EtcdLeadership:
    """Election by one key under the election name, created only if absent.

    The key is bound to this candidate's lease, so it disappears when the lease is
    revoked or expires; its create_revision is the fence.
    """

    def __init__(self, store: EtcdKV, name: str, *, identity: str, ttl: int) -> None:
        self._store = store
        self._name = name
        self._identity = identity
        self._ttl = ttl
        self._lease_id = 0
        self._fence: Fence | None = None
        self._expiry = _Expiry()
        self._lost = asyncio.Event()
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        if self._fence is None or self._lost.is_set():
            return False
        return time.monotonic() < self._expiry.at

    async def campaign(self) -> Fence:
        if self._fence is not None and self.is_leader:
            return self._fence
        await self._stop_keepalive()
        while True:
            # A lease per attempt: a waiting candidate holds nothing that could expire.
            asked_at = time.monotonic()
            lease_id, ttl, txn = await self._claim()
            if txn.succeeded:
                self._lease_id = lease_id
                self._expiry.at = asked_at + ttl
                self._fence = Fence(key=self._name, create_revision=int(txn.header.revision))
                self._lost = asyncio.Event()
                self._keepalive = asyncio.create_task(
                    self._keep_alive(ttl), name=f"lease-keepalive-{self._name}"
                )
                return self._fence
            # An unrevoked lease only lingers for its TTL, holding no key.
            with contextlib.suppress(BackendError):
                await self._revoke(lease_id)
            await self._wait_for_vacancy(int(txn.header.revision))

    async def _claim(self) -> tuple[int, int, Any]:
        """Grant a lease and create the election key on it if absent: (lease, TTL, txn)."""
        granted = await self._store._call(
            "campaign", lambda m, t: m.lease.grant(self._ttl, timeout=t))
        lease_id = int(granted.ID)
        txn = await self._store._call("campaign", lambda m, t: m.kv.txn(
            [KVService.txn_compare_create_revision(self._name, 0)],
            [KVService.txn_op_put(self._name, self._identity, lease=lease_id)],
            [KVService.txn_op_get(self._name)],
            timeout=t,
        ))
        return lease_id, int(granted.TTL), txn

    async def _revoke(self, lease_id: int) -> None:
        await self._store._call("campaign", lambda m, t: m.lease.revoke(lease_id, timeout=t))

    async def _wait_for_vacancy(self, seen: int) -> None:
        async with contextlib.aclosing(
            self._store.watch_key(self._name, start_revision=seen)
        ) as watch:
            async for event in watch:
                if event.kind is EventKind.DELETE:
                    return

    async def resign(self) -> None:
        await self._release(timeout=self._store._timeout, attempts=self._store._rpc_attempts)

    async def _release(self, *, timeout: float, attempts: int) -> None:
        await self._stop_keepalive()
        lease_id, self._lease_id = self._lease_id, 0
        self._lost.set()
        if lease_id:
            await self._store._call("resign", lambda m, t: m.lease.revoke(
                lease_id, timeout=t, max_attempts=attempts), timeout=timeout)

    async def lost(self) -> None:
        if self._fence is None:
            return
        await self._lost.wait()

    async def _keep_alive(self, ttl: int) -> None:
        try:
            await _renew(self._store, self._lease_id, ttl, self._expiry, self._name)
        finally:
            self._lost.set()

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            await cancel_and_wait(task)


@dataclass
class _Expiry:
    """When a lease runs out as far as this side knows: never later than etcd's."""

    at: float = 0.0


async def _renew(store: EtcdKV, lease_id: int, ttl: int, expiry: _Expiry, name: str) -> None:
    """Renew the lease until it runs out without a confirmed renewal; then return.

    One attempt may take a third of the TTL, not all of it: a member that does not
    answer (partitioned, or dead with no reset sent) leaves time for the next attempt,
    which goes to the next member.
    """
    interval = max(ttl / 3, 0.2)
    while True:
        await asyncio.sleep(interval)
        while True:
            sent = time.monotonic()
            if sent >= expiry.at:
                _log.warning("lease of %s ran out without a renewal", name)
                return
            try:
                async with asyncio.timeout(min(expiry.at - sent, interval)):
                    remaining = await store._keep_alive_once(lease_id)
            except TimeoutError:
                _log.warning("lease keepalive for %s got no answer in %.1f s; "
                             "trying again", name, interval)
                continue
            except BackendError as exc:
                _log.warning("lease keepalive for %s failed: %s", name, exc)
                # soon, and on the next member
                left = expiry.at - time.monotonic()
                await asyncio.sleep(min(interval / 4, max(left, 0.0)))
                continue
            if remaining <= 0:
                _log.warning("lease of %s expired in etcd", name)
                return
            # Counted from when the renewal was sent, so this side always gives up no
            # later than etcd does.
            expiry.at = sent + remaining
            break


class EtcdLeaseSession:
    """One lease, renewed in the background, and keys created under it by a
    transaction that succeeds only if the key does not exist."""

    def __init__(self, store: EtcdKV, *, ttl: int) -> None:
        self._store = store
        self._ttl = ttl
        self._lease_id = 0
        self._expiry = _Expiry()
        self._lost = asyncio.Event()
        self._keepalive: asyncio.Task[None] | None = None

    async def open(self) -> None:
        asked_at = time.monotonic()
        granted = await self._store._call(
            "lease grant", lambda m, t: m.lease.grant(self._ttl, timeout=t))
        self._lease_id = int(granted.ID)
        self._expiry.at = asked_at + int(granted.TTL)
        self._lost = asyncio.Event()
        self._keepalive = asyncio.create_task(self._keep_alive(int(granted.TTL)),
                                              name=f"lease-keepalive-{self._lease_id:x}")

    @property
    def alive(self) -> bool:
        return (self._lease_id != 0 and not self._lost.is_set()
                and time.monotonic() < self._expiry.at)

    async def lost(self) -> None:
        if self._lease_id == 0:
            return
        await self._lost.wait()

    async def create(self, key: str, value: bytes) -> Fence | None:
        if not self.alive:
            raise NotLeader("the lease is gone: no key can be created under it")
        lease_id = self._lease_id
        txn = await self._store._call("create", lambda m, t: m.kv.txn(
            [KVService.txn_compare_create_revision(key, 0)],
            [KVService.txn_op_put(key, value, lease=lease_id)],
            [],
            timeout=t,
        ))
        if not txn.succeeded:
            return None
        return Fence(key=key, create_revision=int(txn.header.revision))

    async def close(self) -> None:
        await self._release(timeout=self._store._timeout, attempts=self._store._rpc_attempts)

    async def _release(self, *, timeout: float, attempts: int) -> None:
        ran_out = self._lost.is_set()  # before the renewals stop, which sets it
        task, self._keepalive = self._keepalive, None
        if task is not None:
            await cancel_and_wait(task)
        lease_id, self._lease_id = self._lease_id, 0
        self._lost.set()
        self._store._sessions.discard(self)
        if not lease_id or ran_out:
            return  # etcd has deleted its keys already
        try:
            await self._store._call("lease revoke", lambda m, t: m.lease.revoke(
                lease_id, timeout=t, max_attempts=attempts), timeout=timeout)
        except BackendError as exc:
            if "lease not found" not in str(exc):
                raise

    async def _keep_alive(self, ttl: int) -> None:
        try:
            await _renew(self._store, self._lease_id, ttl, self._expiry,
                         f"lease {self._lease_id:x}")
        except BaseException:
            self._lost.set()
            raise
        self._lost.set()
