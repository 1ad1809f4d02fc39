"""This replica's share of the experiments when controllers run sharded (decision 0057).

    open a lease → member key under it → follow <prefix>/controllers/ (informer)
    → assign (controller.shards, pure) → release what is no longer ours (fenced delete)
    → claim what is ours and free (create under the lease) → raise its fence in SQL

etcd does the coordination: a member key and every owner key live under the
replica's one lease, so a replica that dies loses all of them at once when the
lease runs out, and a shard has an owner only while the owner's key exists. A claim
raises the shard's fence in SQL before anything of the shard is judged, so a
decision of the former owner still in flight either commits first or not at all
(db/shards.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.controller.shards import ASSIGNMENT_VERSION, SHARDS_MAX, assign, moves, shard_of
from controlplane.experiments.store import ExperimentStore, ShardSelection
from controlplane.kernel.clock import Clock, utc_now
from controlplane.kernel.errors import BackendError, BackendUnavailable, NotLeader
from controlplane.kernel.informer import PrefixInformer
from controlplane.kernel.keys import CONTROLLER_IDENTITY, EtcdKeys
from controlplane.kernel.kv import Fence, KeyValueStore, LeaseSession

log = logging.getLogger(__name__)

MEMBER_VALUE_MAX = 256
ASSIGNMENT_VERSION_MAX = 1000
# a look at the assignment even when nothing was heard: a claim that failed is retried
RESYNC_SEC = 1.0


@dataclass(frozen=True)
class ShardFence:
    """A shard this replica holds and the fence of its writes."""

    shard: int
    fence: Fence

    @property
    def token(self) -> int:
        return self.fence.create_revision


@dataclass(frozen=True)
class Membership:
    """What a member key announces: how it numbers the shards and assigns them."""

    shards: int
    assignment: int = ASSIGNMENT_VERSION


def member_value(shards: int, assignment: int = ASSIGNMENT_VERSION) -> bytes:
    return json.dumps({"shards": shards, "assignment": assignment},
                      separators=(",", ":")).encode()  # fmt: skip


def parse_member(value: bytes) -> Membership | None:
    """What a member key announces; None for anything else (pure). A key without an
    assignment version is a replica of the release before versions: plain HRW, 1."""
    if len(value) > MEMBER_VALUE_MAX:
        return None
    try:
        document = json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(document, dict) or set(document) - {"assignment"} != {"shards"}:
        return None
    shards, assignment = document["shards"], document.get("assignment", 1)
    if type(shards) is not int or not 1 <= shards <= SHARDS_MAX:
        return None
    if type(assignment) is not int or not 1 <= assignment <= ASSIGNMENT_VERSION_MAX:
        return None
    return Membership(shards, assignment)


def parse_shard_key(key: str, prefix: str, shards: int) -> int | None:
    """The shard an owner key names; None for a key that names none (pure)."""
    text = key[len(prefix):]
    if not (key.startswith(prefix) and len(text) == 4 and text.isdigit()):
        return None
    shard = int(text)
    return shard if shard < shards else None


@dataclass
class OwnershipStats:
    members: int = 0  # live replicas that agree on the shards and their assignment
    held: int = 0
    claims: int = 0
    releases: int = 0
    lost_leases: int = 0
    refused_claims: int = 0  # claims whose SQL fence a newer owner held (a bug, or a restore)
    malformed_keys: int = 0  # keys under the controllers' prefix that said nothing valid
    # passes that found replicas announcing another shard count or assignment version
    disagreements: int = 0
    outages_ridden: int = 0  # passes that could not reach etcd or SQL, shards kept


@dataclass
class ControllersView:
    """What the informer says of <prefix>/controllers/: the members and shard holders."""

    keys: EtcdKeys
    shards: int
    stats: OwnershipStats
    members: dict[str, Membership] = field(default_factory=dict)  # identity → what it says
    holders: dict[int, str] = field(default_factory=dict)  # shard → its holder
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
        members = self.keys.controller_members_prefix
        if key.startswith(members):
            identity, membership = key[len(members):], parse_member(value)
            if membership is None or CONTROLLER_IDENTITY.fullmatch(identity) is None:
                self.stats.malformed_keys += 1
                return
            self.members[identity] = membership
        else:
            shard = parse_shard_key(key, self.keys.controller_shards_prefix, self.shards)
            holder = value.decode(errors="replace")
            if shard is None or CONTROLLER_IDENTITY.fullmatch(holder) is None:
                self.stats.malformed_keys += 1
                return
            self.holders[shard] = holder
        self.changed.set()

    def on_delete(self, key: str) -> None:
        members = self.keys.controller_members_prefix
        if key.startswith(members):
            self.members.pop(key[len(members):], None)
        else:
            shard = parse_shard_key(key, self.keys.controller_shards_prefix, self.shards)
            if shard is not None:
                self.holders.pop(shard, None)
        self.changed.set()


class ShardOwnership:
    """Holds this replica's membership and shards until cancelled; raises NotLeader
    when its lease is lost (every shard is then gone), BackendError when etcd fails."""

    def __init__(
        self,
        *,
        kv: KeyValueStore,
        keys: EtcdKeys,
        store: ExperimentStore,
        clock: Clock,
        identity: str,
        shards: int,
        ttl: int,
        stats: OwnershipStats | None = None,
        resync: float = RESYNC_SEC,
    ) -> None:
        keys.controller_member(identity)  # refuses an identity no key may carry
        self._kv = kv
        self._keys = keys
        self._store = store
        self._clock = clock
        self.identity = identity
        self.shards = shards
        self._ttl = ttl
        self._resync = resync
        self.stats = stats or OwnershipStats()
        self._view = ControllersView(keys, shards, self.stats)
        self._held: dict[int, Fence] = {}
        self._session: LeaseSession | None = None
        self._informer: PrefixInformer | None = None
        self._membership = Membership(shards)
        self._disagreement: frozenset[Membership] = frozenset()
        # set on every change of what this replica holds
        self.moved = asyncio.Event()

    @property
    def held(self) -> Mapping[int, Fence]:
        return self._held

    def fence_of(self, experiment_id: int) -> ShardFence | None:
        """The fence of the experiment's shard while this replica holds it; None: not
        ours to judge."""
        shard = shard_of(experiment_id, self.shards)
        fence = self._held.get(shard)
        if fence is None or self._session is None or not self._session.alive:
            return None
        return ShardFence(shard, fence)

    def selection(self) -> ShardSelection:
        """The shards held, for the database to list their experiments only."""
        alive = self._session is not None and self._session.alive
        return ShardSelection(self.shards, frozenset(self._held) if alive else frozenset())

    def drop(self, shard: int) -> None:
        """Forget a shard whose owner key is gone: nothing of it is judged here now."""
        if self._held.pop(shard, None) is not None:
            self._set_held()
        self._view.changed.set()

    async def run(self) -> None:
        session = self._kv.lease_session(ttl=self._ttl)
        await session.open()
        self._session = session
        informer = PrefixInformer(self._kv, self._keys.controllers_prefix, self._view,
                                  name="controller-shards")
        informer.start()
        self._informer = informer
        lost = asyncio.ensure_future(session.lost())
        try:
            await self._join(session, lost)
            while True:
                self._view.changed.clear()
                try:
                    await self._follow(session)
                except BackendUnavailable as exc:
                    # ridden out on the lease, as the elected leader does: the shards
                    # held stay held (and fenced) until the lease itself runs out
                    self.stats.outages_ridden += 1
                    log.warning("controller %s keeps its shards through: %s",
                                self.identity, exc)
                changed = asyncio.ensure_future(self._view.changed.wait())
                try:
                    await asyncio.wait({changed, lost}, timeout=self._resync,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if lost.done():
                    self.stats.lost_leases += 1
                    raise NotLeader(f"controller {self.identity} lost its lease and shards")
        finally:
            self._held.clear()
            self._set_held()
            self._session = None
            self._informer = None
            lost.cancel()
            await informer.stop()
            with contextlib.suppress(Exception):
                await asyncio.shield(session.close())

    async def _join(self, session: LeaseSession, lost: asyncio.Future[None]) -> None:
        """Create the member key; one left by a former process of the same identity
        (a restart) goes with that process's lease, within its TTL."""
        key = self._keys.controller_member(self.identity)
        value = member_value(self._membership.shards, self._membership.assignment)
        while await session.create(key, value) is None:
            log.warning("controller %s: a member of that name still holds %s; waiting "
                        "for its lease to run out", self.identity, key)
            await asyncio.wait({lost}, timeout=self._resync)
            if lost.done():
                raise NotLeader(f"controller {self.identity} lost its lease while joining")

    async def _follow(self, session: LeaseSession) -> None:
        view = self._view
        agreeing = [m for m, said in view.members.items() if said == self._membership]
        self.stats.members = len(agreeing)
        if len(agreeing) != len(view.members):
            # two numberings of the shards, or two rules assigning them, would each
            # claim shards the other thinks its own: judge nothing until all agree
            # (replicas of a release before assignment versions read a versioned key
            # as malformed and go on judging among themselves until they stop)
            self.stats.disagreements += 1
            said = frozenset(view.members.values())
            if said != self._disagreement:  # logged once, not every pass
                log.error("controllers disagree on the shards (%s); this replica (%s) "
                          "releases every shard until they agree",
                          sorted(f"{m.shards} shards, assignment {m.assignment}" for m in said),
                          f"{self.shards} shards, assignment {self._membership.assignment}")
            self._disagreement = said
            agreeing = []
        else:
            self._disagreement = frozenset()
        self._forget_vanished()
        await self._clear_orphans()
        plan = moves(me=self.identity, assignment=assign(self.shards, agreeing),
                     held=self._held, taken=view.holders)
        for shard in sorted(plan.release):
            await self._release(shard)
        if plan.claim:
            await self._claim(session, sorted(plan.claim))

    def _forget_vanished(self) -> None:
        """Shards whose owner key the watch has seen go (or pass to another), though
        this replica's lease holds: nothing of them is judged here any more."""
        seen = self._informer.revision if self._informer is not None else 0
        for shard, fence in list(self._held.items()):
            if seen >= fence.create_revision and self._view.holders.get(shard) != self.identity:
                log.warning("controller %s: the key of shard %d is gone", self.identity, shard)
                self.drop(shard)

    async def _clear_orphans(self) -> None:
        """Delete owner keys of this replica's name that it does not hold: a release
        that did not reach etcd, or a claim let go, would otherwise keep their shards
        from anyone until this lease ends. An owner key is created once and never
        rewritten, so its mod revision is its create revision: the delete is fenced."""
        known = self._informer.known if self._informer is not None else {}
        for shard, holder in sorted(self._view.holders.items()):
            if holder != self.identity or shard in self._held:
                continue
            key = self._keys.controller_shard(shard)
            stored = known.get(key)
            if stored is None:
                continue
            with contextlib.suppress(NotLeader):  # gone, or someone else's by now
                await self._kv.delete(key, fence=Fence(key, stored.mod_revision))

    async def _release(self, shard: int) -> None:
        fence = self._held.pop(shard)
        self._set_held()
        self.stats.releases += 1
        with contextlib.suppress(NotLeader):  # gone already
            await self._kv.delete(fence.key, fence=fence)
        log.info("controller %s released shard %d", self.identity, shard)

    async def _claim(self, session: LeaseSession, shards: list[int]) -> None:
        """Create the shards' owner keys together, then raise their fences in SQL in
        one transaction: a dead replica's shards are taken over in two round trips,
        not two per shard."""
        created = await asyncio.gather(*(
            session.create(self._keys.controller_shard(s), self.identity.encode())
            for s in shards
        ))
        # a shard someone holds still is left: the watch says when it lets go
        claimed = {s: f for s, f in zip(shards, created, strict=True) if f is not None}
        if not claimed:
            return
        try:
            await self._fence_in_sql(claimed)
        except NotLeader:
            # one shard fenced by a newer owner must not cost the others: one by one
            for shard, fence in claimed.items():
                await self._fence_in_sql({shard: fence}, alone=True)
            return
        except BackendError as exc:
            await self._let_go(claimed, exc)
            return
        self._hold(claimed)

    async def _fence_in_sql(self, claimed: dict[int, Fence], *, alone: bool = False) -> None:
        at = utc_now(self._clock)
        try:
            async with self._store.transaction() as tx:
                for shard, fence in sorted(claimed.items()):
                    await tx.hold_shard(shard=shard, fence=fence.create_revision,
                                        owner=self.identity, now=at)
        except (NotLeader, BackendError) as exc:
            if not alone:
                raise
            if isinstance(exc, NotLeader):
                self.stats.refused_claims += 1
            await self._let_go(claimed, exc)
            return
        if alone:
            self._hold(claimed)

    async def _let_go(self, claimed: dict[int, Fence], exc: Exception) -> None:
        log.warning("controller %s could not fence shards %s in SQL (%s); letting them go",
                    self.identity, sorted(claimed), exc)
        for fence in claimed.values():
            with contextlib.suppress(BackendError):
                await self._kv.delete(fence.key, fence=fence)

    def _hold(self, claimed: dict[int, Fence]) -> None:
        self._held.update(claimed)
        self.stats.claims += len(claimed)
        self._set_held()

    def _set_held(self) -> None:
        self.stats.held = len(self._held)
        self.moved.set()
