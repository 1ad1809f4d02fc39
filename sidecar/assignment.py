"""Variant assignment (architecture §9): a stable hash of the unit into 10,000 buckets.

    digest    = blake2b((salt + ":" + unit).encode("utf-8"), digest_size=8)
    bucket    = int.from_bytes(digest, "big") % 10000
    unit_hash = int.from_bytes(digest[:4], "big")  (0 is reserved for "no unit": → 1)

blake2b rather than sha256: both are stable across processes and machines and well
mixed; blake2b with an 8-byte digest is the cheaper of the two per request. Python's
`hash()` is salted per process and would split a unit across sidecars, so it is
never used. The published vectors live in docs/assignment.md and in the tests.

Buckets are laid out per route so that the ramp is monotonic: every variant except
the baseline takes a contiguous range from bucket 0 upwards, in the route's order,
and the baseline takes the rest. With the usual two-way route the canary is exactly
`bucket < canary weight`, so a unit in the canary at weight w stays in it at every
weight ≥ w.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

BUCKETS = 10_000
_U32 = 0xFFFF_FFFF


def unit_digest(salt: str, unit: str) -> bytes:
    return hashlib.blake2b(f"{salt}:{unit}".encode(), digest_size=8).digest()


def bucket(salt: str, unit: str) -> int:
    """The unit's bucket in 0..9999; the same on every sidecar for a given salt."""
    return int.from_bytes(unit_digest(salt, unit), "big") % BUCKETS


def unit_hash(salt: str, unit: str) -> int:
    """A 32-bit id of the unit for the samples (never 0, which means "no unit")."""
    return int.from_bytes(unit_digest(salt, unit)[:4], "big") or 1


def bucket_and_hash(salt: str, unit: str) -> tuple[int, int]:
    """Both values from one digest: the per-request path hashes once."""
    digest = unit_digest(salt, unit)
    return int.from_bytes(digest, "big") % BUCKETS, (int.from_bytes(digest[:4], "big") or 1)


@dataclass(frozen=True, slots=True)
class BucketLayout:
    """Bucket ranges per variant: `variant_at(b)` is the variant owning bucket b.

    `bounds[i]` is the exclusive upper bucket of `names[i]`; zero-weight variants own
    no range (they are reachable only through a forced variant).
    """

    names: tuple[str, ...]
    bounds: tuple[int, ...]

    @classmethod
    def from_weights(
        cls, weights: Sequence[tuple[str, int]], *, baseline: str = "baseline"
    ) -> BucketLayout:
        if sum(w for _, w in weights) != BUCKETS:
            raise ValueError(f"weights must sum to {BUCKETS}")
        # The baseline (by name, else the first variant) goes last so that every
        # other variant's range starts at a fixed bucket and grows with its weight.
        base_index = next((i for i, (n, _) in enumerate(weights) if n == baseline), 0)
        ordered = [w for i, w in enumerate(weights) if i != base_index]
        ordered.append(weights[base_index])
        names: list[str] = []
        bounds: list[int] = []
        upper = 0
        for name, weight in ordered:
            if weight <= 0:
                continue
            upper += weight
            names.append(name)
            bounds.append(upper)
        return cls(tuple(names), tuple(bounds))

    def variant_at(self, bucket_: int) -> str:
        return self.names[bisect_right(self.bounds, bucket_)]


def buckets_of(layout: BucketLayout, variant: str) -> int:
    """Buckets owned by a variant, for checks and docs."""
    lower = 0
    for name, upper in zip(layout.names, layout.bounds, strict=True):
        if name == variant:
            return upper - lower
        lower = upper
    return 0


__all__ = [
    "BUCKETS",
    "BucketLayout",
    "bucket",
    "bucket_and_hash",
    "buckets_of",
        "unit_digest",
    "unit_hash",
]
