"""How nginx's `split_clients` assigns a key, reproduced so its split can be predicted.

nginx hashes the evaluated key (here `"<salt>:<unit>"`, the raw bytes of the unit as
the client sent them) with MurmurHash2, seed 0, as `ngx_murmur_hash2` in
src/core/ngx_murmurhash.c does:

    h = len (32 bits)
    for each whole 4-byte block k (little-endian):
        k *= M; k ^= k >> 24; k *= M; h *= M; h ^= k          (M = 0x5bd1e995)
    the 1-3 trailing bytes: h ^= b2 << 16; h ^= b1 << 8; h ^= b0; h *= M
    h ^= h >> 13; h *= M; h ^= h >> 15                        (all modulo 2**32)

At configuration time each part with a percentage p (in hundredths of a percent,
i.e. basis points) moves a cumulative threshold `last += p * 0xffffffff // 10000`
and keeps it; a `*` part keeps 0. A request takes the first part whose threshold is
above its hash, or a `*` part. Thresholds are cumulative sums of per-part floors, so
a part at a fixed position with a growing weight only ever gains hashes: the first
parts grow monotonically, as the sidecar's bucket layout does (sidecar/assignment.py).
A hash of 0xffffffff falls past an explicit 100 %, which is why the renderer writes
the last part as `*`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_M = 0x5BD1E995
_U32 = 0xFFFF_FFFF
TOTAL_BP = 10_000


def murmur_hash2(data: bytes) -> int:
    """nginx's `ngx_murmur_hash2`: MurmurHash2, seed 0, 32 bits."""
    length = len(data)
    h = length & _U32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _U32
        k ^= k >> 24
        k = (k * _M) & _U32
        h = (h * _M) & _U32
        h ^= k
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _U32
    h ^= h >> 13
    h = (h * _M) & _U32
    h ^= h >> 15
    return h


@dataclass(frozen=True, slots=True)
class SplitParts:
    """A `split_clients` block: `(value, basis points)` in order, the last as `*`.

    `thresholds[i]` is the exclusive upper hash of `names[i]`; None for the `*` part.
    """

    names: tuple[str, ...]
    thresholds: tuple[int | None, ...]

    @classmethod
    def from_parts(cls, parts: Sequence[tuple[str, int]]) -> SplitParts:
        """Parts as the renderer writes them: positive weights, the last one `*`."""
        if not parts:
            raise ValueError("a split needs at least one part")
        if any(bp <= 0 for _, bp in parts):
            raise ValueError("split parts need positive weights")
        if sum(bp for _, bp in parts) != TOTAL_BP:
            raise ValueError(f"split parts must sum to {TOTAL_BP} basis points")
        last = 0
        thresholds: list[int | None] = []
        for _, bp in parts[:-1]:
            last += bp * _U32 // TOTAL_BP
            thresholds.append(last)
        thresholds.append(None)
        return cls(tuple(name for name, _ in parts), tuple(thresholds))

    def value_for_hash(self, hashed: int) -> str:
        for name, threshold in zip(self.names, self.thresholds, strict=True):
            if threshold is None or hashed < threshold:
                return name
        raise AssertionError("the last part is `*`")  # pragma: no cover

    def value_for(self, key: bytes) -> str:
        return self.value_for_hash(murmur_hash2(key))


def split_key(salt: str, unit: str) -> bytes:
    """The bytes nginx hashes for a unit: the unit is the header text as the sidecar
    and the log parser decode it (latin-1), so its bytes are the ones on the wire."""
    return f"{salt}:".encode() + unit.encode("latin-1")


__all__ = ["SplitParts", "murmur_hash2", "split_key"]
