"""Which controller replica judges which experiment (pure; decisions 0057, 0063).

Experiments fall into a fixed number of virtual shards by their id modulo the count:
ids are assigned one after another, so the shards fill evenly, and the database can
select a shard's experiments itself. Each shard goes to the live replica that scores
highest for it (rendezvous, or highest-random-weight, hashing) among those not yet
full: shards in their numbered order, each replica holding at most ⌈shards /
replicas⌉ (consistent hashing with bounded loads). So every replica computes the same
owners from the same member list with no coordination, no replica holds more than
its even share rounded up, and a join or a leave moves the shards plain HRW would
move plus a few that the bound forces (measured in decision 0063).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache

SHARDS_MAX = 4096
# the default in sharded mode: with HRW, shards per replica spread as a binomial, so
# 256 keeps four replicas within about ±11 % (one standard deviation) of an even share
DEFAULT_SHARDS = 256
# what every member key announces beside the shard count: replicas computing owners
# by different rules would each claim shards the other thinks its own, so they judge
# nothing until every member says the same (1: plain HRW, decision 0057; 2: bounded)
ASSIGNMENT_VERSION = 2


def _hash64(text: str) -> int:
    # blake2b rather than hash(): the same on every replica, every run, every release
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def check_shard_count(shards: int) -> int:
    if not 1 <= shards <= SHARDS_MAX:
        raise ValueError(f"the shard count must be within 1..{SHARDS_MAX}, not {shards}")
    return shards


def shard_of(experiment_id: int, shards: int) -> int:
    """The shard an experiment belongs to, for ever (its id never changes); the same
    as the database's `id % shards` (ids are positive)."""
    return experiment_id % check_shard_count(shards)


def score(member: str, shard: int) -> int:
    """The member's weight for the shard; the highest weight owns it."""
    return _hash64(f"{member}\x00{shard}")


def owner_of(shard: int, members: Collection[str]) -> str | None:
    """The member that prefers the shard most, with no bound on loads (plain HRW;
    None without members); ties, which need equal 64-bit hashes, go to the greater
    name so every replica still agrees."""
    if not members:
        return None
    return max(members, key=lambda member: (score(member, shard), member))


def capacity(shards: int, members: int) -> int:
    """The most shards one of `members` replicas holds: the even share rounded up."""
    return -(-shards // members)


def assign(shards: int, members: Collection[str]) -> dict[int, str]:
    """Every shard's owner among `members` ({} without members): in the shards'
    order, the highest-scoring member that holds fewer than `capacity` shards."""
    check_shard_count(shards)
    if not members:
        return {}
    owners = _bounded(shards, tuple(sorted(set(members))))
    return dict(enumerate(owners))


@lru_cache(maxsize=64)
def _bounded(shards: int, members: tuple[str, ...]) -> tuple[str, ...]:
    # cached: every replica recomputes it on each pass, from a member list that
    # rarely changes, and it costs one hash per shard and member
    room = dict.fromkeys(members, capacity(shards, len(members)))
    owners: list[str] = []
    for shard in range(shards):
        owner = max((m for m in members if room[m]), key=lambda m: (score(m, shard), m))
        room[owner] -= 1
        owners.append(owner)
    return tuple(owners)


@dataclass(frozen=True)
class ShardMoves:
    """What one replica does to follow an assignment: shards to give up, then to take."""

    release: frozenset[int]
    claim: frozenset[int]

    @property
    def empty(self) -> bool:
        return not (self.release or self.claim)


def moves(
    *,
    me: str,
    assignment: Mapping[int, str],
    held: Collection[int],
    taken: Collection[int],
) -> ShardMoves:
    """The replica `me` holds `held`; `taken` are the shards some replica holds (its
    own included). It releases what is no longer its own, and claims what is its own
    and free: a shard still held by its former owner is claimed only once that owner
    has let go, so no shard ever has two owners."""
    held_set = frozenset(held)
    mine = frozenset(shard for shard, owner in assignment.items() if owner == me)
    busy = frozenset(taken) | held_set
    return ShardMoves(release=held_set - mine, claim=mine - busy)
